"""`harness budget` as a user runs it: offline, readable, and one clear line on bad input."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from harness.predict.memory_model import FITTED_CONSTANTS

HARNESS = str(Path(sys.executable).parent / "harness")
CONFIGS = Path(__file__).parents[1] / "fixtures" / "field" / "configs"
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
        ("JSON past the parser's depth", ["--model", "{dir}/deep.json", "--tokens", "10"],
         "deep.json: not a config.json: nested too deep"),
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
        ("draft model", ["--tokens", "10", "--speculative-method", "draft_model", "--num-speculative-tokens", "3"],
         "--speculative-method 'draft_model': its drafter's cache is not sized here"),
        ("speculative tokens", ["--tokens", "10", "--speculative-method", "mtp", "--num-speculative-tokens", "65"],
         "--num-speculative-tokens: 65, not 1 to 64"),
        ("NVFP4 without its skip list", ["--gpu", "H100-80GB", "--quantization", "modelopt_fp4"],
         "quantization 'modelopt_fp4': which layers stay 16-bit is the checkpoint's own list"),
        ("lengths with a gap", ["--lengths", "600,,900"], "--lengths: must be comma-separated positive integers"),
        ("empty lengths", ["--lengths", ",,,"], "--lengths: must be comma-separated positive integers, not ',,,'"),
        ("negative length", ["--lengths", "600,-1"], "--lengths: must be comma-separated positive integers"),
        ("lengths under --gpu", ["--gpu", "H100-80GB", "--lengths", "1,x"], "--lengths: must be comma-separated"),
        ("tokens and lengths", ["--tokens", "4096", "--lengths", "600,900"], "give --tokens or --lengths, not both"),
        # a prefix of 5,000 tokens cannot be shared by a sequence of 4,096
        ("prefix past the sequence", ["--tokens", "4096", "--shared-prefix-tokens", "5000"],
         "--shared-prefix-tokens 5,000 is longer than the shortest sequence (4,096 tokens)"),
        ("prefix past the shortest", ["--lengths", "100,3000", "--shared-prefix-tokens", "500"],
         "--shared-prefix-tokens 500 is longer than the shortest sequence (100 tokens)"),
        # Qwen3-4B has 32 attention heads: TP 64 is a multiple of its 8 KV heads but divides no head count
        ("TP past the heads", ["--tokens", "4096", "--tensor-parallel-size", "64"],
         "tensor_parallel_size 64 does not divide the model's 32 attention heads"),
        ("TP past the heads, before launch", ["--gpu", "H100-80GB", "--tensor-parallel-size", "64"],
         "tensor_parallel_size 64 does not divide the model's 32 attention heads"),
        ("DCP not dividing TP", ["--tokens", "10", "--tensor-parallel-size", "8", "--decode-context-parallel-size",
                                 "3"], "--decode-context-parallel-size 3 must divide --tensor-parallel-size 8"),
        ("a population under --gpu", ["--gpu", "H100-80GB", "--tokens", "4096", "--sequences", "3"],
         "--sequences: not read with --gpu"),
        ("a KV figure under --gpu", ["--gpu", "H100-80GB", "--available-kv-gib", "20", "--overhead-gib", "1"],
         "--available-kv-gib, --overhead-gib: not read with --gpu"),
        ("a device for a config", ["--model", "/dev/zero", "--gpu", "H100-80GB"], "/dev/zero: a device, not a JSON"),
        ("grouped digits for a GPU", ["--gpu", "1_000"], "--gpu must be a GPU name or a number of GiB from 0 to"),
        ("a batch below its sequences", ["--gpu", "H100-80GB", "--max-num-batched-tokens", "8",
                                         "--max-num-seqs", "16"],
         "--max-num-batched-tokens 8 must be at least --max-num-seqs 16: vLLM refuses a batch smaller than its"),
        ("unknown sampler", ["--gpu", "H100-80GB", "--sampler", "triton"],
         "--sampler: Input should be 'flashinfer' or 'pytorch', not 'triton'"),
        ("V0 after its removal", ["--gpu", "H100-80GB", "--engine", "V0"],
         "--engine V0: vLLM 0.11.2 has no V0 engine (removed in 0.11)"),
        ("V1 before it shipped", ["--tokens", "10", "--engine", "V1", "--engine-version", "0.6.5"],
         "--engine V1: vLLM 0.6.5 has no V1 engine"),
        ("an unknown engine", ["--tokens", "10", "--engine", "V2"], "--engine: Input should be 'V0' or 'V1'"),
        ("a modality not priced", ["--gpu", "H100-80GB", "--limit-mm-per-prompt", '{{"image": 1, "audio": 0}}'],
         "--limit-mm-per-prompt: 'audio' is not priced here (image, video)"),
        ("a fraction of an image", ["--gpu", "H100-80GB", "--limit-mm-per-prompt", "image=1.5"],
         "--limit-mm-per-prompt: must be 'image=N,video=N' or a JSON object"),
        ("items as a flag", ["--gpu", "H100-80GB", "--limit-mm-per-prompt", '{{"video": true}}'],
         "--limit-mm-per-prompt: video must be a whole number of items from 0 to 10,000"),
        ("broken JSON items", ["--gpu", "H100-80GB", "--limit-mm-per-prompt", '{{"image": 1'],
         "--limit-mm-per-prompt: must be a JSON object"),
        ("a modality twice", ["--gpu", "H100-80GB", "--limit-mm-per-prompt", '{{"image": 0, "image": 5}}'],
         "--limit-mm-per-prompt: names a modality twice"),
        ("items as a list", ["--gpu", "H100-80GB", "--limit-mm-per-prompt", '{{"image": [1, 2]}}'],
         "--limit-mm-per-prompt: image must be a whole number of items"),
    ],
)
def test_bad_input_is_one_line_exit_2(tmp_path, case, args, named) -> None:
    write(tmp_path / "missing.json", json.dumps({"num_attention_heads": 4, "hidden_size": 64}))
    write(tmp_path / "binary.json", bytes(range(256)))
    write(tmp_path / "deep.json", "[" * 100_000)
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
        ("sampler without --gpu", ["--sampler", "flashinfer"], "--sampler: read only with --gpu"),
        ("eager without --gpu", ["--enforce-eager"], "--enforce-eager: read only with --gpu"),
        ("items without --gpu", ["--limit-mm-per-prompt", "image=0"], "--limit-mm-per-prompt: read only with --gpu"),
    ],
)
def test_suspect_input_is_warned_by_name(case, args, warned) -> None:
    result = harness("budget", "--tokens", "4096", *args)
    assert result.returncode == 0, result.stderr
    assert result.stderr.startswith("warning: ")
    assert warned in " ".join(result.stderr.split()), case
    assert "Traceback" not in result.stderr


def test_a_v0_vision_launch_is_priced_as_the_field_check_prices_its_log() -> None:
    # vllm#16570: Qwen2.5-VL-72B over four A100-40GBs under 0.8.3 with VLLM_USE_V1=0, two sequences, 4,096 tokens,
    # one image and no video a prompt. The field check prices that start at 3,920 KV tokens from the case's facts;
    # the command line, given the same launch, must come to the same figure by its own path.
    args = ["--model", str(CONFIGS / "Qwen--Qwen2.5-VL-72B-Instruct.json"), "--gpu", "A100-40GB",
            "--tensor-parallel-size", "4", "--gpu-memory-utilization", "0.95", "--max-num-seqs", "2",
            "--max-model-len", "4096", "--engine-version", "0.8.3", "--engine", "V0"]
    answers = {}
    for limits in ('{"image": 1, "video": 0}', "image=1,video=0", '{"image": {"count": 1}, "video": 0}', None):
        result = harness("budget", *args, *([] if limits is None else ["--limit-mm-per-prompt", limits]), "--json")
        assert result.returncode == 0, result.stderr
        answers[limits] = json.loads(result.stdout)
    stated = answers['{"image": 1, "video": 0}']
    assert stated["capacity"]["kv_cache_tokens"] == 3920
    # 245 blocks of 1,310,720 B, 11 short of one 4,096-token request (256 blocks): "does not fit", as the start
    # did not. Its log states 2.51 GiB of activation, priced at 2.50 (the decoder's 16,384 tokens beside the pixels).
    margin = stated["cache_margin"]
    assert margin["margin_bytes"] == -11 * 1_310_720 and not margin["at_risk"]
    assert margin["band_bytes"] == int(FITTED_CONSTANTS.kv_error_share * stated["waterfall"]["usable_bytes"])
    assert not stated["fits"] and stated["verdict"] == "does not fit"
    activation = next(term for term in stated["waterfall"]["terms"] if term["name"] == "activation_peak")
    assert round(activation["bytes"] / 2**30, 2) == 2.50
    assert "V0 engine accounting of vLLM 0.8.3" in stated["waterfall"]["assumptions"]
    assert answers["image=1,video=0"] == answers['{"image": {"count": 1}, "video": 0}'] == stated
    # V0's default of one video a prompt as well: its frames join the dummy prompt and leave nothing for the cache
    assert answers[None]["waterfall"]["kv_bytes"] < 0 < stated["waterfall"]["kv_bytes"]


def test_eager_mode_before_launch_reserves_no_cuda_graphs() -> None:
    # Qwen3-4B on an L4 under 0.30.0, which reserves its graph estimate before the cache: eager, the row says none
    graphs = {}
    for flags in ([], ["--enforce-eager"]):
        result = harness("budget", "--gpu", "L4", "--engine-version", "0.30.0", "--max-model-len", "4096", *flags)
        assert result.returncode == 0, result.stderr
        graphs[bool(flags)] = next(line for line in result.stdout.splitlines() if "cuda_graphs" in line)
    assert "none: --enforce-eager" in graphs[True] and "0.00" in graphs[True]
    assert "0.54" in graphs[False] and "reserved before the cache" in graphs[False]


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


def test_a_drafter_and_prefix_caching_are_priced_as_the_options_say() -> None:
    # Qwen3-4B with an EAGLE-3 head: 37 layers of K and V × 8 heads × 128 × 2 B = 151,552 B a token (147,456
    # without it), 2,424,832 B a block of 16; 100 GiB = 107,374,182,400 B // 2,424,832 = 44,281 blocks (45,511
    # without the head), 44,281 × 16 = 708,496 tokens.
    result = harness("budget", "--tokens", "4096", "--available-kv-gib", "100", "--speculative-method", "eagle3",
                     "--num-speculative-tokens", "2", "--json")
    assert result.returncode == 0, result.stderr
    capacity = json.loads(result.stdout)["capacity"]
    assert (capacity["bytes_per_block"], capacity["num_blocks"], capacity["kv_cache_tokens"]) == (
        2_424_832, 44_281, 708_496)
    # Qwen3.6-35B-A3B at 8,192 tokens (test_speculative.py works its 1,056-token blocks out): 8 attention blocks
    # and one state block in each of 3 state groups, 11; prefix caching keeps 2 state blocks (14), and one MTP
    # speculative token one more (17).
    model = str(Path(__file__).parents[1] / "fixtures/field/configs/Qwen--Qwen3.6-35B-A3B.json")
    common = ["budget", "--model", model, "--tokens", "4096", "--available-kv-gib", "10", "--max-model-len", "8192",
              "--json"]
    per_request = []
    for extra in ([], ["--enable-prefix-caching"],
                  ["--enable-prefix-caching", "--speculative-method", "mtp", "--num-speculative-tokens", "1"]):
        result = harness(*common, *extra)
        assert result.returncode == 0, result.stderr
        per_request.append(json.loads(result.stdout)["capacity"]["blocks_per_request"])
    assert per_request == [11, 14, 17]


def test_the_before_launch_answer_prices_the_drafter() -> None:
    # The same EAGLE-3 head on an H100: whatever KV memory the waterfall leaves, it holds blocks of 2,424,832 B.
    result = harness("budget", "--gpu", "H100-80GB", "--tokens", "4096", "--speculative-method", "eagle3",
                     "--num-speculative-tokens", "2", "--json")
    assert result.returncode == 0, result.stderr
    answer = json.loads(result.stdout)
    assert answer["capacity"]["bytes_per_block"] == 2_424_832
    assert answer["capacity"]["num_blocks"] == answer["waterfall"]["kv_bytes"] // 2_424_832


def test_the_installed_sampler_prices_the_profiles_activation_peak() -> None:
    # Qwen2-7B on an A100-80GB under 0.10.1 profiles 2,048 tokens and 256 rows of its 152,064-entry vocabulary
    # (an A100 keeps V1's small defaults). FlashInfer holds 14 B per logit: 2,048 × 3,584 × 2 B of hidden states +
    # 256 × 152,064 × 14 B = 14,680,064 + 544,997,376 = 559,677,440 B; unset, the sort's 36.71 B per logit is
    # assumed, as `pip install vllm` runs it: 14,680,064 + int(38,928,384 × 36.71) = 1,443,741,040 B, with a note.
    def answer(*sampler: str) -> dict[str, Any]:
        result = harness("budget", "--model", str(CONFIGS / "Qwen--Qwen2-7B-Instruct.json"), "--gpu", "A100-80GB",
                         "--engine-version", "0.10.1", "--max-model-len", "4096", *sampler, "--json")
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)["waterfall"]

    def activation(waterfall: dict[str, Any]) -> int:
        return next(term["bytes"] for term in waterfall["terms"] if term["name"] == "activation_peak")

    flashinfer, assumed = answer("--sampler", "flashinfer"), answer()
    assert (activation(flashinfer), activation(assumed)) == (559_677_440, 1_443_741_040)
    assert flashinfer["kv_bytes"] - assumed["kv_bytes"] == 1_443_741_040 - 559_677_440
    assert any("--sampler flashinfer" in note for note in assumed["assumptions"])
    assert not any("sampler" in note for note in flashinfer["assumptions"])


def test_decode_context_parallelism_spreads_each_sequence_before_launch() -> None:
    # DeepSeek-V2-Lite on eight H100s: the same blocks either way (MLA's latent is whole on every rank), but
    # with DCP 8 each rank keeps 1/8 of a sequence: a 163,840-token request needs 10,240 / 8 = 1,280 blocks, and
    # the tokens logged are the blocks' × 8.
    deepseek = str(CONFIGS / "deepseek-ai--DeepSeek-V2-Lite.json")

    def answer(*dcp: str) -> dict[str, Any]:
        result = harness("budget", "--model", deepseek, "--gpu", "H100-80GB", "--tensor-parallel-size", "8", *dcp,
                         "--json")
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)["capacity"]

    whole, spread = answer(), answer("--decode-context-parallel-size", "8")
    assert whole["num_blocks"] == spread["num_blocks"]
    assert (whole["blocks_per_request"], spread["blocks_per_request"]) == (10_240, 1_280)
    assert spread["kv_cache_tokens"] == 8 * whole["kv_cache_tokens"]


def test_a_drafter_without_a_kv_memory_figure_is_warned_as_ignored() -> None:
    result = harness("budget", "--tokens", "4096", "--speculative-method", "eagle3", "--num-speculative-tokens", "2")
    assert result.returncode == 0, result.stderr
    assert "--speculative-method: read only with a KV memory figure" in " ".join(result.stderr.split())


def test_with_pipeline_stages_the_fit_line_shows_the_binding_stages_kv_memory() -> None:
    # Qwen3-4B over 2 stages: 18 + 18 layers, 18 × 4,096 B a token × 16 = 1,179,648 B a block on each. With equal
    # layers the stage with less KV memory has fewer blocks and sets the tokens; the line names its figure,
    # not the even split the "= KV memory" row shows.
    result = harness("budget", "--gpu", "H100-80GB", "--tokens", "4096", "--pipeline-parallel-size", "2", "--json")
    assert result.returncode == 0, result.stderr
    answer = json.loads(result.stdout)
    stages, even = answer["waterfall"]["stage_kv_bytes"], answer["waterfall"]["kv_bytes"]
    binding = min(stages)
    assert binding != even
    assert answer["capacity"]["bytes_per_block"] == 1_179_648
    assert answer["capacity"]["num_blocks"] == binding // 1_179_648
    stated = re.match(r"fits: ([0-9.]+) GiB of KV memory on the binding pipeline stage", answer["answer"])
    assert stated is not None, answer["answer"]
    assert float(stated.group(1)) == round(binding / 2**30, 2) != round(even / 2**30, 2)


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


MALFORMED_BASES = {
    "deepseek": "deepseek-ai--DeepSeek-V2-Lite.json",
    "gpt-oss": "openai--gpt-oss-20b.json",
    "qwen3.6": "Qwen--Qwen3.6-35B-A3B.json",
    "qwen2.5-vl": "Qwen--Qwen2.5-VL-7B-Instruct.json",
    "qwen3-vl": "Qwen--Qwen3-VL-30B-A3B-Instruct.json",
}


@pytest.mark.parametrize(
    ("config", "edit", "named"),
    [
        ("qwen3", {"vocab_size": "x"}, "field 'vocab_size' must be a whole number, got 'x'"),
        ("qwen3", {"intermediate_size": 1.5}, "field 'intermediate_size' must be a whole number, got 1.5"),
        ("qwen3", {"num_hidden_layers": 10**30}, "more layers than a model holds"),
        ("qwen3", {"sliding_window": 4096, "sliding_window_pattern": "LLLG"},
         "field 'sliding_window_pattern' must be a positive integer, got 'LLLG'"),
        ("qwen3", {"use_sliding_window": True, "sliding_window": 4096, "max_window_layers": -1},
         "field 'max_window_layers' must be a whole number, got -1"),
        ("deepseek", {"v_head_dim": None}, "field 'v_head_dim' (a positive integer) is needed to size the weights"),
        ("deepseek", {"num_attention_heads": 0}, "field 'num_attention_heads'"),
        # once a loop over 10**30 dense layers: the command never returned; past any model's width it is refused
        # as a count, within it as more dense layers than the model has
        ("deepseek", {"first_k_dense_replace": 10**30},
         "field 'first_k_dense_replace' is 1,000,000,000,000,000,000,000,000,000,000, more than any model holds"),
        ("deepseek", {"first_k_dense_replace": 1000},
         "field 'first_k_dense_replace' is 1000, more dense layers than num_hidden_layers (27)"),
        # each once priced without a word: a negative KV memory of 10**27 GiB, MoE experts as wide as the dense
        # MLP (4,845 GiB of weights), an uneven grouping of query heads, "no" read as true, an FP8 "model dtype"
        # doubling the tokens, and gpt-oss's 24 layers all taken as sliding-window ones
        ("qwen3", {"hidden_size": 10**30}, "field 'hidden_size' is 1,000,000,000,000,000,000,000,000,000,000, more "
         "than any model holds (at most 16,777,216 are read)"),
        ("deepseek", {"moe_intermediate_size": 0}, "field 'moe_intermediate_size' is 0 in a model with routed "
         "experts: it must be a positive whole number"),
        ("qwen3", {"num_key_value_heads": 3}, "field 'num_key_value_heads' 3 does not divide num_attention_heads 32"),
        ("qwen3", {"tie_word_embeddings": "no"}, "field 'tie_word_embeddings' must be true or false, got 'no'"),
        ("qwen3", {"torch_dtype": "fp8"}, "field 'torch_dtype' must name the weights' dtype (bfloat16, float16 or "
         "float32), got 'fp8'"),
        ("gpt-oss", {"layer_types": []}, "field 'layer_types' lists 0 layers but num_hidden_layers is 24"),
        ("gpt-oss", {"layer_types": 2.5}, "field 'layer_types' must be a list of layer kinds, got 2.5"),
        ("qwen3.6", {"text_config": {"layer_types": ["full_attention", ["linear_attention"]]}},
         "field 'layer_types' must be a list of layer kinds"),
        ("qwen3.6", {"text_config": {"mamba_ssm_dtype": []}}, "field 'mamba_ssm_dtype' must be one of"),
        ("qwen2.5-vl", {"vision_config": {"temporal_patch_size": 2.0}},
         "field 'vision_config.temporal_patch_size' must be a positive integer, got 2.0"),
        ("qwen2.5-vl", {"vision_config": {"in_channels": "abc"}}, "field 'vision_config.in_channels'"),
        ("qwen3-vl", {"vision_config": {"deepstack_visual_indexes": 8}},
         "field 'vision_config.deepstack_visual_indexes' must be a list of layer indices"),
        # each once priced although vLLM's kernels refuse the checkpoint: 3-bit AWQ, and groups that split a row
        ("qwen3", {"quantization_config": {"quant_method": "awq", "bits": 3, "group_size": 128}},
         "quantization_config: awq at 3 bits is refused by vLLM"),
        ("qwen3", {"quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": 3}},
         "quantization_config: groups of 3 inputs do not divide the hidden size 2560"),
        # each once read as "not stated": a quantized checkpoint priced at 16 bits a weight, a YaRN context's RoPE
        # cache at the unscaled length, a wrapper's language model from the wrapper's own fields
        ("qwen3", {"quantization_config": "awq"},
         "field 'quantization_config' must be a mapping of fields, got 'awq'"),
        ("qwen3", {"rope_scaling": ["yarn", 4.0]},
         "field 'rope_scaling' must be a mapping of fields, got ['yarn', 4.0]"),
        ("qwen3.6", {"text_config": "qwen3_5_text"}, "field 'text_config' must be a mapping of fields, got "
         "'qwen3_5_text'"),
    ],
)
def test_a_malformed_config_field_is_named_before_launch(tmp_path, config, edit, named) -> None:
    """Fields the weights and layer layout are sized from, each wrong in a way that once surfaced as a traceback
    (a section's edit replaces only the fields it names)."""
    source = SNAPSHOT / "config.json" if config == "qwen3" else CONFIGS / MALFORMED_BASES[config]
    base = json.loads(source.read_text())
    for field, value in edit.items():
        both_sections = isinstance(base.get(field), dict) and isinstance(value, dict)
        base[field] = {**base[field], **value} if both_sections else value
    path = tmp_path / "config.json"
    write(path, json.dumps(base))
    result = harness("budget", "--model", str(path), "--gpu", "H100-80GB", "--max-model-len", "4096")
    assert result.returncode == 2, result.stderr
    assert f"{path}: " in result.stderr and named in result.stderr  # the file, then the field
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


@pytest.mark.parametrize("vision_config", ["oops", None, [1, 2]])
def test_a_vision_language_config_without_its_vision_sizes_is_refused(tmp_path, vision_config) -> None:
    # Qwen2.5-VL-7B's tower weighs 1.26 GiB and its profile holds more: read without it, the answer once said
    # 51.02 GiB of KV memory where the whole model leaves 42.41, and did not say what it had left out.
    base = json.loads((CONFIGS / MALFORMED_BASES["qwen2.5-vl"]).read_text())
    path = tmp_path / "config.json"
    write(path, json.dumps({**base, "vision_config": vision_config}))
    result = harness("budget", "--model", str(path), "--gpu", "H100-80GB")
    assert result.returncode == 2, result.stdout
    assert f"{path}: Qwen2_5_VLForConditionalGeneration loads a vision tower, so field 'vision_config' must give " \
        "its sizes" in " ".join(result.stderr.split())


def test_a_dense_config_of_an_moe_family_may_state_zero_experts(tmp_path) -> None:
    # Dense Granite 4 and Qwen3.5 configs state "num_experts": 0, "num_experts_per_tok": 0 and an expert width of
    # 0: no expert is read, so the answer is the dense model's own.
    base = json.loads((SNAPSHOT / "config.json").read_text())
    path = tmp_path / "config.json"
    write(path, json.dumps({**base, "num_experts": 0, "num_experts_per_tok": 0, "moe_intermediate_size": 0}))
    zeroed, plain = (harness("budget", "--model", model, "--gpu", "H100-80GB", "--json")
                     for model in (str(path), str(SNAPSHOT / "config.json")))
    assert zeroed.returncode == 0, zeroed.stderr
    assert json.loads(zeroed.stdout)["capacity"] == json.loads(plain.stdout)["capacity"]


def test_an_unstated_utilisation_is_the_releases_default() -> None:
    # vLLM's config/cache.py defaults --gpu-memory-utilization to 0.9 through 0.19.1 and to 0.92 from 0.20.0. On an
    # H100-80GB (79.22 GiB as the catalogue gives it) that is 2% of the card: 1.58 GiB more cache from 0.20 on.
    def usable(*args: str) -> tuple[float, int]:
        result = harness("budget", "--gpu", "H100-80GB", "--tokens", "4096", "--json", *args)
        assert result.returncode == 0, result.stderr
        waterfall = json.loads(result.stdout)["waterfall"]
        return waterfall["gpu_memory_utilization"], waterfall["usable_bytes"]

    old, new = usable("--engine-version", "0.19.1"), usable("--engine-version", "0.22.0")
    assert (old[0], new[0]) == (0.9, 0.92)
    assert round((new[1] - old[1]) / 2**30, 2) == 1.58
    assert usable("--engine-version", "0.22.0", "--gpu-memory-utilization", "0.9") == old


def test_a_release_past_the_rules_is_priced_with_a_warning_that_names_what_changed() -> None:
    # 0.33 is the newest release the rules were read in; 0.34 sizes an extensible cache after warmup by default.
    def warned(release: str) -> str:
        result = harness("budget", "--gpu", "H100-80GB", "--tokens", "4096", "--engine-version", release)
        assert result.returncode == 0, result.stderr
        return " ".join(result.stderr.split())

    assert "newer than any release" not in warned("0.33.0")
    assert "priced by 0.33's rules" in warned("0.33.99.post1") and "extensible" not in warned("0.33.99.post1")
    assert "priced by 0.33's rules; from 0.34 vLLM sizes the cache after warmup" in warned("0.34.0")
