"""The run record on disk: one directory per run.

    config.json        what was asked (load, inventory digest, SLOs, the run's wall-clock anchor)
    environment.json   what answered (harness, engine and model versions, image reference)
    requests.jsonl     one line per finished request, appended and flushed as it ends
    samples.jsonl      one line per /metrics scrape
    requests.parquet   the same requests as a table, written when the run ends
    summary.json       the figures and the validity verdict, written last

A run killed without warning still leaves requests.jsonl with every request that had finished.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pandas as pd
from pydantic import BaseModel, Field, ValidationError

from harness.errors import HarnessError, describe_validation_error
from harness.measure.client import RequestRecord
from harness.measure.run_options import DEFAULT_MAX_ERROR_FRACTION, Slo
from harness.measure.schedule import LoadShape
from harness.observe.server_metrics import MetricsSnapshot
from harness.paths import output_directory
from harness.redact import redact_text
from harness.schema import RunFile

RECORD_SCHEMA_VERSION = 1
# Any one of these makes a directory a run record that a new run must not write into.
RUN_FILES = {RunFile.CONFIG, RunFile.ENVIRONMENT, RunFile.ENGINE, RunFile.CAPACITY, RunFile.ENGINE_LOG, RunFile.SUMMARY,
             RunFile.REQUESTS, RunFile.REQUESTS_PARQUET, RunFile.SAMPLES, RunFile.TRACKING}


class RunConfig(BaseModel):
    schema_version: int = RECORD_SCHEMA_VERSION
    run_id: str
    base_url: str
    service_uuid: str | None = None
    inventory_path: str
    inventory_digest: str
    load: LoadShape
    max_tokens: int | None = None
    temperature: float
    slo: Slo
    cold: bool
    max_dispatch_lag_ms: float
    max_error_fraction: float = DEFAULT_MAX_ERROR_FRACTION
    read_timeout_s: float = Field(gt=0, description="longest wait for a request's first byte")
    stall_timeout_s: float = Field(gt=0, description="longest silence once a response has started")
    sample_interval_s: float
    clock_zero_unix_s: float | None = Field(None, description="wall clock at t=0 of the run's monotonic clock")


class Environment(BaseModel):
    schema_version: int = RECORD_SCHEMA_VERSION
    harness_version: str
    python_version: str
    engine_version: str | None
    served_model: str
    max_model_len: int | None
    image_reference: str | None
    model_revision: str | None


# No load run lasts a year: a sample stamped later than this on the run's clock is a damaged line.
LONGEST_RUN_S = 366 * 24 * 3600


class ServerSample(BaseModel):
    """One /metrics scrape at `t_s` on the run's clock; a failed scrape keeps its error, not a snapshot."""

    t_s: float = Field(ge=0, le=LONGEST_RUN_S)
    snapshot: MetricsSnapshot | None = None
    error: str | None = None
    # sent to body read: the longest the scrape can have held the server
    duration_s: float | None = Field(None, ge=0, le=LONGEST_RUN_S)


def run_dir_plan(run_dir: Path, *, force: bool = False) -> Path | None:
    """Refuse `run_dir` when it cannot be one run's home, writing nothing. Returns where `force` will move
    the run it holds, or None when it holds none: two runs' files never mix."""
    if run_dir.exists() and not run_dir.is_dir():
        raise HarnessError(f"--out {run_dir}: is a file, not a run directory")
    output_directory(run_dir, "--out")
    held = sorted(path.name for path in run_dir.glob("*") if path.name in RUN_FILES) if run_dir.is_dir() else []
    if not held:
        return None
    old_id = _recorded_run_id(run_dir)
    if not force:
        raise HarnessError(f"--out {run_dir}: already holds run {old_id or '(unknown id)'} ({', '.join(held)}); "
                           "give a new directory, or --force to move the old run aside")
    aside = run_dir.with_name(f"{run_dir.name}.replaced-{old_id or time.strftime('%Y%m%d-%H%M%S')}")
    if aside.exists():
        raise HarnessError(f"--force: cannot move {run_dir} aside, {aside} exists")
    return aside


@contextlib.contextmanager
def claimed_run_dir(run_dir: Path, *, force: bool = False) -> Iterator[Path | None]:
    """`run_dir` as an empty home for one run while the block runs; yields where an old run was moved (`force`).

    A block that ends in an error before anything was written (no server, a server that is not vLLM) leaves
    the disk as it found it: the folders made for the run are removed and a moved run is put back.
    """
    aside = run_dir_plan(run_dir, force=force)
    made = [folder for folder in (run_dir, *run_dir.parents) if not folder.exists()]
    if aside is not None:
        run_dir.rename(aside)
    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        yield aside
    except BaseException:
        if not any(run_dir.iterdir()):
            _undo_claim(run_dir, aside, made)
        raise


def _undo_claim(run_dir: Path, aside: Path | None, made: list[Path]) -> None:
    """Remove the empty folders `claimed_run_dir` made, deepest first, and move the old run back."""
    if aside is not None:
        run_dir.rmdir()
        aside.rename(run_dir)
        return
    for folder in made:
        with contextlib.suppress(OSError):  # a folder something else wrote into meanwhile stays
            folder.rmdir()


def read_run_config(run_dir: Path) -> RunConfig:
    """config.json, the one place it is parsed; a damaged one raises ValidationError for the caller to name."""
    try:
        text = (run_dir / RunFile.CONFIG).read_text(encoding="utf-8")
    except OSError:
        raise HarnessError(f"{run_dir / RunFile.CONFIG}: missing from the run record") from None
    except UnicodeDecodeError:
        raise HarnessError(f"{run_dir / RunFile.CONFIG}: not UTF-8 text; the record is damaged") from None
    return RunConfig.model_validate_json(text)


def _recorded_run_id(run_dir: Path) -> str | None:
    """The run a folder holds, by its config's id alone: enough to refuse writing over it or mixing runs."""
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError, RecursionError):
        return str(json.loads((run_dir / RunFile.CONFIG).read_text(encoding="utf-8"))["run_id"])
    return None


class RunWriter:
    """Appends requests and samples as they happen; `finish` adds the table and the summary.
    The record files must not exist yet: appending to another run's would mix two runs."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        run_dir.mkdir(parents=True, exist_ok=True)
        try:
            self.requests: IO[str] = open(run_dir / RunFile.REQUESTS, "x", encoding="utf-8")  # noqa: SIM115
            self.samples: IO[str] = open(run_dir / RunFile.SAMPLES, "x", encoding="utf-8")  # noqa: SIM115
        except FileExistsError as error:
            raise HarnessError(f"{error.filename}: already written by another run; use a new directory") from None

    def write_model(self, name: str, model: BaseModel) -> None:
        """Whole-file JSON with secrets masked, replaced atomically so a reader never sees half of it."""
        partial = self.run_dir / f".{name}.partial"
        partial.write_text(redact_text(model.model_dump_json(indent=2)), encoding="utf-8")
        os.replace(partial, self.run_dir / name)

    def add_request(self, record: RequestRecord) -> None:
        """An error's text is masked in the record itself, so the table written at the end matches."""
        if record.error is not None:
            record.error = redact_text(record.error)
        self.requests.write(record.model_dump_json() + "\n")
        self.requests.flush()

    def add_sample(self, sample: ServerSample) -> None:
        if sample.error is not None:
            sample.error = redact_text(sample.error)
        self.samples.write(sample.model_dump_json() + "\n")
        self.samples.flush()

    def finish(self, records: list[RequestRecord], summary: BaseModel) -> None:
        """`records` are the ones appended, kept in memory: re-reading the JSONL would only cost time."""
        self.requests.close()
        self.samples.close()
        rows = [record.model_dump(mode="json") for record in records]
        table = pd.DataFrame(rows, columns=list(RequestRecord.model_fields))
        table.to_parquet(self.run_dir / RunFile.REQUESTS_PARQUET, index=False)
        self.write_model(RunFile.SUMMARY, summary)


def read_jsonl_lines(path: Path) -> list[str]:
    """Complete lines only: a run killed mid-write may leave a partial last line, which is dropped."""
    return [line for _, line in numbered_jsonl_lines(path)]


def numbered_jsonl_lines(path: Path) -> list[tuple[int, str]]:
    """(line number, line) of every complete, non-blank line; bytes that are not UTF-8 are kept as U+FFFD, so
    the line holding them is refused by its model, with its number, instead of the whole file unread."""
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8", errors="replace").split("\n")
    return [(number, line) for number, line in enumerate(lines[:-1], start=1) if line.strip()]


def read_requests(run_dir: Path) -> list[RequestRecord]:
    """From the Parquet table when the run finished, else from the JSONL it appended while running."""
    parquet = run_dir / RunFile.REQUESTS_PARQUET
    try:
        if parquet.exists():
            rows = pd.read_parquet(parquet).to_dict(orient="records")
            return [RequestRecord.model_validate(_plain(row)) for row in rows]
        return [RequestRecord.model_validate_json(line) for line in read_jsonl_lines(run_dir / RunFile.REQUESTS)]
    except ValidationError as error:
        raise HarnessError(describe_validation_error(error, run_dir / RunFile.REQUESTS)) from None


def check_run_files(run_dir: Path) -> None:
    """A record's files belong to one run and are whole; anything else is one line naming the file.

    summary.json names its run: a config.json from another run beside it means two runs were mixed. A
    finished run's request table, its JSONL and its summary agree on the number of requests; a run without
    a summary may have lost the last line it was writing, and nothing else.
    """
    summary = _read_summary(run_dir / RunFile.SUMMARY)
    config_id = _recorded_run_id(run_dir)
    if summary.get("run_id") and config_id and summary["run_id"] != config_id:
        raise HarnessError(f"{run_dir}: summary.json is run {summary['run_id']} but config.json is run {config_id}; "
                           "two runs were written into one folder")
    jsonl = run_dir / RunFile.REQUESTS
    text = jsonl.read_text(encoding="utf-8", errors="replace") if jsonl.exists() else ""
    parquet = run_dir / RunFile.REQUESTS_PARQUET
    if summary and not parquet.exists():
        raise HarnessError(f"{parquet}: missing, though summary.json says the run finished")
    if summary and text and not text.endswith("\n"):
        raise HarnessError(f"{jsonl}: last line cut short, though summary.json says the run finished")
    complete = _check_request_lines(jsonl)
    if parquet.exists():
        _check_request_counts(run_dir, summary, rows=_parquet_rows(parquet), jsonl_rows=complete if text else None)


def _read_summary(summary_path: Path) -> dict:
    """The summary as a mapping; empty when the run never finished (no summary.json)."""
    if not summary_path.exists():
        return {}
    try:
        summary = json.loads(summary_path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as error:
        raise HarnessError(f"{summary_path}: not JSON ({error}); the record is damaged") from None
    if not isinstance(summary, dict):
        raise HarnessError(f"{summary_path}: JSON, but not a summary object; the record is damaged")
    return summary


def _check_request_lines(jsonl: Path) -> int:
    """Every complete line is a request record (a line cut short inside the file, too); returns their count."""
    lines = numbered_jsonl_lines(jsonl)
    for number, line in lines:
        try:
            RequestRecord.model_validate_json(line)
        except ValidationError as error:
            raise HarnessError(f"{jsonl}: line {number} is not a request record "
                               f"({error.errors()[0]['msg']})") from None
    return len(lines)


def _check_request_counts(run_dir: Path, summary: dict, *, rows: int, jsonl_rows: int | None) -> None:
    """The request table agrees with the summary's count and with the JSONL (None: no JSONL to agree with)."""
    parquet = run_dir / RunFile.REQUESTS_PARQUET
    if summary and rows != summary.get("requests_sent", rows):
        raise HarnessError(f"{parquet}: {rows} requests, but {RunFile.SUMMARY} says "
                           f"{summary['requests_sent']} were sent")
    if jsonl_rows is not None and rows != jsonl_rows:
        raise HarnessError(f"{run_dir}: {RunFile.REQUESTS} holds {jsonl_rows} requests but "
                           f"{RunFile.REQUESTS_PARQUET} {rows}; the record is truncated or mixes two runs")


def _parquet_rows(path: Path) -> int:
    """The row count from the footer: a half-written file has none."""
    import pyarrow.parquet

    try:
        return pyarrow.parquet.read_metadata(path).num_rows
    except (OSError, pyarrow.ArrowException) as error:
        raise HarnessError(f"{path}: not a readable Parquet table ({error}); half-written?") from None


def read_samples(run_dir: Path) -> list[ServerSample]:
    """Every complete line of samples.jsonl; a damaged one is one line naming the file and the line."""
    samples = []
    for number, line in numbered_jsonl_lines(run_dir / RunFile.SAMPLES):
        try:
            samples.append(ServerSample.model_validate_json(line))
        except ValidationError as error:
            raise HarnessError(f"{run_dir / RunFile.SAMPLES}: line {number} is not a server sample "
                               f"({error.errors()[0]['msg']})") from None
    return samples


def _plain(row: dict) -> dict:
    """Parquet hands back numpy arrays for list columns and NaN for missing numbers."""
    plain = {}
    for key, value in row.items():
        if hasattr(value, "tolist"):
            value = value.tolist()
        elif isinstance(value, float) and value != value:
            value = None
        plain[key] = value
    return plain

