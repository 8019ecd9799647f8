"""`harness budget` as a user runs it: offline, readable, and one clear line on bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HARNESS = str(Path(sys.executable).parent / "harness")
SNAPSHOT = Path(__file__).parents[2] / "harness/snapshots/Qwen/Qwen3-4B/1cfa9a7208912126459214e8b04321603b3df60c"
# state-spaces/mamba-130m-hf config.json (the fields that matter: no attention heads at all)
MAMBA_130M = {"architectures": ["MambaForCausalLM"], "model_type": "mamba", "hidden_size": 768,
              "num_hidden_layers": 24, "state_size": 16, "conv_kernel": 4, "expand": 2, "vocab_size": 50280}
OFFLINE = {**os.environ, "HF_HUB_OFFLINE": "1", "COLUMNS": "120"}


def harness(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([HARNESS, *args], capture_output=True, text=True, env=OFFLINE, timeout=120)


def test_pinned_model_works_offline_and_states_its_caveat() -> None:
    result = harness("budget", "--model", "Qwen/Qwen3-4B", "--tokens", "4096", "--sequences", "8")
    assert result.returncode == 0, result.stderr
    out = " ".join(result.stdout.split())
    assert "147,456 B (144 KiB)" in out
    assert "4,831,838,208 B (4.5 GiB)" in out
    assert "8,044,936,192 B (7.49 GiB)" in out
    assert "12,876,774,400 B (11.99 GiB)" in out
    assert "not evidence that the workload fits" in out
    assert "head_dim 128 from the config" in out


def test_json_is_versioned_and_carries_the_capacity() -> None:
    result = harness("budget", "--tokens", "4096", "--sequences", "8", "--available-kv-gib", "100", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["schema_version"] == 1
    assert data["capacity"]["num_blocks"] == 45_511
    assert data["capacity"]["kv_cache_tokens"] == 728_176
    assert round(data["capacity"]["max_concurrency"], 2) == 17.78


def write(path: Path, text: str | bytes) -> Path:
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


@pytest.mark.parametrize(
    ("case", "args", "named"),
    [
        ("missing field", ["--model", "{dir}/missing.json", "--tokens", "10"], "field 'num_hidden_layers'"),
        ("not JSON", ["--model", "{dir}/binary.json", "--tokens", "10"], "binary.json: not a JSON file"),
        ("zero tokens", ["--tokens", "0"], "--tokens: Input should be greater than or equal to 1, not 0"),
        ("negative tokens", ["--tokens", "-5"], "--tokens: Input should be greater than or equal to 1, not -5"),
        ("zero sequences", ["--tokens", "5", "--sequences", "0"], "--sequences: Input should be greater"),
        ("unknown dtype", ["--tokens", "5", "--kv-cache-dtype", "int3"], "unknown kv cache dtype 'int3'"),
        ("unknown model", ["--model", "nobody/no-such-model", "--tokens", "5"], "'nobody/no-such-model'"),
        ("nan KV memory", ["--tokens", "4096", "--available-kv-gib", "nan"], "--available-kv-gib: must be a finite"),
        ("inf KV memory", ["--tokens", "4096", "--available-kv-gib", "inf"], "--available-kv-gib: must be a finite"),
        ("negative GPU", ["--tokens", "4096", "--gpu-memory-gib", "-80"], "--gpu-memory-gib: Input should be greater"),
        ("nan GPU", ["--tokens", "4096", "--gpu-memory-gib", "nan"], "--gpu-memory-gib: must be a finite"),
        ("ancient engine", ["--tokens", "4096", "--engine-version", "0.1.0"], "engine version 0.1.0: the calculator"),
        ("relabelled Qwen3", ["--model", "{dir}/relabelled.json", "--tokens", "10"],
         "architecture MambaForCausalLM is refused: a pure state-space model"),
        ("real Mamba", ["--model", "{dir}/mamba.json", "--tokens", "10"],
         "architecture MambaForCausalLM is refused: a pure state-space model"),
        ("chunked attention", ["--model", "{dir}/llama4.json", "--tokens", "10"],
         "architecture Llama4ForConditionalGeneration is refused: three in four of its layers attend within chunks"),
        ("unknown family", ["--model", "{dir}/unknown.json", "--tokens", "10"],
         "unsupported architecture NoSuchForCausalLM"),
    ],
)
def test_bad_input_is_one_line_exit_2(tmp_path, case, args, named) -> None:
    write(tmp_path / "missing.json", json.dumps({"num_attention_heads": 4, "hidden_size": 64}))
    write(tmp_path / "binary.json", bytes(range(256)))
    qwen3 = json.loads((SNAPSHOT / "config.json").read_text())
    write(tmp_path / "relabelled.json", json.dumps({**qwen3, "architectures": ["MambaForCausalLM"]}))
    write(tmp_path / "mamba.json", json.dumps(MAMBA_130M))
    write(tmp_path / "llama4.json", json.dumps({**qwen3, "architectures": ["Llama4ForConditionalGeneration"]}))
    write(tmp_path / "unknown.json", json.dumps({**qwen3, "architectures": ["NoSuchForCausalLM"]}))
    result = harness("budget", *[arg.format(dir=tmp_path) for arg in args])
    assert result.returncode == 2, case
    assert named in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("case", "args", "warned"),
    [
        # 100,000 > Qwen3-4B's max_position_embeddings 40,960
        ("length above positions", ["--max-model-len", "100000"], "above the model's max_position_embeddings 40,960"),
        # weights 8,044,936,192 B = 7.49 GiB > 8 GiB × 0.9 = 7.20 GiB
        ("weights above the GPU", ["--gpu-memory-gib", "8"], "the weights (7.49 GiB per GPU)"),
        ("newer engine", ["--engine-version", "0.40.0"], "engine version 0.40.0 is newer"),
    ],
)
def test_suspect_input_is_warned_by_name(case, args, warned) -> None:
    result = harness("budget", "--tokens", "4096", *args)
    assert result.returncode == 0, result.stderr
    assert result.stderr.startswith("warning: ")
    assert warned in " ".join(result.stderr.split()), case
    assert "Traceback" not in result.stderr


def test_gpu_waterfall_says_it_fits_with_each_terms_source() -> None:
    result = harness("budget", "--gpu", "H100-80GB", "--tokens", "4096", "--max-num-batched-tokens", "8192")
    assert result.returncode == 0, result.stderr
    out = " ".join(result.stdout.split())
    for step in ("total", "gpu_memory_utilization 0.9", "weights", "activation_peak", "non_torch", "cuda_graphs",
                 "= KV memory"):
        assert step in out
    assert "pull/10511" in out  # the GPU's total names where it was logged
    assert "model.safetensors.index.json" in out  # the checkpoint's own size, not an estimate
    # 79.22 GiB × 0.9 = 71.30 GiB, less 7.49 GiB of weights, 0.30 GiB of non-torch memory and the sampler's
    # sort over 1,024 rows × 151,936 logits (about 5.1 GiB): over 58 GiB of KV at 144 KiB per token is over
    # 420,000 tokens, about 100 sequences of 4,096 tokens.
    assert "fits:" in out and "sequences of 4,096 tokens at once" in out


@pytest.mark.parametrize(
    ("gpu", "words"),
    [
        # 8 GiB × 0.9 = 7.2 GiB is less than the 7.49 GiB of weights alone.
        ("8", "does not fit: nothing is left for the KV cache"),
        # 12 GiB × 0.9 = 10.8 GiB − 7.49 weights − about 1.6 GiB of sampler and non-torch memory ≈ 1.7 GiB
        # ≈ 12,500 tokens of 147,456 B: less than one 40,960-token request (the model's default length).
        ("12", "less than one request of max_model_len 40,960"),
    ],
)
def test_gpu_waterfall_says_when_it_does_not_fit(gpu, words) -> None:
    result = harness("budget", "--gpu", gpu)
    assert result.returncode == 0, result.stderr
    assert words in " ".join(result.stdout.split())


def test_unknown_gpu_is_named_in_one_line() -> None:
    result = harness("budget", "--gpu", "B300-9000GB")
    assert result.returncode == 2
    assert "GPU 'B300-9000GB' has no sourced memory figure" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_unknown_quantization_is_named_in_one_line() -> None:
    result = harness("budget", "--gpu", "H100-80GB", "--quantization", "int3-magic")
    assert result.returncode == 2
    assert "quantization 'int3-magic' is not priced here" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
