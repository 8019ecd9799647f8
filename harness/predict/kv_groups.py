"""How vLLM lays a hybrid's layers into one block pool: groups of equal size, one page per block, and an
attention block raised until its page holds a state layer's whole state (kv_cache_utils.py, the hybrid
allocator's grouping; interface.py "Setting attention block size to … tokens")."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable

from packaging.version import Version

from harness.errors import HarnessError
from harness.predict.model_shape import LayerKind, LayerSpec
from harness.predict.releases import UNIFIED_PAGES_SINCE, WIDE_GROUP_PADDING_SINCE

STATE_BLOCK_ALIGNMENT = 16  # attention block sizes are raised in multiples of this to hold one state page


def block_groups(
    model_name: str,
    layers: list[LayerSpec],
    version: Version,
    page: Callable[[LayerSpec], int],
    blocks_per_request: Callable[[LayerSpec], int],
    assumptions: list[str],
) -> tuple[int, int, int]:
    """(KV cache groups, bytes per block, blocks per request) as vLLM groups the layers into one block pool."""
    kinds = Counter(layer.kind for layer in layers)
    if len(kinds) == 1:  # one group holding every layer, pages summed (vLLM's uniform-type case)
        return 1, sum(page(layer) for layer in layers), blocks_per_request(layers[0])
    pages = {page(layer) for layer in layers}
    if len(pages) > 1:
        raise HarnessError(f"{model_name}: hybrid layers with different page sizes {sorted(pages)} are not modelled")
    sizes = Counter((layer.kind, layer.window_tokens) for layer in layers)
    group_size = min(sizes.values())
    if max(sizes.values()) < group_size * (1.5 if version >= WIDE_GROUP_PADDING_SINCE else 1.25):
        group_size = max(sizes.values())
    groups_by_kind = {key: math.ceil(count / group_size) for key, count in sizes.items()}
    groups = sum(groups_by_kind.values())
    representative = {(layer.kind, layer.window_tokens): layer for layer in layers}
    per_request = sum(blocks_per_request(representative[key]) * n for key, n in groups_by_kind.items())
    assumptions.append(f"hybrid KV cache: {groups} groups of {group_size} layers sharing one block pool")
    return groups, pages.pop() * group_size, per_request


def attention_block_sizes(
    layers: list[LayerSpec], block_size: int, bytes_per_token: Callable[[LayerSpec], int], version: Version,
    assumptions: list[str],
) -> dict[LayerSpec, int]:
    """Each attention layer's block size. Where a hybrid's attention layers hold pages of different sizes (Gemma 4's
    full layers, with their own heads), vLLM from 0.12 multiplies each smaller page's block size until its page
    is the largest (kv_cache_utils.py `unify_kv_cache_spec_page_size`); a page that does not divide the largest,
    or a release before 0.12, keeps its size, and `block_groups` refuses the layout."""
    attention = {layer for layer in layers if layer.kind is not LayerKind.STATE}
    pages = {layer: block_size * bytes_per_token(layer) for layer in attention}
    largest = max(pages.values(), default=0)
    sizes = dict.fromkeys(attention, block_size)
    if len(Counter(layer.kind for layer in layers)) == 1 or version < UNIFIED_PAGES_SINCE:
        return sizes  # one kind is one group whatever its pages (vLLM's uniform-type case)
    for layer, page in pages.items():
        if page and page != largest and largest % page == 0:
            sizes[layer] = block_size * (largest // page)
            assumptions.append(f"{layer.kind.value} layers' block size raised from {block_size} to {sizes[layer]} "
                               "tokens so their page matches the largest")
    return sizes


def state_blocks_per_request(
    layers: list[LayerSpec], prefix_caching: bool, speculative_tokens: int, assumptions: list[str]
) -> int:
    """Blocks one request holds in a state group, as vLLM's MambaSpec.max_memory_usage_bytes counts them
    (vllm/v1/kv_cache_interface.py at 001cabc1): one, two when prefix caching keeps an aligned copy (its
    'align' mode), plus one per speculative token."""
    blocks = (2 if prefix_caching else 1) + speculative_tokens
    if any(layer.kind is LayerKind.STATE for layer in layers) and blocks > 1:
        assumptions.append(f"{blocks} state blocks per request in each state group"
                           + (" (prefix caching)" if prefix_caching else ""))
    return blocks


def state_block_size(
    layers: list[LayerSpec], bytes_per_token: Callable[[LayerSpec], int], block_size: int,
    state_bytes: Callable[[LayerSpec], int], assumptions: list[str],
) -> int:
    """vLLM raises the attention block size of Mamba hybrids until one attention page holds one state."""
    states = [state_bytes(x) for x in layers if x.kind is LayerKind.STATE]
    per_token = [bytes_per_token(x) for x in layers if x.kind is not LayerKind.STATE]
    if not states or not per_token:
        return block_size
    needed = STATE_BLOCK_ALIGNMENT * math.ceil(max(states) / (STATE_BLOCK_ALIGNMENT * max(per_token)))
    if needed > block_size:
        assumptions.append(f"block size raised from {block_size} to {needed} so one attention page holds a state")
        return needed
    return block_size
