"""The search's report, answer first: the capacity curve with its intervals, then every probe; and the search
as a tracked run of its own, whose outputs hold the answer and whose artifacts hold the curve.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure
from pydantic import BaseModel, ConfigDict, Field

from harness.polyaxon_client import polyaxon_call
from harness.polyaxon_project import parse_project
from harness.search.answer import SearchAnswer, number, outputs
from harness.search.driver import SearchPlan, SearchTrace
from harness.search.objective import AttainmentObjective, PercentileObjective
from harness.search.probe import Knob
from harness.track.tracking import log_files, new_run


def point_title(point: dict[str, Any]) -> str:
    return ", ".join(f"{name}={value}" for name, value in point.items()) or "the configuration"


class SearchedConfiguration(BaseModel):
    """One configuration's search: its point of a sweep (empty without one), the steps and the answer."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    index: int
    point: dict[str, Any]
    trace: SearchTrace
    answer: SearchAnswer
    engine_log: str | None = None  # the engine this configuration was searched on, where it was started here

    @property
    def title(self) -> str:
        return point_title(self.point)


    @property
    def lines(self) -> list[str]:
        """The answer's lines; a search that stopped early also says where its engine's log is."""
        stopped = self.trace.stopped_reason is not None and self.engine_log is not None
        return self.answer.lines + ([f"engine log: {self.engine_log}"] if stopped else [])


class FailedConfiguration(BaseModel):
    """A configuration with no search: its engine did not start, or started without logging its capacity."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    index: int
    point: dict[str, Any]
    reason: str
    engine_log: str
    lines: list[str]

    @property
    def title(self) -> str:
        return point_title(self.point)


def failed_configuration(index: int, point: dict[str, Any], plan: SearchPlan, reason: str,
                         engine_log: Path) -> FailedConfiguration:
    objective = " and ".join(objective.words for objective in plan.objectives)
    return FailedConfiguration(index=index, point=point, reason=reason, engine_log=str(engine_log), lines=[
        f"max {plan.knob.value} meeting {objective}: not searched: {reason}", f"engine log: {engine_log}"])


class SearchResult(BaseModel):
    """Every configuration's search, and the configurations that could not be searched."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    search_id: str
    configurations: list[SearchedConfiguration]
    failed: list[FailedConfiguration] = Field(default_factory=list)

    def in_order(self) -> list[SearchedConfiguration | FailedConfiguration]:
        return sorted([*self.configurations, *self.failed], key=lambda configuration: configuration.index)

    @property
    def complete(self) -> bool:
        """Every configuration searched to the end: none failed, none stopped early."""
        return not self.failed and not any(searched.trace.stopped_reason for searched in self.configurations)


def knob_label(knob: Knob) -> str:
    return "concurrency (requests in flight)" if knob == Knob.CONCURRENCY else "rate (requests/s)"


def plot_curve(searched: SearchedConfiguration, path: Path) -> Path:
    """Each objective's figure against the knob with its interval, the objective's line, the predicted limits."""
    trace = searched.trace
    objectives = trace.plan.objectives
    figure = Figure(figsize=(7, 3.2 * len(objectives)))
    axes = figure.subplots(len(objectives), 1, squeeze=False)
    steps = trace.by_value()
    for axis, objective, position in zip(axes[:, 0], objectives, range(len(objectives)), strict=True):
        shown = [(step.value, step.readings[position]) for step in steps if len(step.readings) > position]
        values = [reading.value for _, reading in shown]
        axis.errorbar([value for value, _ in shown], values,
                      yerr=[[reading.value - reading.low for _, reading in shown],
                            [reading.high - reading.value for _, reading in shown]],
                      fmt="o-", capsize=4, label=objective.figure)
        limit = objective.limit_ms if isinstance(objective, PercentileObjective) else objective.target_share
        axis.axhline(limit, color="tab:red", linestyle="--", label=f"objective: {objective.words}")
        _predicted_limits(axis, trace)
        axis.set_xlabel(knob_label(trace.plan.knob))
        axis.set_ylabel(objective.figure)
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    axes[0, 0].set_title(f"{searched.title}: {searched.answer.lines[0]}"[:110], fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    return path


def _predicted_limits(axis: Any, trace: SearchTrace) -> None:
    prediction = trace.prediction
    if prediction is None or trace.plan.knob.value != "concurrency":
        return
    if prediction.preemption_knee_concurrency is not None:
        axis.axvline(prediction.preemption_knee_concurrency, color="tab:purple", linestyle=":",
                     label=f"predicted KV limit: preemption from {prediction.preemption_knee_concurrency}")
    if prediction.queue_knee_concurrency is not None:
        axis.axvline(prediction.queue_knee_concurrency, color="tab:red", linestyle=":",
                     label=f"predicted KV limit: arrivals wait from {prediction.queue_knee_concurrency}")
    if prediction.max_num_seqs is not None and prediction.max_num_seqs < trace.plan.values[-1]:
        axis.axvline(prediction.max_num_seqs + 1, color="tab:green", linestyle=":",
                     label=f"max_num_seqs {prediction.max_num_seqs}: queue from {prediction.max_num_seqs + 1}")


def probes_table(trace: SearchTrace) -> list[str]:
    """One Markdown row per run, in the order measured; each traces to its run UUID."""
    rows = [f"| step | repeat | {knob_label(trace.plan.knob)} | run | valid | figures over its own requests | "
            "step decision |", "|---|---|---|---|---|---|---|"]
    for step in trace.steps:
        for probe in step.probes:
            figures = "; ".join(f"{r.figure} {number(r.value)} [{number(r.low)}–{number(r.high)}] n={r.requests}"
                                for r in probe.readings) or "—"
            valid = "yes" if not probe.invalid_reasons else "no: " + "; ".join(probe.invalid_reasons)
            decision = step.decision.value if step.decision else "—"
            rows.append(f"| {step.step} | {probe.probe.repeat} | {number(step.value)} | {probe.run_uuid} | {valid} | "
                        f"{figures} | {decision} |")
    return rows


def objectives_words(trace: SearchTrace) -> list[str]:
    words = []
    for objective in trace.plan.objectives:
        kind = "percentile" if not isinstance(objective, AttainmentObjective) else "attainment"
        words.append(f"- {objective.words} ({kind}, `{objective.figure}`)")
    return words


def write_report(result: SearchResult, out: Path) -> tuple[Path, list[Path]]:
    """search.md with each configuration's answer, curve and probes (or why it was not searched); search.json
    with every figure."""
    out.mkdir(parents=True, exist_ok=True)
    lines = [f"# Capacity search {result.search_id}", ""]
    plots = []
    for configuration in result.in_order():
        lines += [f"## {configuration.title}", "", *(f"**{line}**" if i == 0 else line
                                                     for i, line in enumerate(configuration.lines)), ""]
        if isinstance(configuration, FailedConfiguration):
            continue
        plot = plot_curve(configuration, out / f"capacity-curve-{configuration.index}.png")
        plots.append(plot)
        lines += ["Objectives:", *objectives_words(configuration.trace), "",
                  f"![capacity curve]({plot.name})", "", "Probes, in the order measured:", "",
                  *probes_table(configuration.trace), ""]
    markdown = out / "search.md"
    markdown.write_text("\n".join(lines), encoding="utf-8")
    (out / "search.json").write_text(result.model_dump_json(indent=2), encoding="utf-8")
    return markdown, plots


def configuration_outputs(configuration: SearchedConfiguration | FailedConfiguration) -> dict[str, Any]:
    if isinstance(configuration, FailedConfiguration):
        return {"not_searched": configuration.reason}
    return outputs(configuration.answer)


def search_outputs(result: SearchResult) -> dict[str, Any]:
    """One configuration's outputs by their names; a sweep's, each suffixed with its point's index."""
    configurations = result.in_order()
    if len(configurations) == 1:
        return configuration_outputs(configurations[0])
    return {f"{name}_point_{configuration.index}": value for configuration in configurations
            for name, value in configuration_outputs(configuration).items()}


def track_search(result: SearchResult, files: dict[str, Path], *, project: str, offline_root: Path | None) -> str:
    """The search as a Polyaxon run (offline into `offline_root`, else in the API's project): the answer as
    outputs, the report and curves as artifacts."""
    run_uuid = uuid.uuid4().hex
    run = new_run(parse_project(project, "Polyaxon project"), run_uuid, offline_root, f"search-{result.search_id}")
    polyaxon_call(f"cannot tag the search run {run_uuid}",
                  lambda: run.log_tags([f"search-{result.search_id}", "capacity-search"], async_req=False))
    polyaxon_call(f"cannot log the outputs of the search run {run_uuid}",
                  lambda: run.log_outputs(**search_outputs(result), async_req=False))
    log_files(run, files)
    run.end()
    return run_uuid
