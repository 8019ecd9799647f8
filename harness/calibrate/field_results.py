"""What the field check finds, case by case: the logged-memory check, the before-launch check with its terms,
and the report that gathers them (built by `field_check.py`, printed by `field_report.py`)."""

from __future__ import annotations

from pydantic import BaseModel

from harness.predict.cache_margin import CacheMargin
from harness.predict.memory_model import MemoryConstants
from harness.predict.sampler_peak import SamplerPath
from harness.predict.warmup import WarmupCheck


class FigureCheck(BaseModel):
    name: str
    logged: float
    predicted_low: float
    predicted_high: float
    within: bool


class LoggedCheck(BaseModel):
    status: str  # "exact", "off", "bounded" (below what the fewer ranks it quotes hold), or why it is not scored
    figures: list[FigureCheck] = []
    fits: bool | None = None


class TermCheck(BaseModel):
    name: str
    predicted_bytes: int
    logged_bytes: int | None
    subtracted: bool


class LaunchCheck(BaseModel):
    status: str  # "scored" or why not
    held_back: bool
    terms: list[TermCheck] = []
    kv_bytes_predicted: int | None = None
    kv_bytes_logged: int | None = None
    kv_tokens_predicted: int | None = None
    kv_tokens_logged: int | None = None
    kv_tokens_residual: float | None = None  # (predicted − logged) / logged
    concurrency_predicted: float | None = None  # max_model_len requests the predicted cache holds
    concurrency_logged: float | None = None  # as the log prints it, else the release's arithmetic on its memory
    fits_predicted: bool | None = None
    cache_margin: CacheMargin | None = None  # one request's room in the predicted cache against the error band
    sampler_path: SamplerPath | None = None  # the formula that priced the sampler's warm-up, and its origin
    warmup: WarmupCheck | None = None  # the sampler's warm-up after the cache, with the log's graph figure


class SamplerFact(BaseModel):
    """V1's top-k/top-p sampler and where the figure came from: "log" (`evidence` is the line), "stated" (the
    case's `sampler:` fact), "default" (the release's code decides, from 0.11.1), "assumed" (DEFAULT_V1_SAMPLER)
    or "V0" (which always sorts)."""

    name: str
    source: str
    evidence: str | None = None


class CaseResult(BaseModel):
    id: str
    source: str
    source_key: str  # the thread or repository the split keeps on one side (field_split.py)
    release: str
    family: str
    gpu_family: str
    architecture: str
    sampler: SamplerFact
    started: bool
    cache_fit: bool  # whether a max_model_len request fitted the cache: what the fit / no-fit calls are scored on
    logged: LoggedCheck
    launch: LaunchCheck


class FieldReport(BaseModel):
    constants: MemoryConstants
    cases: list[CaseResult]
