"""Whether a probe's run measured the server well enough to decide a step of the search.

The run's own checks come first (its summary's `invalid_reasons`: a client that fell behind or stalled,
requests that failed, a sampler that missed its ticks, a cold run that hit the prefix cache). A search adds
what its objectives need: a per-token objective cannot be judged on tokens the server delivered in bursts,
no objective on a run in which the server stopped (a silence on every stream: the figures then measure the
stop, not the load; the run keeps it as a qualification), a cold search on a run whose prefix cache hit, and
no objective on a run with no measured request.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from harness.errors import HarnessError
from harness.measure.client import RequestRecord
from harness.measure.record import read_requests
from harness.measure.stats import RunSummary
from harness.schema import RunFile
from harness.search.objective import AttainmentObjective, Objective, PercentileObjective


class ProbeRecord(BaseModel):
    """What a search reads of one probe's run: its requests, and why it cannot decide anything, if it cannot."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    run_dir: str
    run_uuid: str
    requests: list[RequestRecord]
    invalid_reasons: list[str]

    @property
    def valid(self) -> bool:
        return not self.invalid_reasons


def read_probe(run_dir: Path, objectives: Sequence[Objective], *, cold: bool) -> ProbeRecord:
    """The probe's record and its validity for these objectives; a run that left no summary is invalid."""
    summary_path = run_dir / RunFile.SUMMARY
    if not summary_path.exists():
        return ProbeRecord(run_dir=str(run_dir), run_uuid=run_dir.name, requests=[],
                           invalid_reasons=[f"the probe's run left no summary in {run_dir}"])
    try:
        summary = RunSummary.model_validate_json(summary_path.read_text(encoding="utf-8"))
    except ValueError as error:
        raise HarnessError(f"{summary_path}: not a run summary: {str(error).splitlines()[0]}") from None
    requests = read_requests(run_dir)
    return ProbeRecord(run_dir=str(run_dir), run_uuid=summary.run_id or run_dir.name, requests=requests,
                       invalid_reasons=probe_problems(summary, requests, objectives, cold=cold))


def probe_problems(summary: RunSummary, requests: Sequence[RequestRecord], objectives: Sequence[Objective], *,
                   cold: bool) -> list[str]:
    """Every reason the probe cannot decide a step, each naming its figure."""
    reasons = list(summary.invalid_reasons)
    if not any(not record.warmup for record in requests):
        reasons.append("no measured request: every request was a warm-up request")
    pacing = summary.pacing
    if _needs_paced_tokens(objectives) and pacing.per_token_latency_paced is False:
        reasons.append(f"a per-token objective on tokens delivered in bursts: burst_token_fraction "
                       f"{pacing.burst_token_fraction:.2f}, requests_burst_delivered "
                       f"{pacing.requests_burst_delivered}")
    if pacing.server_went_silent:
        reasons.append(f"the server stopped: no token reached any stream for {pacing.stream_silence_s_max:.2f} s "
                       f"(stream_silence_s_max) while streams were open")
    hits = summary.server.prefix_cache_hits_during_run_tokens
    if cold and hits and not any("prefix cache" in reason for reason in reasons):
        reasons.append(f"a cold search on a warm cache: the prefix cache hit {hits} tokens")
    return reasons


def _needs_paced_tokens(objectives: Sequence[Objective]) -> bool:
    return any((isinstance(objective, PercentileObjective) and objective.latency == "tpot")
               or (isinstance(objective, AttainmentObjective) and objective.tpot_ms is not None)
               for objective in objectives)
