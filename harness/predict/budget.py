"""KV-cache and weight budget: bytes for a live-token population, and what vLLM makes of a KV budget.

Two directions, both per GPU (tensor-parallel rank):
- forward: N sequences of T tokens (prompt + generated) → raw and block-padded KV bytes, + weights;
- inverse: an available-KV-memory figure (as vLLM logs it) → blocks, tokens and maximum concurrency,
  computed the way vLLM's KV cache manager does, so that it equals the engine's own log line.
Every choice that is not forced by the inputs is written to `assumptions`.
"""

from __future__ import annotations

import functools
import math
from collections import Counter

from packaging.version import Version
from pydantic import BaseModel

from harness.errors import HarnessError
from harness.predict.architectures import MAX_TOKENS
from harness.predict.kv_bytes import (
    KvFormat,
    check_attention_heads,
    kv_format,
    layer_bytes_per_token,
    layer_state_bytes,
    resolve_kv_dtype,
)
from harness.predict.kv_groups import attention_block_sizes, block_groups, state_block_size, state_blocks_per_request
from harness.predict.model_shape import LayerKind, LayerSpec, ModelShape
from harness.predict.releases import DERIVED_TOKENS_SINCE, engine_release, runs_v0
from harness.predict.speculative import SpeculativeDecoding, draft_layers
from harness.predict.weight_formats import checkpoint_kv_dtype

SCHEMA_VERSION = 1
DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048  # vLLM's API-server default on most GPUs; sizes sliding windows
# vLLM's --block-size choices: `BlockSize = Literal[1, 8, 16, 32, 64, 128, 256]` in vllm/config/cache.py (0.11.x)
BLOCK_SIZES = (1, 8, 16, 32, 64, 128, 256)
# Sane bounds on what may be asked: beyond them the arithmetic overflows, or answers with figures no GPU reaches.
MAX_SEQUENCES = 2**20  # live sequences, beyond any engine's max_num_seqs
MAX_TENSOR_PARALLEL_SIZE = 1024  # GPUs one model is split over
MAX_MEMORY_GIB = 2**20  # memory per GPU (1 PiB)


class Population(BaseModel):
    """The live tokens: one entry per sequence, prompt and generated tokens together."""

    sequence_tokens: list[int]
    shared_prefix_tokens: int = 0

    @classmethod
    def uniform(cls, sequences: int, tokens: int, shared_prefix_tokens: int = 0) -> Population:
        if not 0 < sequences <= MAX_SEQUENCES:
            raise HarnessError(f"sequences must be a positive count up to {MAX_SEQUENCES:,}, got {sequences}")
        return cls(sequence_tokens=[tokens] * sequences, shared_prefix_tokens=shared_prefix_tokens)

    def validated(self) -> Population:
        if not self.sequence_tokens:
            raise HarnessError("the population is empty: give at least one sequence length")
        bad = [t for t in self.sequence_tokens if t <= 0]
        if bad:
            raise HarnessError(f"tokens per sequence must be positive, got {bad[0]}")
        if len(self.sequence_tokens) > MAX_SEQUENCES:
            raise HarnessError(f"{len(self.sequence_tokens):,} sequences: at most {MAX_SEQUENCES:,} live sequences")
        if sum(self.sequence_tokens) > MAX_TOKENS:
            raise HarnessError(f"a population of {sum(self.sequence_tokens):,} tokens: at most {MAX_TOKENS:,} (2^40)")
        if not 0 <= self.shared_prefix_tokens <= min(self.sequence_tokens):
            raise HarnessError(
                f"shared_prefix_tokens must be between 0 and the shortest sequence "
                f"({min(self.sequence_tokens)}), got {self.shared_prefix_tokens}"
            )
        return self


class KindBudget(BaseModel):
    kind: LayerKind
    layers: int
    kv_bytes_per_token: int
    state_bytes_per_sequence: int


class SequenceBudget(BaseModel):
    tokens: int
    count: int
    kv_bytes_raw: int
    kv_bytes_padded: int


class CapacityPrediction(BaseModel):
    available_kv_bytes: int
    available_kv_source: str
    block_size: int
    bytes_per_block: int
    kv_cache_groups: int
    num_blocks: int
    kv_cache_tokens: int
    max_model_len: int
    blocks_per_request: int
    max_concurrency: float
    whole_sequences_at_max_model_len: int
    engine_version: str
    assumptions: list[str]


class BudgetResult(BaseModel):
    schema_version: int = SCHEMA_VERSION
    model: str
    revision: str | None
    model_source: str
    kv_cache_dtype: str
    kv_bytes_per_element: int
    tensor_parallel_size: int
    block_size: int
    hybrid_kv_manager: bool
    kinds: list[KindBudget]
    kv_bytes_per_token: int
    sequences: list[SequenceBudget]
    shared_prefix_tokens: int
    population_sequences: int
    population_tokens: int
    population_kv_bytes_raw: int
    population_kv_bytes_padded: int
    weights_bytes: int | None
    weights_source: str | None
    weights_plus_kv_bytes: int | None
    capacity: CapacityPrediction | None = None
    assumptions: list[str]
    warnings: list[str] = []


def estimate_budget(
    shape: ModelShape,
    population: Population,
    *,
    kv_cache_dtype: str = "auto",
    tensor_parallel_size: int = 1,
    block_size: int = 16,
    hybrid_kv_manager: bool = True,
    engine_version: str | None = None,
) -> BudgetResult:
    """KV bytes a live-token population holds on one rank, raw and padded to whole blocks of each layer's size as
    the release sets it (a Mamba hybrid's raised attention blocks, the larger block of a smaller page)."""
    population = population.validated()
    _check_positive(tensor_parallel_size=tensor_parallel_size, block_size=block_size)
    check_attention_heads(shape.config, tensor_parallel_size)
    version = engine_release(engine_version)
    cache = kv_format(kv_cache_dtype, checkpoint_kv_dtype(shape.config) or shape.dtype, version)
    model_element = resolve_kv_dtype("auto", shape.dtype)[1]
    layers = _effective_layers(shape.layers, hybrid_kv_manager)
    per_token_of = functools.partial(layer_bytes_per_token, cache=cache, tensor_parallel_size=tensor_parallel_size)
    state_of = functools.partial(layer_state_bytes, model_element_bytes=model_element,
                                 tensor_parallel_size=tensor_parallel_size)
    token_bytes, state_bytes = [per_token_of(x) for x in layers], [state_of(x) for x in layers]
    block_notes: list[str] = []
    block_size = state_block_size(layers, per_token_of, block_size, state_of, block_notes)
    layer_block = attention_block_sizes(layers, block_size, per_token_of, version, block_notes)
    state_page = block_size * max(token_bytes)  # a state block is padded to one attention page, where there is one
    sequences = []
    for tokens, count in sorted(Counter(population.sequence_tokens).items()):
        raw = padded = 0
        for layer, per_token, state in zip(layers, token_bytes, state_bytes, strict=True):
            if layer.kind is LayerKind.STATE:
                raw, padded = raw + state, padded + max(state, state_page)
                continue
            held_tokens, held_blocks = _held(layer, tokens, layer_block[layer])
            raw += held_tokens * per_token
            padded += held_blocks * layer_block[layer] * per_token
        sequences.append(SequenceBudget(tokens=tokens, count=count, kv_bytes_raw=raw, kv_bytes_padded=padded))
    shared_raw, shared_padded = _shared_prefix_savings(layers, token_bytes, population, layer_block)
    population_raw = sum(s.kv_bytes_raw * s.count for s in sequences) - shared_raw
    population_padded = sum(s.kv_bytes_padded * s.count for s in sequences) - shared_padded
    weights = None if shape.weights_bytes is None else math.ceil(shape.weights_bytes / tensor_parallel_size)
    return BudgetResult(
        model=shape.name,
        revision=shape.revision,
        model_source=shape.source,
        kv_cache_dtype=cache.name,
        kv_bytes_per_element=cache.element_bytes,
        tensor_parallel_size=tensor_parallel_size,
        block_size=block_size,
        hybrid_kv_manager=hybrid_kv_manager,
        kinds=_kinds(layers, token_bytes, state_bytes),
        kv_bytes_per_token=sum(token_bytes),
        sequences=sequences,
        shared_prefix_tokens=population.shared_prefix_tokens,
        population_sequences=len(population.sequence_tokens),
        population_tokens=sum(population.sequence_tokens),
        population_kv_bytes_raw=population_raw,
        population_kv_bytes_padded=population_padded,
        weights_bytes=weights,
        weights_source=shape.weights_source,
        weights_plus_kv_bytes=None if weights is None else weights + population_padded,
        assumptions=[
            *shape.notes,
            *_budget_assumptions(shape, cache.name, kv_cache_dtype, tensor_parallel_size, hybrid_kv_manager,
                                 population),
            *block_notes,
        ],
    )


def available_kv_bytes_from_gpu(gpu_memory_bytes: int, gpu_memory_utilization: float, non_kv_bytes: int) -> int:
    """vLLM's budget: total × utilisation − (weights + activation peak + non-torch memory)."""
    if not 0 < gpu_memory_utilization <= 1:
        raise HarnessError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
    return max(0, int(gpu_memory_bytes * gpu_memory_utilization) - non_kv_bytes)


def predict_capacity(
    shape: ModelShape,
    *,
    available_kv_bytes: int,
    block_size: int,
    max_model_len: int,
    kv_cache_dtype: str = "auto",
    tensor_parallel_size: int = 1,
    max_num_batched_tokens: int | None = None,
    engine_version: str | None = None,
    hybrid_kv_manager: bool = True,
    available_kv_source: str = "given",
    engine_generation: str | None = None,
    speculative: SpeculativeDecoding | None = None,
    prefix_caching: bool = False,
    holds_drafter: bool = True,
    decode_context_parallel_size: int = 1,
) -> CapacityPrediction:
    """Blocks, tokens and maximum concurrency as vLLM computes and logs them at start-up.

    The V0 engine (every release before 0.8, and 0.8-0.10 when V1 is switched off) logs its block
    count and a concurrency of blocks × block_size / max_model_len, with no whole-block rounding.
    A drafter (`speculative`) caches its layers too (`speculative.py`) on the GPU that `holds_drafter` (with
    pipeline parallelism only the last stage does) and widens a hybrid's state on every GPU; prefix caching
    keeps a second state block per request in each state group. Decode context parallelism spreads each
    sequence over `decode_context_parallel_size` ranks: a request needs blocks for 1/dcp of max_model_len
    (kv_cache_interface.py `max_memory_usage_bytes`) and the logged tokens are the blocks' × dcp.
    """
    _check_positive(block_size=block_size, max_model_len=max_model_len, tensor_parallel_size=tensor_parallel_size,
                    decode_context_parallel_size=decode_context_parallel_size)
    if available_kv_bytes < 0:
        raise HarnessError(f"available KV memory must not be negative, got {available_kv_bytes} bytes")
    version = engine_release(engine_version)
    assumptions = [f"grouping and log rules of vLLM {version}"]
    cache = _cache_format(shape, kv_cache_dtype, version, assumptions)
    model_element = resolve_kv_dtype("auto", shape.dtype)[1]
    drafter = draft_layers(speculative, shape, assumptions) if holds_drafter else []
    layers = _effective_layers(shape.layers, hybrid_kv_manager) + drafter
    speculative_tokens = speculative.num_speculative_tokens if speculative else 0

    def state_bytes(layer: LayerSpec) -> int:
        return layer_state_bytes(layer, model_element, tensor_parallel_size, speculative_tokens)

    token_bytes = functools.partial(layer_bytes_per_token, cache=cache, tensor_parallel_size=tensor_parallel_size)
    block_size = state_block_size(layers, token_bytes, block_size, state_bytes, assumptions)
    state_blocks = state_blocks_per_request(layers, prefix_caching, speculative_tokens, assumptions)
    batched = max_num_batched_tokens or DEFAULT_MAX_NUM_BATCHED_TOKENS
    if max_num_batched_tokens is None and any(layer.kind is LayerKind.SLIDING_WINDOW for layer in layers):
        assumptions.append(f"max_num_batched_tokens {batched} (sizes sliding-window blocks per request)")

    layer_block = attention_block_sizes(layers, block_size, token_bytes, version, assumptions)

    def page(layer: LayerSpec) -> int:
        if layer.kind is LayerKind.STATE:  # padded to one attention page, if there is attention
            return block_size * max(token_bytes(x) for x in layers) or state_bytes(layer)
        return layer_block[layer] * token_bytes(layer)

    def blocks_per_request(layer: LayerSpec) -> int:
        if layer.kind is LayerKind.STATE:
            return state_blocks
        if layer.kind is LayerKind.SLIDING_WINDOW:
            return math.ceil(min(layer.window - 1 + batched, max_model_len) / layer_block[layer]) + 1
        return math.ceil(math.ceil(max_model_len / decode_context_parallel_size) / layer_block[layer])

    groups, bytes_per_block, per_request = block_groups(
        shape.name, layers, version, page, blocks_per_request, assumptions
    )
    num_blocks = available_kv_bytes // bytes_per_block if bytes_per_block else 0
    max_concurrency = num_blocks / per_request
    v0 = runs_v0(version, engine_generation)
    if v0:
        assumptions.append("V0 engine: concurrency = blocks × block_size / max_model_len")
        max_concurrency = num_blocks * block_size / max_model_len
    tokens = (int(max_concurrency * max_model_len) if version >= DERIVED_TOKENS_SINCE
              else num_blocks // groups * block_size * decode_context_parallel_size)
    assumptions += _context_parallel_notes(decode_context_parallel_size)
    return CapacityPrediction(
        available_kv_bytes=available_kv_bytes,
        available_kv_source=available_kv_source,
        block_size=block_size,
        bytes_per_block=bytes_per_block,
        kv_cache_groups=groups,
        num_blocks=num_blocks,
        kv_cache_tokens=tokens,
        max_model_len=max_model_len,
        blocks_per_request=per_request,
        max_concurrency=max_concurrency,
        whole_sequences_at_max_model_len=max(0, num_blocks - 1) // per_request,
        engine_version=str(version),
        assumptions=assumptions,
    )


def _context_parallel_notes(decode_context_parallel_size: int) -> list[str]:
    if decode_context_parallel_size == 1:
        return []
    return [f"decode context parallelism over {decode_context_parallel_size} ranks: each keeps 1/dcp of every "
            "sequence's cache, and the logged tokens are its blocks' × dcp"]


def _effective_layers(layers: list[LayerSpec], hybrid_kv_manager: bool) -> list[LayerSpec]:
    """Without the hybrid KV manager vLLM gives sliding-window layers full-length caches."""
    if hybrid_kv_manager:
        return layers
    return [
        layer.model_copy(update={"kind": LayerKind.FULL_ATTENTION, "window_tokens": None})
        if layer.kind is LayerKind.SLIDING_WINDOW
        else layer
        for layer in layers
    ]


def _held(layer: LayerSpec, tokens: int, block_size: int) -> tuple[int, int]:
    """(tokens, blocks) one layer keeps for a sequence; a window frees blocks that fall out of it."""
    blocks = math.ceil(tokens / block_size)
    if layer.kind is LayerKind.SLIDING_WINDOW:
        window_blocks = math.ceil((layer.window - 1) / block_size) + 1
        return min(tokens, layer.window), min(blocks, window_blocks)
    if layer.kind is LayerKind.STATE:
        return 0, 0
    return tokens, blocks


def _shared_prefix_savings(
    layers: list[LayerSpec], token_bytes: list[int], population: Population, layer_block: dict[LayerSpec, int]
) -> tuple[int, int]:
    """Bytes not stored twice when every sequence starts with the same cached prefix: only whole blocks of the
    full-attention layers are shared."""
    copies = len(population.sequence_tokens) - 1
    prefix = population.shared_prefix_tokens
    if copies <= 0 or prefix == 0:
        return 0, 0
    full = [(layer_block[layer], per_token) for layer, per_token in zip(layers, token_bytes, strict=True)
            if layer.kind in (LayerKind.FULL_ATTENTION, LayerKind.MLA)]
    raw = sum(per_token for _, per_token in full) * prefix
    padded = sum(prefix // block * block * per_token for block, per_token in full)
    return copies * raw, copies * padded


def _kinds(layers: list[LayerSpec], token_bytes: list[int], state_bytes: list[int]) -> list[KindBudget]:
    kinds: dict[LayerKind, KindBudget] = {}
    for layer, per_token, state in zip(layers, token_bytes, state_bytes, strict=True):
        entry = kinds.setdefault(layer.kind, KindBudget(kind=layer.kind, layers=0, kv_bytes_per_token=0,
                                                        state_bytes_per_sequence=0))
        entry.layers += 1
        entry.kv_bytes_per_token += per_token
        entry.state_bytes_per_sequence += state
    return list(kinds.values())


def _cache_format(shape: ModelShape, kv_cache_dtype: str, version: Version, assumptions: list[str]) -> KvFormat:
    """How the cache stores its values; `auto` follows the checkpoint's own KV scheme where it states one."""
    checkpoint = checkpoint_kv_dtype(shape.config)
    cache = kv_format(kv_cache_dtype, checkpoint or shape.dtype, version)
    if kv_cache_dtype.lower() == "auto" and checkpoint:
        assumptions.append(f"KV cache {cache.name}: auto follows the checkpoint's kv_cache_scheme")
    return cache


def _budget_assumptions(
    shape: ModelShape, dtype: str, requested: str, tensor_parallel_size: int, hybrid: bool, population: Population
) -> list[str]:
    kinds = shape.layer_counts()
    auto_source = "the checkpoint's kv_cache_scheme" if checkpoint_kv_dtype(shape.config) else "the model's dtype"
    notes = [f"KV cache dtype {dtype}" + (f" (auto: {auto_source})" if requested.lower() == "auto" else "")]
    notes.append("figures are per GPU: one tensor-parallel rank" + (
        f"; weights split evenly over {tensor_parallel_size} ranks" if tensor_parallel_size > 1 else ""
    ))
    notes.append("raw = tokens × bytes per token; padded = whole blocks per sequence, as vLLM allocates")
    if LayerKind.SLIDING_WINDOW in kinds:
        notes.append(
            "sliding-window layers hold at most their window (hybrid KV manager)" if hybrid
            else "sliding-window layers hold the whole sequence (hybrid KV manager disabled)"
        )
    if LayerKind.STATE in kinds:
        notes.append("state layers: one fixed state per sequence in the model's dtype (a recurrent state in the "
                     "config's mamba_ssm_dtype where it names one), split over ranks")
    if population.shared_prefix_tokens:
        notes.append("shared prefix stored once (prefix caching), whole blocks only, attention layers only")
    if shape.weights_bytes is None:
        notes.append("weights unknown: no safetensors index or files for this model")
    notes.append("not included: activations, CUDA graphs, the CUDA context and fragmentation")
    return notes


def _check_positive(**values: int) -> None:
    for name, value in values.items():
        if value <= 0:
            raise HarnessError(f"{name} must be positive, got {value}")
