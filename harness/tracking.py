"""A finished run record, as a Polyaxon run: the limits and the workload as inputs, the figures as outputs.

Inputs and outputs are what the Polyaxon dashboard compares runs by, so their names are stable and carry
their units. Inside a managed run the record's id already is the run's UUID; offline, the record's id
becomes the offline run's UUID; a new run on an API gets the UUID the API assigns. Whichever it is, it is
written back into the record (`tracking.json`), and analysis joins on it.
"""

from __future__ import annotations

import datetime
import json
import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from harness.capacity import CapacityReport
from harness.errors import HarnessError
from harness.polyaxon_client import polyaxon_call
from harness.record import RunConfig, read_samples
from harness.stats import RunSummary

TRACKING_JSON = "tracking.json"
ENGINE_JSON = "engine.json"  # the engine's command line and the limits it was given
DEFAULT_OWNER = "local"
DEFAULT_PROJECT = "local/vllm-harness"
RECORD_FILES = ("config.json", "environment.json", "engine.json", "summary.json", "capacity.json",
                "requests.parquet", "samples.jsonl", "engine.log")
SERIES = {  # metric series name → MetricsSnapshot field
    "waiting_requests": "num_requests_waiting",
    "running_requests": "num_requests_running",
    "kv_cache_usage_fraction": "kv_cache_usage_fraction",
}


class TrackedRun(BaseModel):
    run_uuid: str
    owner: str
    project: str
    offline_root: str | None


def track_run(run_dir: Path, *, project: str, offline_root: Path | None = None, name: str | None = None) -> TrackedRun:
    """Log one run record to Polyaxon (the API, or an offline root that `polyaxon ops push` accepts)."""
    config = RunConfig.model_validate_json(_read(run_dir / "config.json"))
    inputs, outputs = run_io(run_dir)
    owner, project_name = _split_project(project)
    run = _init(owner, project_name, config.run_id, offline_root, name)
    run.log_inputs(**inputs)
    run.log_outputs(**outputs)
    anchor = config.clock_zero_unix_s
    for step, sample in enumerate(s for s in read_samples(run_dir) if s.snapshot is not None):
        values = {name: getattr(sample.snapshot, field) for name, field in SERIES.items()}
        values = {name: value for name, value in values.items() if value is not None}
        when = None if anchor is None else datetime.datetime.fromtimestamp(anchor + sample.t_s, datetime.UTC)
        if values:
            run.log_metrics(step=step, timestamp=when, **values)
    for file_name in RECORD_FILES:
        if (run_dir / file_name).exists():
            run.log_artifact(path=str(run_dir / file_name), name=file_name.split(".")[0], kind="file")
    run.end()
    tracked = TrackedRun(run_uuid=run.run_uuid, owner=run.owner or owner, project=run.project or project_name,
                         offline_root=None if offline_root is None else str(offline_root))
    (run_dir / TRACKING_JSON).write_text(tracked.model_dump_json(indent=2), encoding="utf-8")
    return tracked


def offline_tracking_env(offline_root: Path, project: str) -> dict[str, str]:
    """The environment that makes a `harness run` started as a local process track offline here."""
    return {"HARNESS_OFFLINE_ROOT": str(offline_root.resolve()), "HARNESS_PROJECT": project}


def managed_run() -> TrackedRun | None:
    """Inside a Polyaxon-managed run, who it is: POLYAXON_RUN_INSTANCE is owner.project.runs.uuid."""
    parts = os.environ.get("POLYAXON_RUN_INSTANCE", "").split(".")
    if len(parts) != 4:
        return None
    return TrackedRun(run_uuid=parts[3], owner=parts[0], project=parts[1], offline_root=None)


def managed_run_uuid() -> str | None:
    managed = managed_run()
    return managed.run_uuid if managed else None


def run_io(run_dir: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """A run record's Polyaxon inputs and outputs; analysis reads local records through this too.

    A run whose engine never started has no summary: its outputs then say so, with the engine's error.
    """
    config = RunConfig.model_validate_json(_read(run_dir / "config.json"))
    engine = json.loads(_read(run_dir / ENGINE_JSON)) if (run_dir / ENGINE_JSON).exists() else {}
    outputs: dict[str, Any] = {}
    if (run_dir / "summary.json").exists():
        outputs.update(run_outputs(RunSummary.model_validate_json(_read(run_dir / "summary.json"))))
    if (run_dir / "capacity.json").exists():
        outputs.update(capacity_outputs(CapacityReport.model_validate_json(_read(run_dir / "capacity.json"))))
    limits = dict(engine.get("limits", {}))
    if engine.get("image_reference"):  # the image is held fixed in a one-limit comparison like any limit
        limits["image"] = engine["image_reference"]
    return run_inputs(config, limits), outputs


def run_inputs(config: RunConfig, limits: dict[str, Any]) -> dict[str, Any]:
    """The engine's limits and the workload: what a one-limit comparison holds fixed or varies."""
    load = config.load
    workload = {
        "inventory_digest": config.inventory_digest,
        "concurrency": load.concurrency,
        "rate_per_s": load.rate_per_s,
        "burstiness": load.burstiness,
        "max_concurrency": load.max_concurrency,
        "requests": load.requests,
        "duration_s": load.duration_s,
        "warmup_requests": load.warmup_requests,
        "seed": load.seed,
        "order": load.order,
        "max_tokens": config.max_tokens,
        "temperature": config.temperature,
        "cold": config.cold,
        "service_uuid": config.service_uuid,
    }
    return {name: value for name, value in {**limits, **workload}.items() if value is not None}


def run_outputs(summary: RunSummary) -> dict[str, Any]:
    """Every scalar of the summary, latency percentiles flattened to `ttft_ms_p99`-style names."""
    outputs: dict[str, Any] = {}
    for name, value in summary.model_dump(exclude={"latency", "errors_by_class", "error_fraction_by_class",
                                                   "invalid_reasons", "qualifications", "schema_version",
                                                   "run_id"}).items():
        if value is not None:
            outputs[name] = value
    per_token = ("tpot_ms_", "itl_ms_")  # left out when the tokens came in bursts: they would read as per-token
    outputs.update({name: value for name, value in summary.latency.items() if value is not None
                    and (summary.per_token_latency_paced is not False or not name.startswith(per_token))})
    outputs.update({f"errors_{name}": count for name, count in summary.errors_by_class.items()})
    outputs.update({f"error_rate_{name}_fraction": share for name, share in summary.error_fraction_by_class.items()})
    outputs["invalid_reasons"] = "; ".join(summary.invalid_reasons)
    outputs["qualifications"] = "; ".join(summary.qualifications)
    return outputs


def capacity_outputs(report: CapacityReport) -> dict[str, Any]:
    """Logged and predicted KV capacity side by side; whether the engine started at all."""
    log, prediction = report.log, report.prediction
    figures: dict[str, Any] = {}
    if log is not None:
        blocks = log.num_gpu_blocks  # V0 logs also print CPU blocks: swap space, not KV capacity
        if blocks is None and report.metrics_cache_config:
            blocks = int(report.metrics_cache_config.get("num_gpu_blocks") or 0) or None
        figures.update(
            engine_started=log.capacity_found,
            kv_cache_tokens_logged=log.kv_cache_tokens,
            max_concurrency_logged=log.max_concurrency,
            num_blocks_logged=blocks,
            available_kv_cache_bytes_logged=log.available_kv_cache_bytes or log.kv_cache_memory_bytes,
            model_weights_bytes_logged=log.model_weights_bytes,
            engine_init_s=log.init_seconds,
            engine_failure_stage=log.failure.stage if log.failure else None,
            engine_error=log.failure.error if log.failure else None,
        )
    if prediction is not None:
        figures.update(
            kv_cache_tokens_predicted=prediction.kv_cache_tokens,
            max_concurrency_predicted=prediction.max_concurrency,
            num_blocks_predicted=prediction.num_blocks,
            prediction_matches_log=report.prediction_matches_log,
        )
    return {name: value for name, value in figures.items() if value is not None}


def _init(owner: str, project: str, run_uuid: str, offline_root: Path | None, name: str | None) -> Any:
    from polyaxon import tracking

    quiet = dict(track_code=False, track_env=False, track_logs=False, collect_resources=False)
    if managed_run_uuid():  # a managed run: Polyaxon already knows who we are
        return tracking.init(**quiet)
    offline_path = None if offline_root is None else str(offline_root.resolve() / "runs" / run_uuid)
    return polyaxon_call(
        f"cannot create a Polyaxon run in project '{owner}/{project}'",
        lambda: tracking.init(owner=owner, project=project, run_uuid=run_uuid, is_new=True, name=name,
                              is_offline=offline_root is not None, artifacts_path=offline_path, **quiet),
    )


def _split_project(project: str) -> tuple[str, str]:
    owner, _, name = project.rpartition("/")
    if not name:
        raise HarnessError(f"Polyaxon project '{project}' must be 'owner/name' or 'name'")
    return owner or DEFAULT_OWNER, name


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError:
        raise HarnessError(f"{path}: missing from the run record") from None
