"""`harness capacity` for people: the log's figures, the prediction beside them, and every disagreement."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from harness.observe.capacity_report import LOG_FIGURES, CapacityReport, PredictionInputs, shown_figure
from harness.observe.capacity_waterfall import WaterfallComparison, gib
from harness.predict.releases import PRODUCTION_ENGINE


def capacity_renderable(report: CapacityReport) -> Group:
    """The report for people: what the log says, the prediction beside it, and every disagreement."""
    parts: list[RenderableType] = [*_observed_parts(report), *_predicted_parts(report)]
    for check in report.cross_checks:
        verdict = "agree" if check.agree else "DISAGREE"
        parts.append(Text(f"log vs /metrics {check.name}: {check.log_value} / {check.metrics_value}: {verdict}"))
    for disagreement in report.disagreements:
        parts.append(Text(f"disagreement: {disagreement}", style="bold red"))
    return Group(*parts)


def _observed_parts(report: CapacityReport) -> list[RenderableType]:
    """What the start-up log and the server's /metrics say, each where present."""
    parts: list[RenderableType] = []
    log = report.log
    if log is not None:
        which = f" (start {log.start} of {log.starts}; --start picks another)" if log.starts > 1 else ""
        parts.append(Text(f"start-up log: {log.diagnosis}{which}"))
        facts = Table(show_header=False)
        for name in LOG_FIGURES:
            value = getattr(log, name)
            if value is not None:
                facts.add_row(name, f"{value:,}" if isinstance(value, int) else str(value))
        parts.append(facts)
        if log.tensor_parallel_size_from_ranks:
            parts.append(Text(
                f"tensor_parallel_size {log.tensor_parallel_size} is counted from the workers' TP<n> prefixes (no "
                "engine config line states it): more ranks may have printed nothing here; give "
                "--tensor-parallel-size if the launch used more", style="yellow"))
    if report.metrics_cache_config is not None:
        keys = ("num_gpu_blocks", "block_size", "cache_dtype", "kv_cache_size_tokens", "kv_cache_max_concurrency")
        config = report.metrics_cache_config
        shown = ", ".join(f"{key}={config[key]}" for key in keys if key in config)
        parts.append(Text(f"/metrics cache_config_info: {shown}"))
    return parts


def _predicted_parts(report: CapacityReport) -> list[RenderableType]:
    """The prediction's inputs, its figures beside the logged ones, and the memory waterfall."""
    parts: list[RenderableType] = []
    if report.prediction_inputs is not None:
        inputs = report.prediction_inputs
        block = f"block_size {inputs.block_size} ({inputs.block_size_source})"
        if report.prediction is not None and report.prediction.block_size != inputs.block_size:
            block = (f"block_size {report.prediction.block_size} (vLLM raises the attention block from "
                     f"{inputs.block_size}, {inputs.block_size_source}, until one page holds a hybrid layer's state)")
        parts.append(Text(
            f"prediction from {_kv_memory(inputs)} KV bytes ({inputs.available_kv_source}), {block}, "
            f"max_model_len {inputs.max_model_len}, {_rules(inputs)}"
        ))
    if report.comparison:
        table = Table("figure", "predicted", "logged", "logged − predicted", "exact", "source",
                      title="predicted vs logged")
        for figure in report.comparison:
            exact = "yes" if figure.exact else ("within log rounding" if figure.within_log_rounding else "NO")
            table.add_row(figure.name, shown_figure(figure.predicted), shown_figure(figure.logged),
                          shown_figure(figure.residual, "+"), exact, figure.source)
        parts.append(table)
    if report.waterfall is not None:
        parts.append(_waterfall_table(report.waterfall))
    if report.prediction_note:
        parts.append(Text(report.prediction_note))
    return parts


def _rules(inputs: PredictionInputs) -> str:
    """Whose rules sized the prediction; a log that hides its release is priced as the pinned image, loudly."""
    if inputs.engine_version:
        return f"vLLM {inputs.engine_version}'s rules"
    return (f"vLLM {PRODUCTION_ENGINE}'s rules (the pinned image's): the log does not state its release; give "
            "--engine-version, as the release changes the grouping, the block sizes and the logged figures")


def _waterfall_table(waterfall: WaterfallComparison) -> RenderableType:
    """The terms beside the logged ones; only why, where the waterfall could not be planned."""
    if not waterfall.rows:
        return Text(f"no memory waterfall before launch: {' '.join(waterfall.notes)}")
    table = Table("term", "predicted_gib", "logged_gib", "source",
                  title=f"Memory waterfall before launch beside the log: {gib(waterfall.total_bytes)} GiB "
                        f"({waterfall.total_source}) × {waterfall.gpu_memory_utilization}")
    for row in waterfall.rows:
        table.add_row(row.name, gib(row.predicted_bytes), gib(row.logged_bytes), row.source)
    if waterfall.notes:
        table.caption = "\n".join(waterfall.notes)
    return table


def _kv_memory(inputs: PredictionInputs) -> str:
    """One figure, or each pipeline stage's where the engine is split into stages (the fewest blocks win)."""
    if inputs.pipeline_parallel_size == 1:
        return f"{inputs.available_kv_bytes:,}"
    stages = ", ".join(f"{stage:,}" for stage in inputs.stage_kv_bytes)
    return f"{inputs.pipeline_parallel_size} pipeline stages' {stages}"
