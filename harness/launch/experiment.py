"""One run = one configuration = one UUID: start the engine, measure it, keep its log and capacity, stop it.

This is what lets a plain Polyaxon matrix sweep work on CE, where a DAG step cannot start while a service
runs: each point is a job that owns its engine. An engine that fails to start is a result, not a crash:
the record keeps its log and says how far it got, which is exactly the evidence for "weights and start-up
headroom".
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

from harness.errors import HarnessError
from harness.inventory.frozen import Inventory
from harness.launch.engine_args import engine_options, option_value
from harness.launch.engine_process import EngineStartError, start_engine
from harness.measure.record import RunConfig
from harness.measure.runner import run_load
from harness.measure.stats import RunSummary
from harness.measure.timeouts import READY_TIMEOUT_S
from harness.model_identity import read_identity
from harness.observe.capacity import build_capacity_report
from harness.observe.capacity_report import CapacityReport
from harness.observe.device import DeviceFacts, DeviceRecord, MemoryMonitor, device_facts
from harness.observe.drift import DriftCheck, drift_for_run
from harness.observe.log_lines import fetch_polyaxon_run_log
from harness.observe.server_logs import parse_startup_log
from harness.observe.server_metrics import MetricsSnapshot, fetch_metrics_text, parse_metrics
from harness.polyaxon_client import managed_run
from harness.redact import redact_argv, redact_file, redact_text, secret_free
from harness.schema import SERVICE_LOG_ENV, EngineRecord, RunFile, TrackedRun
from harness.track.tracking import DEFAULT_PROJECT, LiveRun


def measure(
    config: RunConfig,
    inventory: Inventory,
    run_dir: Path,
    *,
    engine_argv: list[str] | None,
    ready_timeout_s: float,
    project: str | None,
    offline_root: Path | None,
) -> tuple[RunSummary | None, TrackedRun | None]:
    """`harness run`: against a running server, or against an engine it starts itself; tracked throughout.

    Tracking happens inside a managed Polyaxon run, or when a project or an offline root is given. It starts
    before the engine, so a run that dies or times out shows its inputs and its series so far; a run whose
    engine did not start, or that raised, ends *failed*.
    """
    live = None
    if managed_run() or project or offline_root:
        live = LiveRun.start(config, engine_limits(engine_argv or []), project=project or DEFAULT_PROJECT,
                             offline_root=offline_root)
    try:
        if engine_argv:
            summary = run_with_engine(config, inventory, run_dir, engine_argv, health_timeout_s=ready_timeout_s,
                                      live=live)
        else:
            summary = run_load(config, inventory, run_dir, ready_timeout_s=ready_timeout_s,
                               on_sample=live.on_sample if live else None)
            if config.service_uuid or os.environ.get(SERVICE_LOG_ENV):
                attach_service(run_dir, config.service_uuid, config.base_url)
    except BaseException as error:
        if live is not None:
            if not (run_dir / RunFile.CONFIG).exists():
                _write_config(run_dir, config)
            live.finish(run_dir, failure=str(error) or type(error).__name__)
        raise
    tracked = None
    if live is not None:
        tracked = live.finish(run_dir, failure=None if summary is not None else engine_failure(run_dir))
    return summary, tracked


def run_with_engine(
    config: RunConfig,
    inventory: Inventory,
    run_dir: Path,
    engine_argv: list[str],
    *,
    health_timeout_s: float = READY_TIMEOUT_S,
    live: LiveRun | None = None,
) -> RunSummary | None:
    """Start the engine from its command line, run the load against it, then record its capacity and the
    device it ran on (device.json; its memory sampled while the load runs).

    Returns the run's summary, or None when the engine did not start (the record then says why).
    """
    write_engine_record(run_dir, argv=engine_argv, limits=engine_limits(engine_argv))
    facts = device_facts()
    if live is not None:
        live.log_inputs(**facts.model_dump())
    summary: RunSummary | None = None
    snapshot: MetricsSnapshot | None = None
    with contextlib.ExitStack() as stack:
        try:
            engine = stack.enter_context(
                start_engine(engine_argv, log_path=run_dir / RunFile.ENGINE_LOG, health_timeout_s=health_timeout_s)
            )
        except EngineStartError:
            _write_config(run_dir, config)
        else:
            monitor = stack.enter_context(
                MemoryMonitor(engine.pid, max(config.sample_interval_s, 1.0), live.log_series if live else None)
            )
            summary = run_load(config, inventory, run_dir, on_sample=live.on_sample if live else None,
                               api_key=option_value(engine_argv, "--api-key"),  # vLLM's: --api-key over the env
                               max_num_seqs=engine_limits(engine_argv).get("max_num_seqs"))
            snapshot = scrape_metrics(engine.base_url)
            facts = monitor.record(facts)
    report = record_capacity(run_dir, run_dir / RunFile.ENGINE_LOG, snapshot, facts)
    dtype = report.log.dtype if report.log is not None else None
    record = DeviceRecord(**{**facts.model_dump(), "engine_dtype": dtype})
    (run_dir / RunFile.DEVICE).write_text(record.model_dump_json(indent=2), encoding="utf-8")
    return summary


def engine_failure(run_dir: Path) -> str:
    """Why the engine did not start, in one line, from the record's capacity report."""
    if (run_dir / RunFile.CAPACITY).exists():
        report = CapacityReport.model_validate_json((run_dir / RunFile.CAPACITY).read_text(encoding="utf-8"))
        if report.log is not None and report.log.failure is not None:
            return f"the engine did not start ({report.log.failure.stage}): {report.log.failure.error}"
    return "the engine did not start"


def attach_service(run_dir: Path, service_uuid: str | None, base_url: str) -> None:
    """A run measured a server it did not start: its start-up log gives its limits and logged capacity.

    The log is a file when the server runs here ($HARNESS_SERVICE_LOG), else the Polyaxon service run's
    logs, read from inside the managed harness run. Without either, the record keeps only the figures.
    """
    local_log, managed = os.environ.get(SERVICE_LOG_ENV), managed_run()
    if local_log:
        log_text = Path(local_log).read_text(encoding="utf-8", errors="replace")
    elif managed is not None and service_uuid:
        try:
            log_text = fetch_polyaxon_run_log(service_uuid, f"{managed.owner}/{managed.project}")
        except HarnessError:  # the figures stand without the capacity; analysis shows it as missing
            return
    else:
        return
    attach_server_log(run_dir, log_text, base_url)


def attach_server_log(run_dir: Path, log_text: str, base_url: str) -> None:
    """engine.log (masked), engine.json with the limits the log states, and capacity.json with /metrics."""
    (run_dir / RunFile.ENGINE_LOG).write_text(redact_text(log_text), encoding="utf-8")
    write_engine_record(run_dir, argv=None, limits=stated_limits(log_text))
    record_capacity(run_dir, run_dir / RunFile.ENGINE_LOG, scrape_metrics(base_url))


def stated_limits(log_text: str) -> dict[str, Any]:
    """The limits a server's start-up log states (its non-default arguments), less where it listens."""
    stated = parse_startup_log(log_text).non_default_args or {}
    return named_model({name: value for name, value in stated.items() if name not in ("host", "port")})


def engine_limits(argv: list[str]) -> dict[str, Any]:
    """Everything the engine was told except where to listen and its secrets, which say nothing about what
    it holds; its model named as the engine used it (`named_model`)."""
    return named_model(secret_free({name: value for name, value in engine_options(argv).items()
                                    if name not in ("host", "port")}))


def named_model(limits: dict[str, Any]) -> dict[str, Any]:
    """The limits with a model directory named by the identity its generator recorded in it, when one did,
    and never by a revision: the engine ignores a revision for a directory, so one there names another model."""
    model = limits.get("model")
    if not isinstance(model, str) or not Path(model).is_dir():
        return limits
    identity = read_identity(Path(model))
    named = {name: value for name, value in limits.items() if name != "revision"}
    return named | identity.limits() if identity is not None else named


def write_engine_record(run_dir: Path, *, argv: list[str] | None, limits: dict[str, Any]) -> None:
    """engine.json: the engine's command line (when this run started it, its secrets masked) and its limits,
    for comparisons."""
    run_dir.mkdir(parents=True, exist_ok=True)
    engine = EngineRecord(argv=None if argv is None else redact_argv(argv), limits=secret_free(limits),
                          image_reference=os.environ.get("HARNESS_IMAGE_REFERENCE"),
                          container_image=os.environ.get("HARNESS_CONTAINER_IMAGE") or None)
    (run_dir / RunFile.ENGINE).write_text(redact_text(engine.model_dump_json(indent=2)), encoding="utf-8")


def scrape_metrics(base_url: str) -> MetricsSnapshot | None:
    """One /metrics scrape to cross-check the logged capacity; a failed scrape only loses the check."""
    with contextlib.suppress(HarnessError):
        return parse_metrics(fetch_metrics_text(f"{base_url}/metrics"))
    return None


def record_capacity(run_dir: Path, engine_log: Path, snapshot: MetricsSnapshot | None,
                    device: DeviceFacts | None = None) -> CapacityReport:
    """capacity.json from the start-up log (copied into the record, its secrets masked, also when the
    engine wrote it there itself) and /metrics, with the prediction, and the before-launch prediction for
    the same engine (engine.json's limits, the device) against what it logged (`harness.observe.drift`)."""
    record_log = run_dir / RunFile.ENGINE_LOG
    if engine_log.resolve() != record_log.resolve():
        record_log.write_text(engine_log.read_text(encoding="utf-8", errors="replace"), encoding="utf-8")
    redact_file(record_log)
    log_text = record_log.read_text(encoding="utf-8", errors="replace")
    engine = EngineRecord.model_validate_json((run_dir / RunFile.ENGINE).read_text(encoding="utf-8"))
    report = with_drift(build_capacity_report(parse_startup_log(log_text), snapshot), engine.limits, device)
    (run_dir / RunFile.CAPACITY).write_text(report.model_dump_json(indent=2), encoding="utf-8")
    return report


def with_drift(report: CapacityReport, limits: dict[str, Any], device: DeviceFacts | None) -> CapacityReport:
    """The report with its drift check (or why there is none) for an engine that sized its cache."""
    if report.log is None or not report.log.capacity_found:
        return report
    drift = drift_for_run(report.log, limits, device)
    return report.model_copy(update={"drift": drift} if isinstance(drift, DriftCheck) else {"drift_note": drift})


def _write_config(run_dir: Path, config: RunConfig) -> None:
    """What was asked, kept even when nothing could be sent."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / RunFile.CONFIG).write_text(redact_text(config.model_dump_json(indent=2)), encoding="utf-8")
