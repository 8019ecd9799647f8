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

import os
from pathlib import Path
from typing import IO

import pandas as pd
from pydantic import BaseModel, Field, ValidationError

from harness.client import RequestRecord
from harness.errors import HarnessError, describe_validation_error
from harness.schedule import LoadShape
from harness.server_metrics import MetricsSnapshot

RECORD_SCHEMA_VERSION = 1
REQUESTS_JSONL = "requests.jsonl"
REQUESTS_PARQUET = "requests.parquet"
SAMPLES_JSONL = "samples.jsonl"


class Slo(BaseModel):
    """Service-level objectives for goodput; a request meets them when it meets every one set."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None


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


class ServerSample(BaseModel):
    """One /metrics scrape at `t_s` on the run's clock; a failed scrape keeps its error, not a snapshot."""

    t_s: float
    snapshot: MetricsSnapshot | None = None
    error: str | None = None


class RunWriter:
    """Appends requests and samples as they happen; `finish` adds the table and the summary."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        run_dir.mkdir(parents=True, exist_ok=True)
        self.requests: IO[str] = open(run_dir / REQUESTS_JSONL, "a", encoding="utf-8")  # noqa: SIM115
        self.samples: IO[str] = open(run_dir / SAMPLES_JSONL, "a", encoding="utf-8")  # noqa: SIM115

    def write_model(self, name: str, model: BaseModel) -> None:
        """Whole-file JSON, replaced atomically so a reader never sees half of it."""
        partial = self.run_dir / f".{name}.partial"
        partial.write_text(model.model_dump_json(indent=2), encoding="utf-8")
        os.replace(partial, self.run_dir / name)

    def add_request(self, record: RequestRecord) -> None:
        self.requests.write(record.model_dump_json() + "\n")
        self.requests.flush()

    def add_sample(self, sample: ServerSample) -> None:
        self.samples.write(sample.model_dump_json() + "\n")
        self.samples.flush()

    def finish(self, records: list[RequestRecord], summary: BaseModel) -> None:
        """`records` are the ones appended, kept in memory: re-reading the JSONL would only cost time."""
        self.requests.close()
        self.samples.close()
        rows = [record.model_dump(mode="json") for record in records]
        table = pd.DataFrame(rows, columns=list(RequestRecord.model_fields))
        table.to_parquet(self.run_dir / REQUESTS_PARQUET, index=False)
        self.write_model("summary.json", summary)


def read_jsonl_lines(path: Path) -> list[str]:
    """Complete lines only: a run killed mid-write may leave a partial last line, which is dropped."""
    if not path.exists():
        return []
    text = path.read_text(encoding="utf-8")
    lines = text.split("\n")
    return [line for line in lines[:-1] if line.strip()]


def read_requests(run_dir: Path) -> list[RequestRecord]:
    """From the Parquet table when the run finished, else from the JSONL it appended while running."""
    parquet = run_dir / REQUESTS_PARQUET
    try:
        if parquet.exists():
            rows = pd.read_parquet(parquet).to_dict(orient="records")
            return [RequestRecord.model_validate(_plain(row)) for row in rows]
        return [RequestRecord.model_validate_json(line) for line in read_jsonl_lines(run_dir / REQUESTS_JSONL)]
    except ValidationError as error:
        raise HarnessError(describe_validation_error(error, run_dir / REQUESTS_JSONL)) from None


def read_samples(run_dir: Path) -> list[ServerSample]:
    return [ServerSample.model_validate_json(line) for line in read_jsonl_lines(run_dir / SAMPLES_JSONL)]


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

