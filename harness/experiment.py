"""One run = one configuration = one UUID: start the engine, measure it, keep its log and capacity, stop it.

This is what lets a plain Polyaxon matrix sweep work on CE, where a DAG step cannot start while a service
runs: each point is a job that owns its engine. An engine that fails to start is a result, not a crash:
the record keeps its log and says how far it got, which is exactly the evidence for "weights and start-up
headroom".
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

from harness.capacity import build_capacity_report
from harness.errors import HarnessError
from harness.inventory import Inventory
from harness.launch import EngineStartError, start_engine
from harness.record import RunConfig
from harness.runner import run_load
from harness.server_logs import fetch_polyaxon_run_log, parse_startup_log
from harness.server_metrics import MetricsSnapshot, fetch_metrics_text, parse_metrics
from harness.stats import RunSummary
from harness.tracking import DEFAULT_PROJECT, ENGINE_JSON, TrackedRun, managed_run, track_run

ENGINE_LOG = "engine.log"
SERVICE_LOG_ENV = "HARNESS_SERVICE_LOG"  # a local service's start-up log, for the harness run measuring it
CAPACITY_JSON = "capacity.json"


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
    """`harness run`: against a running server, or against an engine it starts itself; then tracked.

    Tracking happens inside a managed Polyaxon run, or when a project or an offline root is given.
    """
    if engine_argv:
        summary = run_with_engine(config, inventory, run_dir, engine_argv, health_timeout_s=ready_timeout_s)
    else:
        summary = run_load(config, inventory, run_dir, ready_timeout_s=ready_timeout_s)
        if config.service_uuid:
            attach_service(run_dir, config.service_uuid, config.base_url)
    tracked = None
    if managed_run() or project or offline_root:
        tracked = track_run(run_dir, project=project or DEFAULT_PROJECT, offline_root=offline_root)
    return summary, tracked


def run_with_engine(
    config: RunConfig,
    inventory: Inventory,
    run_dir: Path,
    engine_argv: list[str],
    *,
    health_timeout_s: float = 900.0,
) -> RunSummary | None:
    """Start the engine from its command line, run the load against it, then record its capacity.

    Returns the run's summary, or None when the engine did not start (the record then says why).
    """
    write_engine_record(run_dir, argv=engine_argv, limits=engine_limits(engine_argv))
    summary: RunSummary | None = None
    snapshot: MetricsSnapshot | None = None
    with contextlib.ExitStack() as stack:
        try:
            engine = stack.enter_context(
                start_engine(engine_argv, log_path=run_dir / ENGINE_LOG, health_timeout_s=health_timeout_s)
            )
        except EngineStartError:
            _write_config(run_dir, config)
        else:
            summary = run_load(config, inventory, run_dir)
            snapshot = scrape_metrics(engine.base_url)
    record_capacity(run_dir, run_dir / ENGINE_LOG, snapshot)
    return summary


def attach_service(run_dir: Path, service_uuid: str, base_url: str) -> None:
    """A harness job measured a separate service: its start-up log gives its limits and logged capacity.

    The log is a file when the service runs here ($HARNESS_SERVICE_LOG), else the Polyaxon service run's
    logs, read from inside the managed harness run. Without either, the record keeps only the figures.
    """
    local_log, managed = os.environ.get(SERVICE_LOG_ENV), managed_run()
    if local_log:
        log_text = Path(local_log).read_text(encoding="utf-8", errors="replace")
    elif managed is not None:
        try:
            log_text = fetch_polyaxon_run_log(service_uuid, f"{managed.owner}/{managed.project}")
        except HarnessError:  # the figures stand without the capacity; analysis shows it as missing
            return
    else:
        return
    (run_dir / ENGINE_LOG).write_text(log_text, encoding="utf-8")
    stated = parse_startup_log(log_text).non_default_args or {}
    write_engine_record(run_dir, argv=None, limits={name: value for name, value in stated.items()
                                                    if name not in ("host", "port")})
    record_capacity(run_dir, run_dir / ENGINE_LOG, scrape_metrics(base_url))


def engine_limits(argv: list[str]) -> dict[str, Any]:
    """Everything the engine was told except where to listen, which says nothing about what it holds."""
    return {name: value for name, value in engine_options(argv).items() if name not in ("host", "port")}


def engine_options(argv: list[str]) -> dict[str, Any]:
    """The engine's options as named values: `--max-num-seqs 8` → max_num_seqs=8, `--no-x` → x=False."""
    options: dict[str, Any] = {}
    index = 0
    while index < len(argv):
        word = argv[index]
        index += 1
        if not word.startswith("--"):
            continue
        name, _, value = word[2:].partition("=")
        if not value and index < len(argv) and not argv[index].startswith("--"):
            value, index = argv[index], index + 1
        key = name.replace("-", "_")
        if not value:
            key, value = (key[3:], False) if key.startswith("no_") else (key, True)
        options[key] = _typed(value)
    return options


def write_engine_record(run_dir: Path, *, argv: list[str] | None, limits: dict[str, Any]) -> None:
    """engine.json: the engine's command line (when this run started it) and its limits, for comparisons."""
    run_dir.mkdir(parents=True, exist_ok=True)
    engine = {"argv": argv, "limits": limits, "image_reference": os.environ.get("HARNESS_IMAGE_REFERENCE")}
    (run_dir / ENGINE_JSON).write_text(json.dumps(engine, indent=2), encoding="utf-8")


def scrape_metrics(base_url: str) -> MetricsSnapshot | None:
    """One /metrics scrape to cross-check the logged capacity; a failed scrape only loses the check."""
    with contextlib.suppress(HarnessError):
        return parse_metrics(fetch_metrics_text(f"{base_url}/metrics"))
    return None


def record_capacity(run_dir: Path, engine_log: Path, snapshot: MetricsSnapshot | None) -> None:
    """capacity.json from the start-up log (copied into the record) and /metrics, with the prediction."""
    log_text = engine_log.read_text(encoding="utf-8", errors="replace")
    if engine_log.resolve() != (run_dir / ENGINE_LOG).resolve():
        (run_dir / ENGINE_LOG).write_text(log_text, encoding="utf-8")
    report = build_capacity_report(parse_startup_log(log_text), snapshot)
    (run_dir / CAPACITY_JSON).write_text(report.model_dump_json(indent=2), encoding="utf-8")


def _write_config(run_dir: Path, config: RunConfig) -> None:
    """What was asked, kept even when nothing could be sent."""
    (run_dir / "config.json").write_text(config.model_dump_json(indent=2), encoding="utf-8")


def _typed(value: Any) -> Any:
    if isinstance(value, bool):
        return value
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return value


