"""Which probes may decide a step: records written as `harness run` writes them, with a chosen fault."""

from __future__ import annotations

from pathlib import Path

from search_requests import request

from harness.measure.client import RequestRecord
from harness.measure.record import RunWriter, Slo
from harness.measure.stats import summarize
from harness.search.objective import PercentileObjective
from harness.search.validity import read_probe

TTFT = PercentileObjective(latency="ttft", percentile=99, limit_ms=500)


def written(run_dir: Path, records: list[RequestRecord]) -> Path:
    writer = RunWriter(run_dir)
    for record in records:
        writer.add_request(record)
    summary = summarize(records, [], slo=Slo(), offered_requests_per_s=None, offered_concurrency=len(records),
                        cold=False, max_dispatch_lag_ms=10.0).model_copy(update={"run_id": run_dir.name})
    writer.finish(records, summary)
    return run_dir


def stopped_for(record: RequestRecord, after_s: float, stop_s: float) -> RequestRecord:
    """The same request with every token after `after_s` held back `stop_s` longer."""
    times = [t + stop_s if t > after_s else t for t in record.chunk_times_s]
    return record.model_copy(update={"chunk_times_s": times, "end_s": times[-1]})


def test_a_probe_whose_server_stopped_decides_nothing(tmp_path: Path) -> None:
    # 8 requests, first token at 100 ms, then a token every 10 ms up to 200 ms; every stream hears nothing
    # for 3 s from 150 ms on: a 3.0 s silence with every stream open, over 50 × the 10 ms median gap and 1 s
    records = [stopped_for(request(i, 100.0), after_s=0.155, stop_s=3.0) for i in range(8)]
    probe = read_probe(written(tmp_path / "stopped", records), [TTFT], cold=False)
    assert not probe.valid
    assert any(reason.startswith("the server stopped: no token reached any stream for 3.0") for reason in
               probe.invalid_reasons), probe.invalid_reasons


def test_the_same_probe_without_the_stop_is_valid(tmp_path: Path) -> None:
    probe = read_probe(written(tmp_path / "paced", [request(i, 100.0) for i in range(8)]), [TTFT], cold=False)
    assert probe.valid, probe.invalid_reasons
