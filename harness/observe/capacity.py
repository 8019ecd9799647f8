"""Set the capacity an engine logged beside what /metrics says and what the calculator predicts.

The three sources answer the same question differently: the log prints tokens and concurrency rounded
for people, /metrics' cache_config_info carries the block count and exact figures, and the calculator
derives both from the model's shape and the KV memory the engine had. Where two of them disagree, the
report says so; where the prediction misses the log, the residual shows by how much.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from packaging.version import Version

from harness.errors import HarnessError
from harness.observe.capacity_options import LogOverrides, check_given
from harness.observe.capacity_report import (
    CapacityReport,
    ComparedFigure,
    CrossCheck,
    PredictionInputs,
    shown_figure,
)
from harness.observe.capacity_waterfall import WaterfallComparison, waterfall_beside_log
from harness.observe.log_lines import fetch_polyaxon_run_log, read_log_text, read_run_log
from harness.observe.server_logs import StartupCapacity, parse_startup_log
from harness.observe.server_metrics import MetricsSnapshot, fetch_metrics_text, label_count, parse_metrics
from harness.predict.budget import CapacityPrediction
from harness.predict.model_shape import ModelShape, load_model_shape
from harness.predict.pipeline import predict_pipeline_capacity, stage_memory
from harness.predict.releases import release_version
from harness.predict.speculative import speculative_from_log
from harness.redact import refuse_url_credentials
from harness.server_url import checked_server_url
from harness.units import GiB

# vLLM's default block size when nothing says otherwise: 16 tokens on CUDA, 128 on the CPU build.
DEFAULT_BLOCK_SIZE = {"CPU": 128}
CUDA_BLOCK_SIZE = 16
CPU_BLOCK_WITHOUT_IPEX = 16  # before 0.12 the CPU build's default without intel_extension_for_pytorch
CPU_BLOCK_SET_SINCE = Version("0.12")
# A GiB figure printed with two decimals is known to within half a hundredth of a GiB.
GIB_PRINT_HALF_STEP_BYTES = GiB // 200


def capacity_from_sources(
    *,
    log: str | None = None,
    run_dir: Path | None = None,
    polyaxon_run: str | None = None,
    project: str | None = None,
    metrics: str | None = None,
    model: str | None = None,
    revision: str | None = None,
    gpu: str | None = None,
    stated: LogOverrides | None = None,
    start: int | None = None,
) -> CapacityReport:
    """Read at most one log source (a file or `-`, a local run, a Polyaxon run) and /metrics, then join.
    `start` (counted from 1) picks one start of a log that holds several; by default the last."""
    sources = (("--log", log), ("--run", run_dir), ("--polyaxon-run", polyaxon_run))
    chosen = [name for name, value in sources if value is not None]
    if len(chosen) > 1:
        raise HarnessError(f"give one log source, not {' and '.join(chosen)}")
    if not chosen and metrics is None:
        raise HarnessError("nothing to read: give --log FILE|-, --run DIR, --polyaxon-run UUID or --metrics URL")
    check_given(log=log, polyaxon_run=polyaxon_run, project=project, metrics=metrics, model=model,
                revision=revision, gpu=gpu)
    if start is not None and not chosen:
        raise HarnessError(f"--start {start}: picks one start of a log; give the log too")
    text: str | None = None
    if log is not None:
        text = read_log_text(log)
    elif run_dir is not None:
        text = read_run_log(run_dir)
    elif polyaxon_run is not None and project is not None:
        text = fetch_polyaxon_run_log(polyaxon_run, project)
    parsed = None
    if text is not None:
        where = {"--log": log, "--run": run_dir, "--polyaxon-run": polyaxon_run}[chosen[0]]
        if not text.strip():
            raise HarnessError(f"{chosen[0]} {where}: the log is empty; expected a vLLM start-up log")
        try:
            parsed = parse_startup_log(text, start)
        except HarnessError as error:
            raise HarnessError(f"{chosen[0]} {where}: {error}") from None
    snapshot = _metrics_snapshot(metrics) if metrics is not None else None
    return build_capacity_report(parsed, snapshot, model=model, revision=revision, gpu=gpu, stated=stated)


def _metrics_snapshot(source: str) -> MetricsSnapshot:
    """A scrape that names no vLLM metric would silently add nothing to the comparison: refused."""
    text = _metrics_text(source)
    if not text.strip():
        raise HarnessError(f"--metrics {source}: empty; expected a vLLM /metrics scrape")
    try:
        snapshot = parse_metrics(text)
    except HarnessError as error:
        raise HarnessError(f"--metrics {source}: {error}") from None
    if snapshot == MetricsSnapshot():
        raise HarnessError(f"--metrics {source}: no vLLM metric in it; expected a vLLM /metrics scrape")
    return snapshot


def _metrics_text(source: str) -> str:
    """A live /metrics URL, or a saved scrape on disk."""
    if re.match(r"[A-Za-z][A-Za-z0-9+.-]*://", source):  # any scheme: httpx refuses those it does not speak
        refuse_url_credentials(checked_server_url(source, "--metrics"), "--metrics")
        return fetch_metrics_text(source)
    return read_log_text(source)


def build_capacity_report(
    log: StartupCapacity | None,
    metrics: MetricsSnapshot | None = None,
    *,
    model: str | None = None,
    revision: str | None = None,
    gpu: str | None = None,
    stated: LogOverrides | None = None,
) -> CapacityReport:
    """Join a parsed start-up log, a /metrics snapshot and the calculator's prediction.

    `model` overrides the model the log names (a log from another machine names a path that is not
    here). A model given explicitly must load; one only named by the log may be unknown here, and
    then the report explains why it has no prediction instead of failing.
    """
    cache_config = metrics.cache_config if metrics else None
    cross_checks = _cross_checks(log, cache_config) if log and cache_config else []
    if log is not None and stated is not None:
        log = stated.apply(log)
    inputs, note = _prediction_inputs(log, cache_config, model)
    prediction: CapacityPrediction | None = None
    comparison: list[ComparedFigure] = []
    waterfall: WaterfallComparison | None = None
    if inputs is not None and log is not None:
        try:
            shape = load_model_shape(inputs.model, revision if model is not None else log.model_revision
                                     ).served_in(log.dtype)
        except HarnessError as error:
            if model is not None:
                raise
            note = f"no prediction: the model the log names could not be read here ({error})"
        else:
            waterfall = waterfall_beside_log(log, shape, gpu)
            try:
                prediction = _predict(shape, inputs)
                comparison = _compare(log, cache_config, prediction, inputs, shape)
            except HarnessError as error:  # a layout the calculator does not model, not bad input
                note = f"no prediction: {error}"
    disagreements = [
        f"{check.name}: log says {check.log_value}, /metrics says {check.metrics_value}"
        for check in cross_checks
        if not check.agree
    ] + [
        f"{figure.name}: predicted {shown_figure(figure.predicted)}, logged {shown_figure(figure.logged)} "
        f"(residual {shown_figure(figure.residual, '+')})"
        for figure in comparison
        if not _agrees(figure)
    ]
    return CapacityReport(
        log=log,
        metrics_cache_config=cache_config,
        prediction_inputs=inputs,
        prediction=prediction,
        prediction_note=note,
        comparison=comparison,
        cross_checks=cross_checks,
        disagreements=disagreements,
        prediction_matches_log=all(_agrees(figure) for figure in comparison) if comparison else None,
        waterfall=waterfall,
    )


def _agrees(figure: ComparedFigure) -> bool:
    """A figure the log prints rounded agrees when the prediction falls inside that rounding."""
    return figure.exact or bool(figure.within_log_rounding)


def _prediction_inputs(
    log: StartupCapacity | None, cache_config: dict[str, str] | None, model: str | None
) -> tuple[PredictionInputs | None, str | None]:
    if log is None:
        return None, "no prediction: it needs a start-up log (the KV memory and max_model_len come from it)"
    if not log.capacity_found and log.available_kv_cache_bytes is None:
        return None, "no prediction: the log states neither its capacity nor its KV memory"
    model_name = model or log.model
    if model_name is None:
        return None, "no prediction: the log does not name the model; pass it explicitly"
    budget = _kv_budget(log, cache_config)
    if budget is None:
        return None, "no prediction: the log states neither the KV memory nor a kv_cache_memory_bytes reservation"
    max_model_len = log.max_model_len or log.max_concurrency_model_len
    if max_model_len is None:
        return None, "no prediction: the log does not state max_model_len"
    block_size, block_source = _block_size(log, cache_config)
    available, source, exact = budget
    tp, pp = log.tensor_parallel_size or 1, log.pipeline_parallel_size or 1
    try:
        speculative = speculative_from_log(log.speculative_method, log.speculative_tokens)
    except HarnessError as error:
        return None, f"no prediction: {error}"
    return (
        PredictionInputs(
            model=model_name,
            available_kv_bytes=available,
            available_kv_source=source,
            available_kv_exact=exact,
            block_size=block_size,
            block_size_source=block_source,
            max_model_len=max_model_len,
            kv_cache_dtype=log.kv_cache_dtype or "auto",
            tensor_parallel_size=tp,
            pipeline_parallel_size=pp,
            stage_kv_bytes=_stage_kv_bytes(log, available, tp, pp),
            max_num_batched_tokens=log.max_num_batched_tokens,
            engine_version=log.engine_version,
            speculative=speculative,
            decode_context_parallel_size=log.decode_context_parallel_size or 1,
        ),
        None,
    )


def _kv_budget(log: StartupCapacity, cache_config: dict[str, str] | None) -> tuple[int, str, bool] | None:
    """The KV bytes the engine sized its cache from, preferring exact figures to printed GiB."""
    if log.kv_cache_memory_bytes is not None and log.kv_cache_memory_bytes_exact:
        return log.kv_cache_memory_bytes, "kv_cache_memory_bytes argument (exact)", True
    if cache_config and (reserved := label_count(cache_config.get("kv_cache_memory_bytes"))) is not None:
        return reserved, "/metrics cache_config_info kv_cache_memory_bytes", True
    if log.kv_cache_memory_bytes is not None:
        return log.kv_cache_memory_bytes, "logged kv_cache_memory_bytes reservation (GiB, 2 decimals)", False
    if log.available_kv_cache_bytes is not None:
        return log.available_kv_cache_bytes, "logged available KV cache memory (GiB, 2 decimals)", False
    if log.cpu_kv_space is not None:
        space = log.cpu_kv_space
        precision = "whole GiB, exact" if space.exact else "GiB, 2 decimals"
        return round(space.kv_cache_gib * GiB), f"CPU build's {space.mode} KV space ({precision})", space.exact
    return None


def _stage_kv_bytes(log: StartupCapacity, available: int, tp: int, pp: int) -> list[int]:
    """Each pipeline stage's KV memory: its ranks' logged figures where the budget is the logged memory and
    every rank printed one; else the one budget for every stage (a reservation is the same on each GPU)."""
    by_rank = log.available_kv_cache_bytes_by_rank if available == log.available_kv_cache_bytes else {}
    return stage_memory(by_rank, available, tensor_parallel_size=tp, pipeline_parallel_size=pp) or [available] * pp


def _block_size(log: StartupCapacity, cache_config: dict[str, str] | None) -> tuple[int, str]:
    if cache_config and (block_size := label_count(cache_config.get("block_size"))) is not None:
        return block_size, "/metrics cache_config_info"
    if log.block_size is not None:
        return log.block_size, "block_size argument"
    device = "CPU" if (log.device or "").lower() == "cpu" else (log.kv_cache_device or "GPU").upper()
    if device == "CPU" and log.engine_version and release_version(log.engine_version) < CPU_BLOCK_SET_SINCE:
        return _cpu_block_before_0_12(log)
    size = DEFAULT_BLOCK_SIZE.get(device, CUDA_BLOCK_SIZE)
    return size, f"vLLM's default for {device} (not stated by the log)"


def _cpu_block_before_0_12(log: StartupCapacity) -> tuple[int, str]:
    """Before 0.12 the CPU build's default block is 128 tokens where intel_extension_for_pytorch is installed and
    16 where it is not (platforms/cpu.py `check_and_update_config`, read in 0.8.3, 0.10.2 and 0.11.0); no line
    says which, so the logged figures do: tokens are whole blocks, and V0's concurrency is blocks × block size
    over max_model_len."""
    with_ipex = DEFAULT_BLOCK_SIZE["CPU"]
    implied = None
    if log.kv_cache_tokens is not None and log.kv_cache_tokens % with_ipex:
        implied = CPU_BLOCK_WITHOUT_IPEX
    elif log.engine_generation == "V0" and log.num_gpu_blocks and log.max_concurrency and log.max_concurrency_model_len:
        per_block = log.max_concurrency * log.max_concurrency_model_len / log.num_gpu_blocks
        implied = min((CPU_BLOCK_WITHOUT_IPEX, with_ipex), key=lambda size: abs(size - per_block))
    if implied is None:
        return with_ipex, "the CPU build's default with intel_extension_for_pytorch (16 without it)"
    ipex = "with" if implied == with_ipex else "without"
    return implied, f"the CPU build's default {ipex} intel_extension_for_pytorch, as the logged figures imply"


def _predict(shape: ModelShape, inputs: PredictionInputs, offset_bytes: int = 0) -> CapacityPrediction:
    """The prediction from the log's KV memory, each stage's moved by `offset_bytes` (the print's rounding)."""
    return predict_pipeline_capacity(
        shape,
        [available + offset_bytes for available in inputs.stage_kv_bytes],
        block_size=inputs.block_size,
        max_model_len=inputs.max_model_len,
        kv_cache_dtype=inputs.kv_cache_dtype,
        tensor_parallel_size=inputs.tensor_parallel_size,
        max_num_batched_tokens=inputs.max_num_batched_tokens,
        engine_version=inputs.engine_version,
        available_kv_source=inputs.available_kv_source,
        speculative=inputs.speculative,
        decode_context_parallel_size=inputs.decode_context_parallel_size,
    )


def _compare(
    log: StartupCapacity,
    cache_config: dict[str, str] | None,
    prediction: CapacityPrediction,
    inputs: PredictionInputs,
    shape: ModelShape,
) -> list[ComparedFigure]:
    """Each logged figure against the prediction; inexact KV inputs also get a rounding band."""
    bounds: tuple[CapacityPrediction, CapacityPrediction] | None = None
    if not inputs.available_kv_exact:
        half_step = GIB_PRINT_HALF_STEP_BYTES
        bounds = (_predict(shape, inputs, -half_step), _predict(shape, inputs, half_step))

    figures: list[ComparedFigure] = []

    def add(name: str, source: str, logged: float | None, predicted: float, decimals: int | None = None) -> None:
        if logged is None:
            return
        shown = round(predicted, decimals) if decimals is not None else predicted
        band = None
        if bounds is not None:
            low_value, high_value = (getattr(bound, name) for bound in bounds)
            band = round(low_value, decimals or 0) <= logged <= round(high_value, decimals or 0)
        figures.append(
            ComparedFigure(
                name=name,
                source=source,
                predicted=shown,
                logged=logged,
                residual=logged - shown,
                exact=logged == shown,
                within_log_rounding=band,
            )
        )

    blocks, blocks_source = _logged_blocks(log, cache_config)
    add("num_blocks", blocks_source, blocks, prediction.num_blocks)
    add("kv_cache_tokens", "start-up log", log.kv_cache_tokens, prediction.kv_cache_tokens)
    add("max_concurrency", "start-up log (2 decimals)", log.max_concurrency, prediction.max_concurrency, 2)
    return figures


def _logged_blocks(log: StartupCapacity, cache_config: dict[str, str] | None) -> tuple[int | None, str]:
    if log.num_gpu_blocks is not None:
        return log.num_gpu_blocks, "start-up log"
    if cache_config and (blocks := label_count(cache_config.get("num_gpu_blocks"))) is not None:
        return blocks, "/metrics cache_config_info"
    return None, ""


def _cross_checks(log: StartupCapacity, cache_config: dict[str, str]) -> list[CrossCheck]:
    """Figures both sources state; the log's concurrency is rounded to 2 decimals, so /metrics' is too."""
    pairs: list[tuple[str, object, str, Callable[[str], object]]] = [
        ("kv_cache_tokens", log.kv_cache_tokens, "kv_cache_size_tokens", lambda text: int(float(text))),
        ("max_concurrency", log.max_concurrency, "kv_cache_max_concurrency", lambda text: round(float(text), 2)),
        ("num_gpu_blocks", log.num_gpu_blocks, "num_gpu_blocks", int),
        ("kv_cache_memory_bytes", log.kv_cache_memory_bytes, "kv_cache_memory_bytes", int),
        ("kv_cache_dtype", log.kv_cache_dtype, "cache_dtype", str),
        ("block_size", log.block_size, "block_size", int),
        ("gpu_memory_utilization", log.gpu_memory_utilization, "gpu_memory_utilization", float),
    ]
    checks: list[CrossCheck] = []
    for name, log_value, metrics_key, convert in pairs:
        metrics_value = cache_config.get(metrics_key)
        if log_value is None or metrics_value in (None, "None"):
            continue
        try:
            agree = convert(metrics_value) == log_value
        except (ValueError, OverflowError):  # 'NaN', 'inf' or words where /metrics states a figure
            agree = False
        checks.append(CrossCheck(name=name, log_value=str(log_value), metrics_value=metrics_value, agree=agree))
    return checks
