"""The before-launch memory model, term by term, against figures worked out by hand from vLLM's source."""

from __future__ import annotations

from packaging.version import Version

from harness.budget import GiB
from harness.memory_model import profiling_batch


def test_v1_profiles_the_large_gpu_defaults_but_not_on_an_a100():
    # vllm/engine/arg_utils.py `_set_default_args_v1`: an API server on a GPU of 70 GiB or more gets
    # 8,192 batched tokens and 1,024 sequences; from 0.9.0 a device named "a100" keeps 2,048 and 256.
    h100, a100 = int(79.22 * GiB), int(79.25 * GiB)
    assert profiling_batch(Version("0.10.1.1"), False, h100, 16384, None, None, "H100-80GB")[:2] == (8192, 1024)
    assert profiling_batch(Version("0.10.1.1"), False, a100, 16384, None, None, "A100-80GB")[:2] == (2048, 256)
    # 0.8.5 has no A100 check: the 80 GB card gets the large defaults too.
    assert profiling_batch(Version("0.8.5"), False, a100, 16384, None, None, "A100-80GB")[:2] == (8192, 1024)
    # A 24 GiB card is below 70 GiB whatever its name.
    assert profiling_batch(Version("0.10.1.1"), False, int(22.18 * GiB), 8192, None, None, "A10-24GB")[:2] \
        == (2048, 256)


def test_v0_profiles_max_model_len_tokens_without_chunked_prefill():
    # V0 without chunked prefill: max_num_batched_tokens = max(max_model_len, 2048), max_num_seqs 256;
    # above 32,768 tokens of context V0 turns chunked prefill on with 512-token batches.
    assert profiling_batch(Version("0.7.3"), True, 8 * GiB, 32768, None, None)[:2] == (32768, 256)
    assert profiling_batch(Version("0.7.3"), True, 8 * GiB, 1024, None, None)[:2] == (2048, 256)
    assert profiling_batch(Version("0.7.3"), True, 8 * GiB, 131072, None, None)[:2] == (512, 256)
