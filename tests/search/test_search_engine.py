"""The search on the real CPU engine, the demo's: the tiny model, 4 MiB of KV cache = 32 blocks of 128 tokens,
31 usable (vLLM keeps one as its null block), and requests of 600 prompt + 300 output tokens = 8 blocks each
at their largest.

So 3 requests hold 24 blocks and 4 need 32 > 31: the cache preempts from concurrency 4 with max_num_seqs 8,
and arrivals wait for blocks from 6 (5 requests part-way through their outputs hold about 31.6 blocks, see
harness/predict/queueing.py); with max_num_seqs 2 the third request waits for a seat instead. One search
over a two-point sweep of max_num_seqs (2 and 8) answers both knees on two engine starts; a third start
shows a stalled client's probe deciding nothing.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest
import yaml

from harness.measure.figures import RunSummary
from harness.measure.run_options import RunOptions
from harness.measure.schedule import LoadShape
from harness.search.driver import SearchPlan, StepResult
from harness.search.local import Configuration, LocalProbeRunner, LocalSearch, configurations, search_configurations
from harness.search.objective import Decision, PercentileObjective
from harness.search.probe import Knob, Probe
from harness.search.report import SearchResult, write_report

pytestmark = pytest.mark.engine
REPO_ROOT = Path(__file__).resolve().parents[2]
SWEEP = REPO_ROOT / "polyaxonfiles" / "demo-sweep-max-num-seqs.yaml"
SERVICE = REPO_ROOT / "polyaxonfiles" / "vllm-service.yaml"
PRESET = REPO_ROOT / "polyaxonfiles" / "presets" / "local-cpu.yaml"
INVENTORY = REPO_ROOT / "prompts" / "tiny-qwen3-600x8"
# The objective is p99 TTFT in this machine's unit (conftest.py `ttft_limit`): six lone prefills, between the
# running regime (prefills queued behind each other) and the waiting one (another request's whole output).


def search_plan(high: int, objective: PercentileObjective) -> SearchPlan:
    return SearchPlan(search_id="test", knob=Knob.CONCURRENCY, values=[float(v) for v in range(1, high + 1)],
                      objectives=[objective])


def local_search(out: Path) -> LocalSearch:
    options = RunOptions(inventory=INVENTORY, load=LoadShape(concurrency=1), base_url="http://127.0.0.1:1")
    return LocalSearch(options=options, out=out, project="local/search-test", offline_root=out / "polyaxon")


def two_point_sweep(tmp_path: Path) -> Path:
    """The demo's sweep file with two of its points, max_num_seqs 2 and 8."""
    sweep = yaml.safe_load(SWEEP.read_text(encoding="utf-8"))
    sweep["pathRef"] = str((SWEEP.parent / sweep["pathRef"]).resolve())
    sweep["matrix"]["values"] = [{"max_num_seqs": 2}, {"max_num_seqs": 8}]
    path = tmp_path / "sweep-max-num-seqs-2-8.yaml"
    path.write_text(yaml.safe_dump(sweep, sort_keys=False), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def swept(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path,
          ttft_limit: PercentileObjective) -> tuple[SearchResult, Path]:
    tmp_path = tmp_path_factory.mktemp("search-sweep")
    params = {"model": str(tiny_model_dir), "enable_prefix_caching": False, "inventory": str(INVENTORY)}
    searched = configurations([two_point_sweep(tmp_path), PRESET], SERVICE, params)
    result = search_configurations(searched, search_plan(6, ttft_limit), local_search(tmp_path / "out"))
    return result, tmp_path / "out"


def test_a_search_over_a_sweep_file_gives_one_capacity_per_point(swept, ttft_limit) -> None:
    result, out = swept
    assert [searched.point for searched in result.configurations] == [{"max_num_seqs": 2}, {"max_num_seqs": 8}]
    for searched in result.configurations:
        assert searched.trace.stopped_reason is None, searched.trace.stopped_reason  # e.g. a client stalled twice
        assert searched.answer.capacity is not None and searched.answer.first_short is not None
        # every probe is a run of its own, under its point, tracked offline with the search's tags
        for step in searched.trace.steps:
            for probe in step.probes:
                assert Path(probe.run_dir).parent == out / f"point-{searched.index}"
                assert (out / "polyaxon" / "runs" / probe.run_uuid / "run.plx.json").exists()
    markdown, plots = write_report(result, out / "report")
    text = markdown.read_text()
    assert text.count(f"max concurrency meeting {ttft_limit.words}") == 2 and len(plots) == 2


def test_the_sequence_cap_knee_is_found_named_and_moved(swept, ttft_limit) -> None:
    result, _ = swept
    capped = result.configurations[0]
    answer = capped.answer
    assert capped.trace.stopped_reason is None, capped.trace.stopped_reason
    # predicted: max_num_seqs 2 binds at 3 (the cache would hold 3: 24 blocks ≤ 31); two probes decide it
    assert capped.trace.prediction.knee_concurrency == 3 and capped.trace.prediction.bound_by == "max_num_seqs"
    assert [step.value for step in capped.trace.steps][:2] == [2.0, 3.0]
    assert answer.capacity == 2.0 and answer.first_short == 3.0
    assert answer.bound_by == "max_num_seqs (scheduling)"
    assert answer.first_short_reading.decision == Decision.FAILS
    assert answer.first_short_reading.low > ttft_limit.limit_ms
    # the cache holds 3 of these requests: 3 × 1,024 block-padded tokens = 3,072 ≤ 31 × 128 = 3,968
    assert answer.remedy.startswith("max_num_seqs 3: the cache holds 3 of these requests (3 × 1,024 block-padded "
                                    "tokens = 3,072 ≤ 3,968 usable)")
    assert answer.lines[0].startswith(f"max concurrency meeting {ttft_limit.words}: 2; at 3 p99 is ")


def test_the_kv_knee_is_found_named_with_its_blocks_and_moved(swept) -> None:
    result, _ = swept
    searched = result.configurations[1]
    answer, prediction = searched.answer, searched.trace.prediction
    assert searched.trace.stopped_reason is None, searched.trace.stopped_reason
    # predicted: arrivals wait from 6 (5 × 6.32 + 5 > 31 blocks), so the first probes are 5 and 6; preemption
    # from 4 (4 × 8 = 32 blocks > 31 usable)
    assert prediction.knee_concurrency == 6 and prediction.bound_by == "kv_cache"
    assert prediction.preemption_knee_concurrency == 4
    first, *rest = searched.trace.steps
    assert first.value == 5.0 and (first.decision != Decision.MEETS or rest[0].value == 6.0)  # 6 unless 5 fell
    # vLLM's own counter: preemptions at every load measured from 4 on, none below
    preempted = {step.value: step_preemptions(step) for step in searched.trace.steps}
    assert {value: count > 0 for value, count in preempted.items()} == {value: value >= 4 for value in preempted}
    assert answer.bound_by == "KV cache capacity" and answer.first_short >= 4
    short = int(answer.first_short)
    # at the first load short: `short` requests in flight × 8 blocks × 128 tokens, against 31 × 128 usable
    assert f"{short} × 1,024 block-padded tokens = {short * 1024:,} > 3,968 usable" in answer.cause
    # the next step needs short × 8 blocks + the null block, at 4 MiB / 32 blocks = 131,072 bytes each
    assert f"kv_cache_memory_bytes ≥ {(short * 8 + 1) * 131072:,} ({short * 8 + 1} blocks of 131,072 bytes" \
        in answer.remedy
    # loads tried, bracketed by the prediction: ⌈log2 6⌉ + 2; a load whose interval straddles the objective is
    # run again and pooled (driver.py, a step's repeats), so the runs may number more than the loads
    assert len(searched.trace.steps) <= 5
    assert all(len(step.probes) <= searched.trace.plan.max_repeats for step in searched.trace.steps)


def step_preemptions(step: StepResult) -> int:
    """vLLM's preemptions over a step's valid runs."""
    return sum(RunSummary.model_validate_json((Path(probe.run_dir) / "summary.json").read_text())
               .server.preemptions_during_run or 0 for probe in step.probes if not probe.invalid_reasons)


def spin_until(done: threading.Event) -> None:
    """Hold the interpreter until `done`, keeping nothing: each pass only asks the event."""
    while not done.is_set():
        pass


class StallingRunner(LocalProbeRunner):
    """The client's own process starved on step 2's first run: a busy thread that keeps the GIL for 0.5 s at a
    time, so the event loop that stamps every chunk runs late — a client stall, as a busy machine makes one."""

    def run(self, probe: Probe) -> Path:
        if (probe.step, probe.repeat) != (2, 1):
            return super().run(probe)
        done = threading.Event()
        interval = sys.getswitchinterval()
        sys.setswitchinterval(0.5)
        busy = threading.Thread(target=spin_until, args=(done,), daemon=True)
        busy.start()
        try:
            return super().run(probe)
        finally:
            done.set()
            busy.join()
            sys.setswitchinterval(interval)


def test_a_stalled_clients_probe_decides_nothing_and_is_measured_once_more(
    tmp_path: Path, tiny_model_dir: Path, ttft_limit: PercentileObjective
) -> None:
    configuration = Configuration(index=0, service_files=[SERVICE, PRESET], point={},
                                  params={"model": str(tiny_model_dir), "enable_prefix_caching": False})
    result = search_configurations([configuration], search_plan(4, ttft_limit), local_search(tmp_path),
                                   runner_class=StallingRunner)
    trace = result.configurations[0].trace
    assert len(trace.steps) >= 2, trace.stopped_reason  # the first step decided, on sound runs
    stalled = trace.steps[1]
    assert stalled.probes[0].invalid_reasons, "the busy thread did not stall the client"
    assert any("stalled" in reason or "late" in reason for reason in stalled.probes[0].invalid_reasons)
    assert stalled.probes[0].readings == []  # an invalid run is read for nothing
    # decided on the second run alone: the pooled figures count its requests, not the stalled run's
    assert len(stalled.probes) >= 2 and not stalled.probes[1].invalid_reasons
    assert stalled.decision is not None
    assert stalled.readings[0].requests == sum(reading.requests for probe in stalled.probes[1:]
                                               for reading in probe.readings)
