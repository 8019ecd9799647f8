"""The before-launch waterfall beside what a start-up log says each term took.

A log that states its memory profile (V0 and 0.6 releases print the GPU's total and every term), a GPU
named by the user, or one a line of the log names is enough to run the before-launch model for the same start
and set each predicted term beside the logged one: the run then shows which term the prediction missed.
"""

from __future__ import annotations

from packaging.version import InvalidVersion, Version
from pydantic import BaseModel

from harness.errors import HarnessError
from harness.observe.memory_profile import logged_term_bytes
from harness.observe.server_logs import StartupCapacity
from harness.predict.encoder_launch import EncoderLaunch
from harness.predict.engine_launch import EngineLaunch
from harness.predict.fit_answer import gpu_total
from harness.predict.gpu_catalog import GpuMemory, gpu_memory
from harness.predict.kv_bytes import resolve_kv_dtype
from harness.predict.memory_model import FITTED_CONSTANTS, LORA_NOT_SIZED, Waterfall, plan_waterfall
from harness.predict.model_shape import ModelShape
from harness.predict.releases import PRODUCTION_ENGINE
from harness.predict.sampler_peak import sampler_of_start
from harness.predict.speculative import speculative_from_log
from harness.units import GiB


class WaterfallRow(BaseModel):
    name: str
    predicted_bytes: int
    logged_bytes: int | None
    source: str


class WaterfallComparison(BaseModel):
    total_bytes: int
    total_source: str
    gpu_memory_utilization: float | None  # None: the release's default, where no waterfall could say which
    rows: list[WaterfallRow]
    notes: list[str] = []  # why no rows, or what the rows leave out


def waterfall_beside_log(log: StartupCapacity, shape: ModelShape, gpu: str | None) -> WaterfallComparison | None:
    """None when neither the log nor the user gives the GPU's total memory. Without `gpu`, the GPU a line of the
    log names sets what depends on the part (a Hopper's non-torch figure, NVLS buffers, the batch defaults), and
    its catalogued total serves where the log states none."""
    profile = log.memory_profile
    logged_total = profile.components_bytes.get("total_gpu_memory_bytes") if profile else None
    if gpu is not None:
        total, total_source = gpu_total(gpu)
    elif logged_total:
        total, total_source = logged_total, "the GPU total the log states"
    elif (named := _logged_gpu(log)) is not None:
        total, total_source = int(named.total_gib * GiB), f"{named.name}, as the log names it: {named.source}"
    else:
        return None
    gpu_name = gpu or log.gpu_name
    stated = (profile.gpu_memory_utilization if profile and profile.gpu_memory_utilization else None) \
        or log.gpu_memory_utilization
    utilization = None if stated is None else float(stated)
    max_model_len = log.max_model_len or log.max_concurrency_model_len or shape.max_position_embeddings
    if max_model_len is None:
        return None
    try:
        waterfall = log_waterfall(
            log, shape, total_bytes=total, total_source=total_source, gpu_name=gpu_name, max_model_len=max_model_len,
            gpu_memory_utilization=utilization, quantization=log.quantization,
            tensor_parallel_size=log.tensor_parallel_size or 1, pipeline_parallel_size=log.pipeline_parallel_size or 1,
            max_num_batched_tokens=log.max_num_batched_tokens, max_num_seqs=log.max_num_seqs)
    except HarnessError as error:
        return WaterfallComparison(total_bytes=total, total_source=total_source,
                                   gpu_memory_utilization=utilization, rows=[], notes=[str(error)])
    logged = logged_term_bytes(log)
    rows = [WaterfallRow(name=term.name, predicted_bytes=term.bytes, logged_bytes=logged.get(term.name),
                         source=term.source) for term in waterfall.terms]
    rows.append(WaterfallRow(name="kv_memory", predicted_bytes=waterfall.kv_bytes,
                             logged_bytes=log.available_kv_cache_bytes, source="usable − the terms above"))
    notes = [] if logged_total or gpu is None else ["the log does not state the GPU's total: the given GPU is used"]
    if gpu is None and log.gpu_name is not None:
        notes.append(f"the GPU is {log.gpu_name}, as a line of the log names it (gpu_name_line; --gpu for another)")
    if log.lora_adapters_line is not None:
        notes.append(f"the engine serves {LORA_NOT_SIZED}: the predicted terms leave them out")
    return WaterfallComparison(total_bytes=total, total_source=total_source,
                               gpu_memory_utilization=waterfall.gpu_memory_utilization, rows=rows, notes=notes)


def _logged_gpu(log: StartupCapacity) -> GpuMemory | None:
    """The catalogue's entry for the GPU the log names, if it has one."""
    try:
        return gpu_memory(log.gpu_name) if log.gpu_name else None
    except HarnessError:
        return None


def logged_sampler(log: StartupCapacity) -> str | None:
    """The top-k/top-p sampler the log establishes (`sampler_of_start`); with a release it cannot name, only a line
    that names the sampler counts."""
    try:
        version = Version(log.engine_version or PRODUCTION_ENGINE)
    except InvalidVersion:
        return log.top_k_top_p_sampler
    return sampler_of_start(version, log.top_k_top_p_sampler, log.flashinfer_loaded_line is not None)


def log_waterfall(log: StartupCapacity, shape: ModelShape, *, total_bytes: int, total_source: str,
                  gpu_name: str | None, max_model_len: int, gpu_memory_utilization: float | None,
                  quantization: str | None,
                  tensor_parallel_size: int, pipeline_parallel_size: int, max_num_batched_tokens: int | None,
                  max_num_seqs: int | None, enforce_eager: bool = False) -> Waterfall:
    """The before-launch waterfall for the start a log shows, its shape served in the log's dtype. `harness
    capacity` reads the limits from the log's arguments and the drift check from the run's engine.json; what only
    the log says (the release, the engine, the sampler, the encoder's profile, a draft model, --enforce-eager, a
    CUDA-graph estimate switched off) is read here, once."""
    launch = EngineLaunch(
        engine_version=log.engine_version or PRODUCTION_ENGINE, engine_generation=log.engine_generation,
        max_model_len=max_model_len, gpu_memory_utilization=gpu_memory_utilization,
        dtype_bytes=resolve_kv_dtype("auto", shape.dtype)[1], quantization=quantization,
        tensor_parallel_size=tensor_parallel_size, pipeline_parallel_size=pipeline_parallel_size,
        max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs, sampler=logged_sampler(log),
        speculative=speculative_from_log(log.speculative_method, log.speculative_tokens),
        encoder=EncoderLaunch.from_arguments(log.non_default_args or {}),
        enforce_eager=bool(log.enforce_eager) or enforce_eager,
        graph_memory_profiled=not (log.memory_profile and log.memory_profile.graph_memory_profiled is False))
    return plan_waterfall(shape.config, FITTED_CONSTANTS, launch, total_bytes=total_bytes, total_source=total_source,
                          gpu_name=gpu_name, checkpoint=None if quantization else shape.checkpoint_weights,
                          config_source=shape.source)


def gib(value: int | None) -> str:
    return "—" if value is None else f"{value / GiB:.2f}"
