"""The generated tiny model: reproducible bytes, the promised Qwen3 shape, a usable tokenizer."""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path

import pytest
from transformers import AutoConfig, AutoTokenizer
from typer.testing import CliRunner

from harness.cli import app
from harness.dev.tiny_model import GENERATOR, ensure_tiny_model, write_tiny_model
from harness.errors import HarnessError
from harness.model_identity import IDENTITY_FILE, ModelIdentity, read_identity

FILES = ["config.json", "generation_config.json", "harness-model.json", "model.safetensors", "tokenizer.json",
         "tokenizer_config.json"]


def _safetensors_header(path: Path) -> dict[str, dict]:
    """Read the header straight from the file format (u64 length + JSON), independent of the writer."""
    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + length])
    header.pop("__metadata__", None)
    return header


def test_same_seed_gives_byte_identical_files(tmp_path: Path) -> None:
    first, second, other = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    for directory, seed in ((first, 7), (second, 7), (other, 8)):
        directory.mkdir()
        write_tiny_model(directory, seed)
    assert sorted(p.name for p in first.iterdir()) == FILES
    for name in FILES:
        assert (first / name).read_bytes() == (second / name).read_bytes(), name
    assert (first / "model.safetensors").read_bytes() != (other / "model.safetensors").read_bytes()
    assert (first / "tokenizer.json").read_bytes() == (other / "tokenizer.json").read_bytes()


def test_the_model_records_its_own_identity_and_refuses_files_changed_since(tmp_path: Path) -> None:
    write_tiny_model(tmp_path, 7)
    # By hand: sha256 over every file but the identity, in name order, each as "name NUL size NUL" and its bytes.
    digest = hashlib.sha256()
    for name in (name for name in FILES if name != IDENTITY_FILE):
        content = (tmp_path / name).read_bytes()
        digest.update(f"{name}\0{len(content)}\0".encode() + content)
    expected = ModelIdentity(generator=GENERATOR, seed=7, files_sha256=digest.hexdigest())
    assert read_identity(tmp_path) == expected
    assert json.loads((tmp_path / IDENTITY_FILE).read_text()) == expected.model_dump()
    assert read_identity(tmp_path.parent) is None  # a directory no generator of the harness wrote
    (tmp_path / "config.json").write_text("{}\n")
    with pytest.raises(HarnessError, match=r"harness-model\.json: the model's files hash to .* changed after"):
        read_identity(tmp_path)


def test_weights_have_qwen3_names_shapes_and_bf16(tiny_model_dir: Path) -> None:
    header = _safetensors_header(tiny_model_dir / "model.safetensors")
    assert {entry["dtype"] for entry in header.values()} == {"BF16"}
    assert "lm_head.weight" not in header  # tied to the embeddings
    assert header["model.embed_tokens.weight"]["shape"] == [2048, 128]
    assert header["model.layers.3.self_attn.q_proj.weight"]["shape"] == [4 * 32, 128]
    assert header["model.layers.3.self_attn.k_proj.weight"]["shape"] == [2 * 32, 128]
    assert header["model.layers.0.self_attn.k_norm.weight"]["shape"] == [32]
    assert not any(name.startswith("model.layers.4.") for name in header)
    # By hand: embeddings 2048*128 + 4 layers * (q 128*128 + k,v 2*64*128 + o 128*128 + norms 32+32+128+128
    # + MLP 3*384*128) + final norm 128 = 1,049,984 parameters of 2 bytes.
    data_bytes = max(entry["data_offsets"][1] for entry in header.values())
    assert data_bytes == 1_049_984 * 2


def test_config_describes_a_1024_byte_per_token_kv_cache(tiny_model_dir: Path) -> None:
    config = AutoConfig.from_pretrained(tiny_model_dir)
    assert config.model_type == "qwen3"
    assert config.architectures == ["Qwen3ForCausalLM"]
    assert config.tie_word_embeddings is True
    assert config.max_position_embeddings == 4096
    raw = json.loads((tiny_model_dir / "config.json").read_text())
    assert raw["torch_dtype"] == raw["dtype"] == "bfloat16"
    kv_bytes_per_token = 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim * 2
    assert kv_bytes_per_token == 1024


def test_tokenizer_round_trips_text_and_knows_its_special_tokens(tiny_model_dir: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert len(tokenizer) == 2048
    assert tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>"]) == [2045, 2046, 2047]
    text = "The scheduler preempts a sequence when the cache is full, 1024 tokens later."
    ids = tokenizer(text).input_ids
    assert len(ids) < len(text) / 2  # trained merges, not bytes
    assert tokenizer.decode(ids) == text
    config = json.loads((tiny_model_dir / "tokenizer_config.json").read_text())
    assert "<|im_start|>assistant" in config["chat_template"]


def test_model_is_cached_under_the_configured_directory(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HARNESS_CACHE_DIR", str(tmp_path))
    directory = ensure_tiny_model(seed=1)
    assert directory.parent == tmp_path / "models"
    stamp = (directory / "model.safetensors").stat().st_mtime_ns
    assert ensure_tiny_model(seed=1) == directory
    assert (directory / "model.safetensors").stat().st_mtime_ns == stamp
    assert [p.name for p in (tmp_path / "models").iterdir()] == [directory.name]  # no staging left behind


def test_model_tiny_command_prints_the_cached_directory(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HARNESS_CACHE_DIR", str(tmp_path))
    result = CliRunner().invoke(app, ["model", "tiny", "--seed", "2"])
    assert result.exit_code == 0, result.output
    printed = Path(result.output.strip())
    assert printed.parent == tmp_path / "models" and (printed / "model.safetensors").is_file()
