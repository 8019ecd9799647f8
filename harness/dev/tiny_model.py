"""A tiny Qwen3-architecture checkpoint generated on demand, so the real engine can run without a hub.

Random weights give nonsense answers, but the engine does not know that: it loads the same architecture,
allocates the same paged KV cache and writes the same log lines as it would for Qwen3-4B. The shape
(4 layers, 2 KV heads, head_dim 32, bf16) makes one token of KV cache exactly 1,024 bytes.
The same seed gives byte-identical files, so a cached copy and a fresh one are interchangeable; the
directory records its own identity (generator, seed, a hash of its files), having no hub revision.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from importlib import resources
from pathlib import Path

import ml_dtypes
import numpy as np
from safetensors.numpy import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from harness.model_identity import write_identity
from harness.paths import output_directory

CACHE_DIR_ENV = "HARNESS_CACHE_DIR"

# Bump when the generator's output changes, so stale cached copies are not reused.
GENERATOR_VERSION = 2
GENERATOR = f"harness tiny-qwen3 generator {GENERATOR_VERSION}"

NUM_LAYERS = 4
HIDDEN_SIZE = 128
INTERMEDIATE_SIZE = 384
NUM_ATTENTION_HEADS = 4
NUM_KV_HEADS = 2
HEAD_DIM = 32
MAX_POSITION_EMBEDDINGS = 4096
VOCAB_SIZE = 2048
WEIGHT_STD = 0.02

END_OF_TEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = [END_OF_TEXT, IM_START, IM_END]

# Qwen's chat shape without tools or thinking: enough for chat requests to render.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def cache_root() -> Path:
    """Where generated artefacts live; $HARNESS_CACHE_DIR lets tests and CI keep them apart."""
    configured = os.environ.get(CACHE_DIR_ENV)
    return Path(configured) if configured else Path.home() / ".cache" / "vllm-serving-harness"


def ensure_tiny_model(seed: int = 0) -> Path:
    """The tiny model's directory for this seed, generated once and then reused."""
    models_dir = cache_root() / "models"
    target = models_dir / f"tiny-qwen3-seed{seed}-{_inputs_digest()}"
    if (target / "model.safetensors").is_file():
        return target
    output_directory(models_dir, f"{CACHE_DIR_ENV} (the cache)" if os.environ.get(CACHE_DIR_ENV) else "the cache")
    models_dir.mkdir(parents=True, exist_ok=True)
    # Build beside the target and rename, so a concurrent caller never sees a half-written model.
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=models_dir))
    try:
        write_tiny_model(staging, seed)
        try:
            staging.rename(target)
        except OSError:
            if not (target / "model.safetensors").is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def write_tiny_model(directory: Path, seed: int) -> None:
    """Write config, generation config, tokenizer and weights for `seed` into an existing directory, and
    last the identity of those files (harness.model_identity)."""
    tokenizer = train_tokenizer()
    ids = {token: _special_id(tokenizer, token) for token in SPECIAL_TOKENS}
    _write_json(directory / "config.json", _model_config(ids))
    _write_json(directory / "generation_config.json", _generation_config(ids))
    tokenizer.save(str(directory / "tokenizer.json"))
    _write_json(directory / "tokenizer_config.json", _tokenizer_config())
    save_file(_random_weights(seed), str(directory / "model.safetensors"), metadata={"format": "pt"})
    write_identity(directory, generator=GENERATOR, seed=seed)


def train_tokenizer() -> Tokenizer:
    """A byte-level BPE trained on the bundled corpus, with Qwen's special tokens at the top ids."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE - len(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_corpus_texts(), trainer=trainer)
    tokenizer.add_special_tokens(SPECIAL_TOKENS)
    return tokenizer


def _corpus_texts() -> list[str]:
    corpus = resources.files("harness") / "corpus"
    files = sorted((entry for entry in corpus.iterdir() if entry.name.endswith(".txt")), key=lambda e: e.name)
    return [entry.read_text(encoding="utf-8") for entry in files]


def _inputs_digest() -> str:
    """Short hash of everything the files depend on besides the seed: corpus and generator version."""
    digest = hashlib.sha256(f"generator-{GENERATOR_VERSION}".encode())
    for text in _corpus_texts():
        digest.update(text.encode("utf-8"))
    return digest.hexdigest()[:12]


def _random_weights(seed: int) -> dict[str, np.ndarray]:
    """Qwen3's checkpoint tensor names and shapes; norms are ones, the rest small normal noise."""
    rng = np.random.default_rng(seed)

    def noise(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape, dtype=np.float32) * WEIGHT_STD).astype(ml_dtypes.bfloat16)

    def ones(size: int) -> np.ndarray:
        return np.ones(size, dtype=ml_dtypes.bfloat16)

    weights = {"model.embed_tokens.weight": noise(VOCAB_SIZE, HIDDEN_SIZE)}
    for layer in range(NUM_LAYERS):
        prefix = f"model.layers.{layer}"
        weights |= {
            f"{prefix}.input_layernorm.weight": ones(HIDDEN_SIZE),
            f"{prefix}.self_attn.q_proj.weight": noise(NUM_ATTENTION_HEADS * HEAD_DIM, HIDDEN_SIZE),
            f"{prefix}.self_attn.k_proj.weight": noise(NUM_KV_HEADS * HEAD_DIM, HIDDEN_SIZE),
            f"{prefix}.self_attn.v_proj.weight": noise(NUM_KV_HEADS * HEAD_DIM, HIDDEN_SIZE),
            f"{prefix}.self_attn.o_proj.weight": noise(HIDDEN_SIZE, NUM_ATTENTION_HEADS * HEAD_DIM),
            f"{prefix}.self_attn.q_norm.weight": ones(HEAD_DIM),
            f"{prefix}.self_attn.k_norm.weight": ones(HEAD_DIM),
            f"{prefix}.post_attention_layernorm.weight": ones(HIDDEN_SIZE),
            f"{prefix}.mlp.gate_proj.weight": noise(INTERMEDIATE_SIZE, HIDDEN_SIZE),
            f"{prefix}.mlp.up_proj.weight": noise(INTERMEDIATE_SIZE, HIDDEN_SIZE),
            f"{prefix}.mlp.down_proj.weight": noise(HIDDEN_SIZE, INTERMEDIATE_SIZE),
        }
    weights["model.norm.weight"] = ones(HIDDEN_SIZE)
    return weights


def _special_id(tokenizer: Tokenizer, token: str) -> int:
    token_id = tokenizer.token_to_id(token)
    if token_id is None:  # train_tokenizer adds every special token; without one the model cannot stop
        raise RuntimeError(f"the trained tokenizer lacks {token}")
    return token_id


def _model_config(ids: dict[str, int]) -> dict[str, object]:
    """Laid out like Qwen3-4B's config.json, so code that reads the real one reads this one too."""
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": ids[END_OF_TEXT],
        "eos_token_id": ids[IM_END],
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "hidden_size": HIDDEN_SIZE,
        "initializer_range": WEIGHT_STD,
        "intermediate_size": INTERMEDIATE_SIZE,
        "max_position_embeddings": MAX_POSITION_EMBEDDINGS,
        "max_window_layers": NUM_LAYERS,
        "num_attention_heads": NUM_ATTENTION_HEADS,
        "num_hidden_layers": NUM_LAYERS,
        "num_key_value_heads": NUM_KV_HEADS,
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": 1000000,
        "sliding_window": None,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "dtype": "bfloat16",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": VOCAB_SIZE,
    }


def _generation_config(ids: dict[str, int]) -> dict[str, object]:
    return {
        "bos_token_id": ids[END_OF_TEXT],
        "eos_token_id": [ids[IM_END], ids[END_OF_TEXT]],
        "pad_token_id": ids[END_OF_TEXT],
        "do_sample": True,
        "temperature": 0.6,
        "top_p": 0.95,
        "top_k": 20,
    }


def _tokenizer_config() -> dict[str, object]:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": MAX_POSITION_EMBEDDINGS,
        "eos_token": IM_END,
        "pad_token": END_OF_TEXT,
        "bos_token": None,
        "unk_token": None,
        "additional_special_tokens": [IM_START, IM_END],
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }


def _write_json(path: Path, content: dict[str, object]) -> None:
    path.write_text(json.dumps(content, indent=2, sort_keys=True) + "\n", encoding="utf-8")
