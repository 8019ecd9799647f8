"""The search on this machine: one engine started per configuration, every probe a real run against it.

A configuration is the service polyaxonfile with its presets and -P values, or one point of a sweep file's
matrix (one limit at a time). Its engine starts once; the load is searched on it. Each probe is a run as
`harness run` leaves it — its own UUID and directory under the search's --out, the engine's record and its
logged capacity beside the figures — tracked as an offline Polyaxon run tagged with the search and its step.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict

from harness.errors import HarnessError
from harness.inventory.frozen import load_inventory
from harness.launch.engine_args import option_value
from harness.launch.engine_process import EngineStartError, RunningEngine, local_engine
from harness.launch.experiment import engine_limits, record_capacity, scrape_metrics, write_engine_record
from harness.launch.specs import render
from harness.launch.sweep import service_params, sweep_points
from harness.measure.run_options import RunOptions, build_run_config
from harness.measure.runner import run_load
from harness.measure.schedule import LoadShape
from harness.observe.device import DeviceRecord, device_facts
from harness.paths import read_text
from harness.schema import RunFile
from harness.search.answer import EngineFacts, answer, load_words, number
from harness.search.driver import SearchPlan, StepResult, run_search
from harness.search.facts import NoCapacityLogged, Sizing, engine_facts, predicted_knee, prediction_line
from harness.search.probe import Knob, Probe, ProbeRunner
from harness.search.report import SearchedConfiguration, SearchResult, failed_configuration
from harness.track.tracking import LiveRun

PROBE_FILE = "probe.json"  # the probe a run measured, beside its record


class Configuration(BaseModel):
    """One engine's limits for a search: the service files, the params it starts with, and the swept point."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    index: int
    service_files: list[Path]
    params: dict[str, Any]
    point: dict[str, Any]  # the sweep point's limit and value; empty without a sweep


def configurations(files: list[Path], service_file: Path, params: dict[str, Any]) -> list[Configuration]:
    """The configurations -f gives: a service polyaxonfile (+ presets) is one, a sweep file (+ presets) one per
    point, each checked with Polyaxon's compiler before any engine starts."""
    if not files:
        raise HarnessError("-f: give the service polyaxonfile or a sweep file, then presets")
    if not read_text(service_file, "--service").strip() or render([service_file]).kind != "service":
        raise HarnessError(f"--service {service_file}: not a service polyaxonfile (run.kind: service)")
    if _is_sweep(files[0]):
        service_files = [service_file, *files[1:]]
        for_service = service_params(service_files, params)
        # The sweep's experiment asks for a load; the search sets each probe's own, so any one compiles it.
        loaded = params if {"concurrency", "rate"} & params.keys() else {**params, "concurrency": 1}
        _, points = sweep_points(files, service_files, loaded)
        return [Configuration(index=index, service_files=service_files, params={**for_service, **point},
                              point=point) for index, point in enumerate(points)]
    if render(files).kind != "service":
        raise HarnessError(f"{files[0]}: neither a service polyaxonfile nor a sweep file (a matrix); the search "
                           "starts the engine itself, from polyaxonfiles/vllm-service.yaml")
    return [Configuration(index=0, service_files=files, params=service_params(files, params), point={})]


def _is_sweep(path: Path) -> bool:
    try:
        spec = yaml.safe_load(read_text(path, "-f"))
    except yaml.YAMLError as error:
        raise HarnessError(f"-f {path}: cannot be read as a polyaxonfile: {str(error).splitlines()[0]}") from None
    return isinstance(spec, dict) and spec.get("matrix") is not None


@contextlib.contextmanager
def started_engine(configuration: Configuration, out: Path) -> Iterator[RunningEngine]:
    with local_engine(configuration.service_files, configuration.params,
                      log_path=out / RunFile.ENGINE_LOG) as engine:
        yield engine


class LocalProbeRunner:
    """Probes as runs against one started engine, each in `out/step-NN-repeat-R`, tracked offline."""

    def __init__(self, engine: RunningEngine, options: RunOptions, out: Path, *, project: str,
                 offline_root: Path | None) -> None:
        self.engine, self.options, self.out = engine, options, out
        self.project, self.offline_root = project, offline_root
        self.limits = engine_limits(engine.argv)
        self.api_key = option_value(engine.argv, "--api-key")

    def run(self, probe: Probe) -> Path:
        run_dir = self.out / f"step-{probe.step:02d}-repeat-{probe.repeat}"
        options = self.options.model_copy(update={"load": probe_load(probe, self.options.load.seed)})
        config, inventory = build_run_config(options)
        live = LiveRun.start(config, self.limits, project=self.project, offline_root=self.offline_root,
                             name=f"search-{probe.search_id}-step-{probe.step}-repeat-{probe.repeat}")
        live.run.log_tags(probe.tags(), async_req=False)
        try:
            run_load(config, inventory, run_dir, on_sample=live.on_sample, api_key=self.api_key,
                     max_num_seqs=self.limits.get("max_num_seqs"))
            self._engine_record(run_dir)
        except BaseException as error:
            live.finish(run_dir, failure=str(error) or type(error).__name__)
            raise
        live.finish(run_dir)
        (run_dir / PROBE_FILE).write_text(probe.model_dump_json(indent=2), encoding="utf-8")
        return run_dir

    def _engine_record(self, run_dir: Path) -> None:
        """engine.json, capacity.json (the engine's log, copied and masked) and device.json, as a run that
        started its own engine keeps them: the diagnosis reads the limits and the logged blocks from them."""
        write_engine_record(run_dir, argv=self.engine.argv, limits=self.limits)
        facts = device_facts()
        report = record_capacity(run_dir, self.engine.log_path, scrape_metrics(self.engine.base_url), facts)
        device = DeviceRecord.model_validate(facts.model_dump())
        if report.log is not None:
            device = device.model_copy(update={"engine_dtype": report.log.dtype})
        (run_dir / RunFile.DEVICE).write_text(device.model_dump_json(indent=2), encoding="utf-8")


def probe_load(probe: Probe, seed: int) -> LoadShape:
    if probe.knob == Knob.CONCURRENCY:
        return LoadShape(concurrency=int(probe.value), requests=probe.requests,
                         warmup_requests=probe.warmup_requests, seed=seed)
    return LoadShape(rate_per_s=probe.value, max_concurrency=probe.max_concurrency, requests=probe.requests,
                     warmup_requests=probe.warmup_requests, seed=seed)


class LocalSearch(BaseModel):
    """Where and how the local search runs its probes and keeps them."""

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    options: RunOptions  # the probes' run options; the load and the server are each probe's
    out: Path
    project: str
    offline_root: Path


def search_configurations(
    searched: list[Configuration], plan: SearchPlan, local: LocalSearch, *,
    announce: Callable[[str], None] = lambda line: None, runner_class: type[LocalProbeRunner] = LocalProbeRunner,
) -> SearchResult:
    """Each configuration's engine started once, its load searched on it, its answer given; next one. A
    configuration whose engine does not start (or logs no capacity) is recorded with its reason and log, as
    `harness sweep` records a failed point, and the next one is searched."""
    sizing = Sizing(inventory=load_inventory(local.options.inventory), max_tokens=local.options.max_tokens)
    results, failed = [], []
    for configuration in searched:
        out = local.out / f"point-{configuration.index}" if configuration.point else local.out
        try:
            with started_engine(configuration, out) as engine:
                runner = runner_class(engine, local.options.model_copy(update={"base_url": engine.base_url}), out,
                                      project=local.project, offline_root=local.offline_root)
                facts = engine_facts(engine, sizing)
                results.append(search_known(configuration, plan, runner, facts, announce, str(engine.log_path)))
        except (EngineStartError, NoCapacityLogged) as error:
            failure = failed_configuration(configuration.index, configuration.point, plan, str(error),
                                           out / RunFile.ENGINE_LOG)
            announce("; ".join(failure.lines))
            failed.append(failure)
    return SearchResult(search_id=plan.search_id, configurations=results, failed=failed)


def search_known(configuration: Configuration, plan: SearchPlan, runner: ProbeRunner, facts: EngineFacts,
                 announce: Callable[[str], None], engine_log: str | None = None) -> SearchedConfiguration:
    """One configuration searched from the knee its engine's facts predict, before any probe."""
    prediction = predicted_knee(facts, plan.most_in_flight)
    announce(prediction_line(configuration.point, prediction, facts, plan.knob))
    trace = run_search(plan, runner, prediction, on_step=lambda step: announce(step_line(plan, step)))
    return SearchedConfiguration(index=configuration.index, point=configuration.point, trace=trace,
                                 answer=answer(trace, facts), engine_log=engine_log)


def step_line(plan: SearchPlan, step: StepResult) -> str:
    figures = "; ".join(f"{reading.figure} {number(reading.value)} [{number(reading.low)}–{number(reading.high)}]"
                        for reading in step.readings)
    decided = step.decision.value if step.decision else f"stopped: {step.stopped_reason}"
    load = f"{plan.knob.value} {load_words(plan.knob, step.value)}"
    return f"step {step.step}: {load}, {len(step.probes)} run(s): {decided}; {figures}"
