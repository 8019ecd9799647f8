"""What a checkpoint's config says about its KV cache: one spec per layer, plus the weights' size.

Calculators go wrong by reading a config as if every model were Llama: an explicit `head_dim` is
ignored, MLA latents are doubled like K and V, sliding-window and state (Mamba, linear attention)
layers are priced like full attention. Here every layer gets its own spec, and every guess made while
reading the config is written down in `ModelShape.notes`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import struct
from collections.abc import Iterator
from enum import StrEnum
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from harness.errors import HarnessError
from harness.paths import read_bounded_bytes
from harness.predict.architectures import check_architectures, check_counts, language_config
from harness.predict.config_counts import needed_count, stated_count
from harness.predict.layer_variants import full_attention_heads, kv_shared_layers

SNAPSHOTS_DIR = Path(__file__).resolve().parents[1] / "snapshots"  # data of the package, beside its stages
PINNED_MODEL = "Qwen/Qwen3-4B"
PINNED_REVISION = "1cfa9a7208912126459214e8b04321603b3df60c"
INDEX_FILE = "model.safetensors.index.json"
# What a checkpoint's torch_dtype may name: the 16- and 32-bit floats, under the names kv_bytes.py reads too.
WEIGHT_DTYPES = frozenset({"bfloat16", "float16", "float32", "bf16", "fp16", "half", "float", "fp32"})
MAX_CONFIG_BYTES = 64 * 2**20  # config.json and the weights index: a few MiB at most, with long layer lists
KV_CACHE_PURPOSE = "to size the KV cache"  # what the layer counts and widths read here are needed for
SSM_DTYPES = frozenset({"float32", "bfloat16", "float16"})  # what a config's mamba_ssm_dtype may name


class LayerKind(StrEnum):
    FULL_ATTENTION = "full_attention"
    SLIDING_WINDOW = "sliding_window"
    MLA = "mla"
    STATE = "state"  # Mamba / linear attention: a fixed state per sequence, whatever its length


class LayerSpec(BaseModel, frozen=True):
    """What one layer keeps per token (attention, MLA) or per sequence (state layers).

    A state layer keeps a convolution window (`conv_channels` × `conv_width` past inputs) and a recurrent or
    SSM state (`ssm_elements`); the window is in the model's dtype, the state in `ssm_dtype` where the config
    fixes one (Qwen3.5's `mamba_ssm_dtype: float32`), else in the model's dtype too.
    """

    kind: LayerKind
    kv_heads: int = 0
    head_dim: int = 0
    window_tokens: int | None = None
    latent_dim: int = 0
    conv_channels: int = 0
    conv_width: int = 0
    ssm_elements: int = 0
    ssm_dtype: str | None = None

    @property
    def window(self) -> int:
        """A sliding-window layer's window in tokens; `parse_config` gives every such layer one."""
        if self.window_tokens is None:
            raise ValueError(f"a {self.kind.value} layer has no window")
        return self.window_tokens


class ModelShape(BaseModel):
    name: str
    revision: str | None
    source: str
    model_type: str
    dtype: str
    layers: list[LayerSpec]
    max_position_embeddings: int | None
    weights_bytes: int | None
    weights_source: str | None
    notes: list[str]
    mtp_layers: int = 0  # the config's multi-token-prediction layers: KV-cache layers only when MTP drafts
    config: dict[str, Any] = Field(default_factory=dict, exclude=True)  # the raw config, for the memory model

    @property
    def checkpoint_weights(self) -> tuple[int, str] | None:
        """(bytes, where the figure comes from) when the checkpoint's size is known."""
        if self.weights_bytes is None or self.weights_source is None:
            return None
        return self.weights_bytes, self.weights_source

    def served_in(self, dtype: str | None) -> ModelShape:
        """The shape as `--dtype` serves it: activations and an 'auto' KV cache take that dtype (None: the config's)."""
        return self if dtype is None else self.model_copy(update={"dtype": dtype})

    def layer_counts(self) -> dict[LayerKind, int]:
        counts: dict[LayerKind, int] = {}
        for layer in self.layers:
            counts[layer.kind] = counts.get(layer.kind, 0) + 1
        return counts


def load_model_shape(model: str, revision: str | None = None) -> ModelShape:
    """Read a local config.json or model directory, a bundled snapshot, or the Hugging Face hub."""
    if not model.strip():
        raise HarnessError("--model: empty; give a config.json, a model directory, a bundled snapshot or a hub id")
    if revision is not None and not revision.strip():
        raise HarnessError("--revision: empty; give a hub revision, or leave it out")
    path = Path(model).expanduser()
    if path.exists():
        return _from_local(path)
    snapshot = _snapshot_dir(model, revision or PINNED_REVISION)
    if snapshot is not None:
        shape = _from_directory(snapshot, name=model, revision=revision or PINNED_REVISION)
        return shape.model_copy(update={"source": f"bundled snapshot of {model}@{shape.revision}"})
    return _from_hub(model, revision)


def parse_config(config: dict[str, Any], *, source: str = "config") -> tuple[list[LayerSpec], list[str]]:
    """One LayerSpec per layer that keeps a KV cache or state, and the notes on how they were derived."""
    notes: list[str] = []
    check_architectures(config, source, notes)
    if isinstance(config.get("text_config"), dict):
        notes.append("multimodal config: the text_config describes the language model's layers")
    config = language_config(config)
    check_counts(config, source)  # every count read below is a whole number from here on
    num_layers = needed_count(config, "num_hidden_layers", source, KV_CACHE_PURPOSE)
    kinds = _layer_kinds(config, num_layers, source, notes)
    present = set(kinds)
    spec_of: dict[LayerKind, LayerSpec] = {}  # one spec per kind the model has, read only when it has it
    if present - {LayerKind.STATE}:
        attention = _attention_spec(config, source, notes)
        spec_of.update(dict.fromkeys(present - {LayerKind.STATE}, attention))
    if LayerKind.STATE in present:
        spec_of[LayerKind.STATE] = _state_spec(config, source, notes)
    window = stated_count(config, "sliding_window", source)
    if LayerKind.SLIDING_WINDOW in present:
        if window is None:
            raise HarnessError(f"{source}: sliding-window layers but field 'sliding_window' is missing")
        spec_of[LayerKind.SLIDING_WINDOW] = spec_of[LayerKind.SLIDING_WINDOW].model_copy(
            update={"kind": LayerKind.SLIDING_WINDOW, "window_tokens": window})
    if LayerKind.FULL_ATTENTION in present and (full := full_attention_heads(config, source, notes)):
        spec_of[LayerKind.FULL_ATTENTION] = LayerSpec(kind=LayerKind.FULL_ATTENTION, kv_heads=full[0], head_dim=full[1])
    cached = num_layers - kv_shared_layers(config, num_layers, source, notes)
    return [spec_of[kind] for kind in kinds[:cached]], notes


def _layer_kinds(config: dict[str, Any], num_layers: int, source: str, notes: list[str]) -> list[LayerKind]:
    """Which layers are full, sliding or state layers, from whichever field this family uses."""
    if config.get("layer_types") is not None:  # an empty list is refused below, not read as no list
        return _listed_kinds(config["layer_types"], num_layers, source, notes)
    patterned = _family_pattern(config, num_layers, source, notes)
    if patterned is not None:
        return patterned
    attention = LayerKind.MLA if config.get("kv_lora_rank") else LayerKind.FULL_ATTENTION
    if "use_sliding_window" in config:  # Qwen2/Qwen3: the window applies from max_window_layers on
        if config["use_sliding_window"] and config.get("sliding_window"):
            first = config.get("max_window_layers") or 0
            notes.append(f"use_sliding_window: layers from {first} on use the sliding window")
            return [LayerKind.SLIDING_WINDOW if i >= first else attention for i in range(num_layers)]
        notes.append("use_sliding_window is false: every layer uses full attention")
        return [attention] * num_layers
    if config.get("sliding_window"):
        notes.append("sliding_window set with no layer pattern: every layer uses the sliding window")
        return [LayerKind.SLIDING_WINDOW] * num_layers
    return [attention] * num_layers


def _listed_kinds(types: list[str], num_layers: int, source: str, notes: list[str]) -> list[LayerKind]:
    names = {"full_attention": LayerKind.FULL_ATTENTION, "attention": LayerKind.FULL_ATTENTION,
             "sliding_attention": LayerKind.SLIDING_WINDOW, "sliding_window": LayerKind.SLIDING_WINDOW,
             "linear_attention": LayerKind.STATE, "mamba": LayerKind.STATE}
    unknown = sorted({t for t in types if t not in names})
    if unknown:
        raise HarnessError(f"{source}: field 'layer_types' has unknown layer type(s) {unknown}")
    if len(types) != num_layers:
        raise HarnessError(
            f"{source}: field 'layer_types' lists {len(types)} layers but num_hidden_layers is {num_layers}"
        )
    notes.append("layer kinds from layer_types")
    return [names[t] for t in types]


def _family_pattern(config: dict[str, Any], num_layers: int, source: str, notes: list[str]) -> list[LayerKind] | None:
    """A family's repeating layout where the config states no list: the pattern its transformers config derives."""
    if "attn_layer_period" in config:  # Jamba: one attention layer every `period`, Mamba elsewhere
        period = needed_count(config, "attn_layer_period", source, KV_CACHE_PURPOSE)
        offset = config.get("attn_layer_offset") or 0
        notes.append(f"Jamba layout: attention at layer i where i % {period} == {offset}, Mamba elsewhere")
        return [LayerKind.FULL_ATTENTION if i % period == offset else LayerKind.STATE for i in range(num_layers)]
    family = {"gemma2": "Gemma 2", "gpt_oss": "gpt-oss"}.get(str(config.get("model_type")))
    if family == "gpt-oss" or (family == "Gemma 2" and config.get("sliding_window")):
        notes.append(f"{family} layout: even layers use the sliding window, odd layers full attention")
        return [LayerKind.SLIDING_WINDOW if i % 2 == 0 else LayerKind.FULL_ATTENTION for i in range(num_layers)]
    if config.get("full_attention_interval"):  # Qwen3-Next and Qwen3.5
        interval = needed_count(config, "full_attention_interval", source, KV_CACHE_PURPOSE)
        notes.append(f"full_attention_interval {interval}: every {interval}th layer is full attention, the others "
                     "linear attention")
        return [LayerKind.FULL_ATTENTION if (i + 1) % interval == 0 else LayerKind.STATE for i in range(num_layers)]
    if config.get("sliding_window_pattern") and config.get("sliding_window"):
        pattern = needed_count(config, "sliding_window_pattern", source, KV_CACHE_PURPOSE)
        notes.append(f"sliding_window_pattern {pattern}: every {pattern}th layer is full attention")
        return [
            LayerKind.FULL_ATTENTION if (i + 1) % pattern == 0 else LayerKind.SLIDING_WINDOW
            for i in range(num_layers)
        ]
    return None


def _attention_spec(config: dict[str, Any], source: str, notes: list[str]) -> LayerSpec:
    if config.get("kv_lora_rank"):
        latent = (needed_count(config, "kv_lora_rank", source, KV_CACHE_PURPOSE)
                  + needed_count(config, "qk_rope_head_dim", source, KV_CACHE_PURPOSE))
        notes.append("MLA: one latent of kv_lora_rank + qk_rope_head_dim per token and layer, no K/V pair")
        return LayerSpec(kind=LayerKind.MLA, latent_dim=latent)
    heads = needed_count(config, "num_attention_heads", source, KV_CACHE_PURPOSE)
    kv_heads = stated_count(config, "num_key_value_heads", source)
    if kv_heads is None:
        notes.append("no num_key_value_heads: multi-head attention, one KV head per attention head")
        kv_heads = heads
    if config.get("head_dim"):
        head_dim = stated_count(config, "head_dim", source)
        notes.append(f"head_dim {head_dim} from the config (wins over hidden_size / num_attention_heads)")
    else:
        head_dim = needed_count(config, "hidden_size", source, KV_CACHE_PURPOSE) // heads
        notes.append(f"head_dim {head_dim} = hidden_size / num_attention_heads")
    return LayerSpec(kind=LayerKind.FULL_ATTENTION, kv_heads=kv_heads, head_dim=head_dim)


def _state_spec(config: dict[str, Any], source: str, notes: list[str]) -> LayerSpec:
    """The conv window and recurrent state one sequence keeps in one state layer."""
    if "linear_key_head_dim" in config:  # Qwen3-Next / Qwen3.5 gated delta net
        key_dim = needed_count(config, "linear_num_key_heads", source, KV_CACHE_PURPOSE) * needed_count(
            config, "linear_key_head_dim", source, KV_CACHE_PURPOSE)
        value_heads = needed_count(config, "linear_num_value_heads", source, KV_CACHE_PURPOSE)
        value_head_dim = needed_count(config, "linear_value_head_dim", source, KV_CACHE_PURPOSE)
        kernel = needed_count(config, "linear_conv_kernel_dim", source, KV_CACHE_PURPOSE)
        recurrent = value_heads * needed_count(config, "linear_key_head_dim", source, KV_CACHE_PURPOSE) * value_head_dim
        ssm_dtype = _ssm_dtype(config, source)
        notes.append("linear attention (gated delta net): conv state + recurrent state per sequence"
                     + (f", the recurrent state in {ssm_dtype} (mamba_ssm_dtype)" if ssm_dtype else ""))
        return LayerSpec(kind=LayerKind.STATE, conv_channels=2 * key_dim + value_heads * value_head_dim,
                         conv_width=kernel - 1, ssm_elements=recurrent, ssm_dtype=ssm_dtype)
    if "mamba_d_state" in config:  # Jamba's Mamba-1 layers
        inner = (config.get("mamba_expand") or 2) * needed_count(config, "hidden_size", source, KV_CACHE_PURPOSE)
        notes.append("Mamba-1: conv state + SSM state per sequence")
        return LayerSpec(kind=LayerKind.STATE, conv_channels=inner, conv_width=(config.get("mamba_d_conv") or 4) - 1,
                         ssm_elements=inner * needed_count(config, "mamba_d_state", source, KV_CACHE_PURPOSE))
    raise HarnessError(f"{source}: state layers but no Mamba or linear-attention fields to size them")


def _ssm_dtype(config: dict[str, Any], source: str) -> str | None:
    """The recurrent state's dtype where the config fixes it; vLLM keeps Qwen3.5's in float32 whatever the model's."""
    name = config.get("mamba_ssm_dtype")
    if name is None:
        return None
    if not isinstance(name, str) or name not in SSM_DTYPES:
        raise HarnessError(f"{source}: field 'mamba_ssm_dtype' must be one of {sorted(SSM_DTYPES)}, got {name!r}")
    return str(name)


def _from_local(path: Path) -> ModelShape:
    if path.is_dir():
        return _from_directory(path, name=str(path), revision=None)
    return _shape(_read_json(path), name=str(path), revision=None, source=str(path), weights=(None, None))


def _from_directory(directory: Path, *, name: str, revision: str | None) -> ModelShape:
    config_path = directory / "config.json"
    if not config_path.is_file():
        raise HarnessError(f"{directory}: no config.json in this model directory")
    return _shape(
        _read_json(config_path), name=name, revision=revision, source=str(directory), weights=_weights(directory)
    )


def _from_hub(model: str, revision: str | None) -> ModelShape:
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError

    bundled = ", ".join(_bundled_names()) or "none"
    try:
        with _quiet_hub():
            config_path = Path(hf_hub_download(model, "config.json", revision=revision))
    except Exception as error:  # offline, unknown repo, gated, bad revision: all end the same way
        raise HarnessError(
            f"model '{model}' is not a local path or a bundled snapshot (bundled: {bundled}), "
            f"and the Hugging Face hub did not give its config.json: {type(error).__name__}"
        ) from None
    try:
        with _quiet_hub():
            index = _read_json(Path(hf_hub_download(model, INDEX_FILE, revision=revision)))
        weights: tuple[int | None, str | None] = (int(index["metadata"]["total_size"]),
                                                  f"{INDEX_FILE} metadata.total_size (hub)")
    except (EntryNotFoundError, KeyError, ValueError):
        weights = (None, None)
    return _shape(_read_json(config_path), name=model, revision=revision, source="Hugging Face hub", weights=weights)


@contextlib.contextmanager
def _quiet_hub() -> Iterator[None]:
    """The hub client logs each retry ('Retrying in 1s') on stderr: the failure is told once, in one line."""
    hub_logger = logging.getLogger("huggingface_hub")
    level = hub_logger.level
    hub_logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        hub_logger.setLevel(level)


def _shape(
    config: dict[str, Any], *, name: str, revision: str | None, source: str, weights: tuple[int | None, str | None]
) -> ModelShape:
    layers, notes = parse_config(config, source=source)
    language = language_config(config)
    text_config = config.get("text_config")
    text: dict[str, Any] = text_config if isinstance(text_config, dict) else {}
    field, dtype = next(((name, section[name]) for section in (config, text) for name in ("torch_dtype", "dtype")
                         if section.get(name) is not None), (None, "bfloat16"))
    if field is None:
        notes.append("no torch_dtype in the config: assuming bfloat16")
    elif not isinstance(dtype, str) or dtype.lower() not in WEIGHT_DTYPES:
        raise HarnessError(f"{source}: field '{field}' must name the weights' dtype (bfloat16, float16 or "
                           f"float32), got {dtype!r}")
    return ModelShape(
        name=name,
        revision=revision,
        source=source,
        model_type=str(config.get("model_type") or text.get("model_type") or "unknown"),
        dtype=str(dtype),
        layers=layers,
        max_position_embeddings=language.get("max_position_embeddings"),
        weights_bytes=weights[0],
        weights_source=weights[1],
        notes=notes,
        mtp_layers=mtp_layers(language, source),
        config=config,
    )


def mtp_layers(config: dict[str, Any], source: str) -> int:
    """Multi-token-prediction layers of a language config, under Qwen's name or DeepSeek's and GLM's."""
    for field in ("mtp_num_hidden_layers", "num_nextn_predict_layers"):
        if config.get(field):
            return stated_count(config, field, source) or 0
    return 0


def _weights(directory: Path) -> tuple[int | None, str | None]:
    """Checkpoint bytes: the index's declared total, else the sum of every safetensors header's tensors."""
    index_path = directory / INDEX_FILE
    if index_path.is_file():
        index = _read_json(index_path)
        try:
            return int(index["metadata"]["total_size"]), f"{INDEX_FILE} metadata.total_size"
        except (KeyError, TypeError, ValueError):
            raise HarnessError(f"{index_path}: field 'metadata.total_size' is missing or not a number") from None
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        return None, None
    return sum(_safetensors_data_bytes(f) for f in files), f"sum of {len(files)} safetensors header(s)"


def _safetensors_data_bytes(path: Path) -> int:
    """Tensor bytes declared by a safetensors header (an 8-byte length, then JSON), without reading data."""
    with path.open("rb") as handle:
        try:
            (length,) = struct.unpack("<Q", handle.read(8))
            header = json.loads(handle.read(length))
        except (struct.error, ValueError, MemoryError):
            raise HarnessError(f"{path}: not a safetensors file (unreadable header)") from None
    tensors = [value for key, value in header.items() if key != "__metadata__"]
    return sum(tensor["data_offsets"][1] - tensor["data_offsets"][0] for tensor in tensors)


def _snapshot_dir(model: str, revision: str) -> Path | None:
    candidate = SNAPSHOTS_DIR / model / revision
    return candidate if (candidate / "config.json").is_file() else None


def _bundled_names() -> list[str]:
    return sorted(f"{p.parent.parent.name}/{p.parent.name}@{p.name[:8]}" for p in SNAPSHOTS_DIR.glob("*/*/*")
                  if (p / "config.json").is_file())


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(read_bounded_bytes(path, MAX_CONFIG_BYTES, "JSON file").decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise HarnessError(f"{path}: not a JSON file ({error.__class__.__name__})") from None
    except RecursionError:  # nested deeper than any config
        raise HarnessError(f"{path}: not a config.json: nested too deep") from None
    if not isinstance(data, dict):
        raise HarnessError(f"{path}: expected a JSON object")
    return data

