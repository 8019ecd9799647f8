"""Drift: the before-launch prediction for the engine a run started, against what that engine logged.

At record time the run knows everything the calculator needs before a launch: the served model's config,
the engine's limits (engine.json) and the device (device.json). The prediction made from those alone is
set beside the logged KV tokens; when the two differ by more than `DRIFT_THRESHOLD_SHARE`, the run is
qualified with the term most likely off, read from the terms the log states (weights, activation peak,
non-torch memory, CUDA graphs) — so a release that changes its accounting shows on its first run.
On the CPU engine the KV memory is given (`--kv-cache-memory-bytes`), so the check there is the
layer-aware KV bytes per token and the block arithmetic against the logged KV tokens.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from harness.errors import HarnessError
from harness.observe.capacity_waterfall import log_waterfall
from harness.observe.device import DeviceFacts
from harness.observe.memory_profile import logged_term_bytes
from harness.observe.server_logs import StartupCapacity
from harness.predict.memory_model import LORA_NOT_SIZED
from harness.predict.model_shape import ModelShape, load_model_shape
from harness.predict.pipeline import predict_pipeline_capacity
from harness.predict.releases import PRODUCTION_ENGINE
from harness.predict.speculative import speculative_from_log
from harness.units import GiB

DRIFT_THRESHOLD_SHARE = 0.02
KV_MEMORY = "kv_memory"
KV_BYTES_PER_TOKEN = "kv_bytes_per_token"  # the KV memory agreed, the tokens it holds did not
PART_EXPLAINED = 0.8  # a named term missing less of the KV memory gap than this leaves the rest to unstated terms
CUDA_BLOCK_SIZE, CPU_BLOCK_SIZE = 16, 128  # vLLM's default block sizes


class DriftTerm(BaseModel):
    """One term of the before-launch waterfall beside the log's figure for it (None: the log does not state it)."""

    model_config = ConfigDict(extra="forbid")

    name: str
    predicted_bytes: int
    logged_bytes: int | None
    subtracted: bool = True  # CUDA graphs before 0.21 are captured after the cache is sized: not subtracted


class DriftCheck(BaseModel):
    """The before-launch KV tokens against the logged ones, per term, and the qualification when they drift."""

    model_config = ConfigDict(extra="forbid")

    basis: str  # "gpu waterfall" (total × utilisation less each term) or "kv_cache_memory_bytes" (given)
    gpu_total_bytes: int | None
    kv_cache_tokens_predicted: int
    kv_cache_tokens_logged: int
    kv_cache_tokens_drift_share: float | None  # logged / predicted − 1; None when nothing was predicted
    threshold_share: float = DRIFT_THRESHOLD_SHARE
    terms: list[DriftTerm]
    term_off: str | None  # the term most likely off, when the drift is over the threshold and a stated term explains it
    unstated_terms: list[str]  # terms of the waterfall the log does not state
    qualification: str | None


def drift_for_run(log: StartupCapacity, limits: dict[str, Any], device: DeviceFacts | None) -> DriftCheck | str:
    """The check for a recorded engine: its model read from the limits' path (else the log's name)."""
    model = limits.get("model") or log.model
    if not isinstance(model, str):
        return "no drift check: neither the limits nor the log name the model"
    revision = limits.get("revision")
    try:
        shape = load_model_shape(model, revision if isinstance(revision, str) else log.model_revision)
    except HarnessError as error:
        return f"no drift check: the model could not be read here ({error})"
    return check_drift(log, shape, limits, device)


def check_drift(log: StartupCapacity, shape: ModelShape, limits: dict[str, Any],
                device: DeviceFacts | None) -> DriftCheck | str:
    """The check, or one line saying why it cannot be made for this run."""
    shape = shape.served_in(log.dtype)
    if not log.capacity_found or (log.kv_cache_tokens is None and log.num_gpu_blocks is None):
        return "no drift check: the log states neither KV tokens nor blocks"
    if log.lora_adapters_line is not None:
        return f"no drift check: the engine serves {LORA_NOT_SIZED}, as its line says: {log.lora_adapters_line!r}"
    max_model_len = _int(limits.get("max_model_len")) or shape.max_position_embeddings
    if max_model_len is None:
        return "no drift check: neither the limits nor the config give max_model_len"
    given_kv = _int(limits.get("kv_cache_memory_bytes"))
    on_gpu = device is not None and device.gpu_name is not None
    tp, pp = _int(limits.get("tensor_parallel_size")) or 1, _int(limits.get("pipeline_parallel_size")) or 1
    logged = logged_term_bytes(log)
    block_size = _int(limits.get("block_size")) or (CUDA_BLOCK_SIZE if on_gpu else CPU_BLOCK_SIZE)
    try:
        speculative = speculative_from_log(log.speculative_method, log.speculative_tokens)
        if given_kv is not None:
            terms = [DriftTerm(name=KV_MEMORY, predicted_bytes=given_kv, logged_bytes=_logged_kv(log))]
            basis, total, stages = "kv_cache_memory_bytes", None, [given_kv] * pp
        elif on_gpu and device is not None and device.gpu_memory_total_bytes:
            total = device.gpu_memory_total_bytes // (device.gpu_count or 1)
            stages, terms = _gpu_waterfall(log, shape, limits, total, device.gpu_name, max_model_len, tp, pp, logged)
            basis = "gpu waterfall"
        else:
            return "no drift check: no GPU memory total (device.json) and no kv_cache_memory_bytes limit"
        prediction = predict_pipeline_capacity(
            shape, [max(0, stage) for stage in stages], block_size=block_size, max_model_len=max_model_len,
            kv_cache_dtype=str(limits.get("kv_cache_dtype") or "auto"), tensor_parallel_size=tp,
            max_num_batched_tokens=_int(limits.get("max_num_batched_tokens")),
            engine_version=log.engine_version or PRODUCTION_ENGINE, engine_generation=log.engine_generation,
            available_kv_source=basis, speculative=speculative,
            decode_context_parallel_size=log.decode_context_parallel_size or 1)
    except HarnessError as error:  # a layout the calculator does not model: the run stands, unchecked
        return f"no drift check: {error}"
    logged_tokens = log.kv_cache_tokens or (log.num_gpu_blocks or 0) * prediction.block_size  # V0 logs blocks
    return judge(basis, total, prediction.kv_cache_tokens, logged_tokens, terms)


def judge(basis: str, total: int | None, predicted: int, logged: int, terms: list[DriftTerm]) -> DriftCheck:
    """Over the threshold, the stated term whose miss leans the way the tokens drifted, by the most bytes."""
    drift = logged / predicted - 1 if predicted else None  # None: the prediction left no cache at all
    unstated = [term.name for term in terms if term.logged_bytes is None and term.subtracted]
    term_off, qualification = None, None
    if drift is None or abs(drift) > DRIFT_THRESHOLD_SHARE:
        term_off = _term_off(terms, 1.0 if drift is None else drift)
        head = (f"KV tokens drift {drift:+.1%} from the before-launch prediction ({predicted:,} predicted, "
                f"{logged:,} logged; threshold ±{DRIFT_THRESHOLD_SHARE:.0%})" if drift is not None else
                f"the before-launch prediction leaves no KV cache, the engine logged {logged:,} tokens")
        qualification = f"{head}: {_blame(term_off, terms, unstated)}"
    return DriftCheck(basis=basis, gpu_total_bytes=total, kv_cache_tokens_predicted=predicted,
                      kv_cache_tokens_logged=logged, kv_cache_tokens_drift_share=None if drift is None
                      else round(drift, 6), terms=terms, term_off=term_off, unstated_terms=unstated,
                      qualification=qualification)


def _term_off(terms: list[DriftTerm], drift: float) -> str | None:
    """More tokens logged than predicted means a subtracted term was predicted too large (and the other way);
    the KV memory itself agreeing within the threshold puts the miss in the bytes per token."""
    kv = next((term for term in terms if term.name == KV_MEMORY), None)
    if kv is not None and kv.logged_bytes is not None and kv.predicted_bytes > 0 \
            and abs(kv.logged_bytes / kv.predicted_bytes - 1) <= DRIFT_THRESHOLD_SHARE:
        return KV_BYTES_PER_TOKEN
    sign = 1 if drift > 0 else -1
    leaning = [(sign * (term.predicted_bytes - term.logged_bytes), term.name) for term in terms
               if term.name != KV_MEMORY and term.subtracted and term.logged_bytes is not None]
    leaning = [(gap, name) for gap, name in leaning if gap > GiB // 200]  # beyond a two-decimal GiB print
    return max(leaning)[1] if leaning else None


def _blame(term_off: str | None, terms: list[DriftTerm], unstated: list[str]) -> str:
    by_name = {term.name: term for term in terms}
    kv = by_name.get(KV_MEMORY)
    missing = [name for name in unstated if name != KV_MEMORY]
    if term_off == KV_BYTES_PER_TOKEN and kv is not None:
        return (f"the KV memory agrees ({_gib(kv.predicted_bytes)} predicted, {_gib(kv.logged_bytes)} logged), "
                "so the KV bytes per token or the block arithmetic is most likely off")
    if term_off is not None:
        return _named(by_name[term_off], kv, missing)
    if missing:
        return f"the log does not state {', '.join(missing)}: the term off is among them, or the GPU's total"
    return "every stated term agrees: the GPU's total or the utilisation is most likely off"


def _named(term: DriftTerm, kv: DriftTerm | None, missing: list[str]) -> str:
    """The term off; where it misses less than most of the KV memory gap, the unstated terms hold the rest."""
    named = f"{term.name} most likely off ({_gib(term.predicted_bytes)} predicted, {_gib(term.logged_bytes)} logged)"
    if kv is None or kv.logged_bytes is None or not missing:
        return named
    gap, share = abs(kv.logged_bytes - kv.predicted_bytes), abs(term.predicted_bytes - (term.logged_bytes or 0))
    if share >= PART_EXPLAINED * gap:
        return named
    return (f"{named}, which accounts for {_gib(share)} of the {_gib(gap)} KV memory gap; the rest lies in what "
            f"the log does not state ({', '.join(missing)})")


def _gpu_waterfall(log: StartupCapacity, shape: ModelShape, limits: dict[str, Any], total: int, gpu_name: str | None,
                   max_model_len: int, tp: int, pp: int, logged: dict[str, int]) -> tuple[list[int], list[DriftTerm]]:
    """Each stage's KV bytes and the terms, as `harness budget --gpu` computes them, from the limits and device."""
    quantization = limits.get("quantization")
    waterfall = log_waterfall(
        log, shape, total_bytes=total, total_source="device.json", gpu_name=gpu_name, max_model_len=max_model_len,
        gpu_memory_utilization=_float(limits.get("gpu_memory_utilization")),
        quantization=quantization if isinstance(quantization, str) else None, tensor_parallel_size=tp,
        pipeline_parallel_size=pp, max_num_batched_tokens=_int(limits.get("max_num_batched_tokens")),
        max_num_seqs=_int(limits.get("max_num_seqs")), enforce_eager=limits.get("enforce_eager") is True)
    terms = [DriftTerm(name=term.name, predicted_bytes=term.bytes, logged_bytes=logged.get(term.name),
                       subtracted=term.subtracted) for term in waterfall.terms]
    # the log's headline is its smallest rank's figure: the stage with the least memory is the one to compare
    terms.append(DriftTerm(name=KV_MEMORY, predicted_bytes=min(waterfall.stage_kv_bytes), logged_bytes=_logged_kv(log)))
    return waterfall.stage_kv_bytes, terms


def _logged_kv(log: StartupCapacity) -> int | None:
    """The KV memory the log states: profiled, else the reservation (exact from its arguments), else the CPU's."""
    if log.available_kv_cache_bytes is not None:
        return log.available_kv_cache_bytes
    if log.kv_cache_memory_bytes is not None:
        return log.kv_cache_memory_bytes
    return None if log.cpu_kv_space is None else round(log.cpu_kv_space.kv_cache_gib * GiB)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _float(value: Any) -> float | None:
    """A stated share; None leaves the release's default."""
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _gib(value: int | None) -> str:
    return "—" if value is None else f"{value / GiB:.2f} GiB"
