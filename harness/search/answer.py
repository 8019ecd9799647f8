"""The answer a person acts on: the capacity with its interval, why the knee sits there, what would move it.

The cause is the diagnosis's verdict on the first load that fell short (analysis/diagnose.py's rules, with
the figures they decided on), or, where a rate search offered more than its --max-concurrency cap admits,
the cap itself (harness/search/cap.py); what would move it is quantified from the engine's own log and the
inventory's lengths: for the KV cache, the `kv_cache_memory_bytes` the next load needs (whole blocks of the
size the engine logged), and the `gpu_memory_utilization` that gives it where the GPU's memory is known;
for the sequence cap, the `max_num_seqs` the cache allows; for the client's cap, the one the server seats.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from analysis.diagnose import KV_CAPACITY, SCHEDULING, Verdict, diagnose_runs
from analysis.sources import read_run_directory
from analysis.table import build_table
from harness.predict.population import live_population, predict_knee
from harness.search.cap import CapReading, cap_reading
from harness.search.driver import SearchTrace, StepResult
from harness.search.objective import Decision, Reading
from harness.search.probe import Knob

KNOB_COLUMN = {Knob.CONCURRENCY: "concurrency", Knob.RATE: "rate_per_s"}
CAP_BOUND = "max_concurrency (the client's cap)"


class EngineFacts(BaseModel):
    """What the remedy needs from the engine searched: its logged blocks and their bytes, its limits, the
    inventory's requests at their largest, and the GPU's memory where it is known."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    num_gpu_blocks: int
    block_size: int
    max_num_seqs: int | None
    kv_cache_bytes: int | None  # the KV memory the blocks were cut from, as the engine logged it
    prompt_tokens: list[int]  # the inventory's requests: each prompt, and its output cap (or --max-tokens)
    output_tokens: list[int]
    conversation_ids: list[str | None] | None = None  # each request's conversation: its turns go in flight in turn
    gpu_memory_total_bytes: int | None = None
    gpu_memory_utilization: float | None = None

    @property
    def request_tokens(self) -> list[int]:
        """Each request at its largest: its prompt and its whole output."""
        return [prompt + output for prompt, output in zip(self.prompt_tokens, self.output_tokens, strict=True)]


class SearchAnswer(BaseModel):
    """The search's result in figures (units in the names) and the lines that say it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    knob: Knob
    objective: str
    capacity: float | None  # None: no load in the range met the objective
    capacity_reading: Reading | None
    first_short: float | None  # the lowest load that failed or stayed undecided; None: none in the range
    first_short_reading: Reading | None
    first_short_decision: Decision | None
    bound_by: str | None  # the diagnosis's verdict at the first load short of the objective
    cause: str | None
    remedy: str | None
    predicted_knee_concurrency: int | None
    predicted_bound_by: str | None
    top_of_range: float
    probes: int
    stopped_reason: str | None
    lines: list[str]


def number(value: float) -> str:
    """A figure for people: 17,078, 0.95, 2.5 — never 1.708e+04."""
    if float(value).is_integer():
        return f"{int(value):,}"
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:,.3g}"


def load_words(knob: Knob, value: float) -> str:
    """A load with its unit: a concurrency is a count of requests in flight, a rate is requests per second."""
    return f"{number(value)}{knob.unit}"


def reading_words(reading: Reading) -> str:
    unit = " ms" if reading.figure.split("_")[1:2] == ["ms"] else ""
    name = reading.figure.split("_ms_")[-1] if unit else "attainment"
    return (f"{name} is {number(reading.value)}{unit} [{number(reading.low)}–{number(reading.high)}] "
            f"over {reading.requests} requests")


def verdicts_by_run(trace: SearchTrace) -> dict[str, Verdict]:
    """The diagnosis of every valid probe, against the search's lowest load as its baseline."""
    dirs = [Path(probe.run_dir) for step in trace.steps for probe in step.probes if not probe.invalid_reasons]
    if not dirs:
        return {}
    table = build_table([read_run_directory(run_dir) for run_dir in dirs])
    return {verdict.run_uuid: verdict for verdict in diagnose_runs(table.frame, KNOB_COLUMN[trace.plan.knob])}


def answer(trace: SearchTrace, engine: EngineFacts | None) -> SearchAnswer:
    """The answer, its cause and its remedy; without the engine's facts, no remedy."""
    capacity, short = trace.capacity, trace.first_short
    bound_by, cause, remedy = knee_cause(trace, short, engine)
    prediction = trace.prediction
    result = SearchAnswer(
        knob=trace.plan.knob, objective=" and ".join(objective.words for objective in trace.plan.objectives),
        capacity=capacity.value if capacity else None, capacity_reading=_binding(capacity),
        first_short=short.value if short else None, first_short_reading=_binding(short),
        first_short_decision=short.decision if short else None, bound_by=bound_by, cause=cause, remedy=remedy,
        predicted_knee_concurrency=prediction.knee_concurrency if prediction else None,
        predicted_bound_by=prediction.bound_by.value if prediction else None,
        top_of_range=trace.plan.values[-1], probes=trace.probes_run, stopped_reason=trace.stopped_reason, lines=[])
    return result.model_copy(update={"lines": answer_lines(result)})


def knee_cause(trace: SearchTrace, short: StepResult | None,
               engine: EngineFacts | None) -> tuple[str | None, str | None, str | None]:
    """(bound_by, cause, remedy) at the first load short of the objective: the client's own cap where a rate
    search offered more than the cap admits (the server never saw the queue), else the diagnosis's verdict."""
    cap = cap_reading(trace, short)
    if cap is not None and cap.binds:
        return CAP_BOUND, cap_words(cap), cap_remedy(cap, engine)
    verdict = _verdict_at(short, verdicts_by_run(trace))
    if verdict is None:
        return None, None, None
    return verdict.bound_by, cause_words(verdict), remedy_words(verdict, engine)


def cap_words(cap: CapReading) -> str:
    from_free = "; ".join(reading_words(reading) for reading in cap.from_free_slot)
    return (f"{CAP_BOUND}: at {number(cap.rate_per_s)} requests/s {cap.waited_for_a_slot} of {cap.requests} measured "
            f"requests waited for a free slot (longest {number(cap.longest_slot_wait_ms)} ms); counted from when "
            f"each slot came free, {from_free}: the wait, not the server, breaks the objective; "
            f"{cap.max_concurrency} slots / {number(cap.server_time_s_mean)} s a request holds one = "
            f"{number(cap.admitted_per_s)} requests/s, the most the cap admits (runs {', '.join(cap.run_uuids)})")


def cap_remedy(cap: CapReading, engine: EngineFacts | None) -> str | None:
    """A cap as high as the server seats and the cache holds these requests at once, where that is higher."""
    if engine is None:
        return None
    fits = cache_holds(engine, max(cap.max_concurrency * 4, 64))
    seats = min(fits, engine.max_num_seqs or fits)
    if seats <= cap.max_concurrency:
        return (f"not the cap alone: the server seats {seats} of these requests at once (the cache holds {fits}, "
                f"max_num_seqs is {engine.max_num_seqs}), no more than the cap's {cap.max_concurrency}: more slots "
                "need the server's limits raised first")
    return (f"--max-concurrency {seats}: the cache holds {fits} of these requests at once and max_num_seqs is "
            f"{engine.max_num_seqs}; past that the server's limits bind")


def _verdict_at(step: StepResult | None, verdicts: dict[str, Verdict]) -> Verdict | None:
    if step is None:
        return None
    valid = [probe for probe in step.probes if not probe.invalid_reasons and probe.run_uuid in verdicts]
    return verdicts[valid[-1].run_uuid] if valid else None


def _binding(step: StepResult | None) -> Reading | None:
    """The reading that decided the step: the first objective that failed, else one undecided, else the first."""
    if step is None or not step.readings:
        return None
    for decision in (Decision.FAILS, Decision.UNDECIDED):
        found = [reading for reading in step.readings if reading.decision == decision]
        if found:
            return found[0]
    return step.readings[0]


def answer_lines(result: SearchAnswer) -> list[str]:
    lines = [headline(result)]
    if result.stopped_reason:
        lines.append(f"search stopped: {result.stopped_reason}")
    if result.bound_by:
        lines.append(f"the knee: {result.cause}")
    if result.remedy:
        lines.append(f"what would move it: {result.remedy}")
    predicted = "none in the range" if result.predicted_knee_concurrency is None else (
        f"{result.predicted_knee_concurrency:,} ({result.predicted_bound_by})")
    measured = "none in the range" if result.first_short is None else load_words(result.knob, result.first_short)
    if result.knob == Knob.RATE:  # the prediction is a population of requests in flight, not a rate
        predicted = f"concurrency {predicted} in flight, which does not bracket a rate search"
    else:
        predicted = f"concurrency {predicted}"
    lines.append(f"predicted knee {predicted}; measured knee {measured}; {result.probes} probes")
    return lines


def headline(result: SearchAnswer) -> str:
    knob, objective = result.knob.value, result.objective
    short, reading = result.first_short, result.first_short_reading
    at_short = ""
    if short is not None and reading is not None:
        undecided = " undecided:" if result.first_short_decision == Decision.UNDECIDED else ""
        at_short = f"; at {load_words(result.knob, short)}{undecided} {reading_words(reading)}"
    if result.capacity is None and short is None:
        return f"max {knob} meeting {objective}: not found, the search stopped before any load was decided"
    if result.capacity is None:
        return f"no {knob} in the range meets {objective}{at_short}"
    capacity = load_words(result.knob, result.capacity)
    if short is None:
        top = result.capacity_reading
        at_top = f"; at {capacity} {reading_words(top)}" if top else ""
        why = ("the top of the range: no load in it fell short" if result.capacity >= result.top_of_range
               else "the search stopped before any load fell short")
        return f"max {knob} meeting {objective}: at least {capacity}, {why}{at_top}"
    return f"max {knob} meeting {objective}: {capacity}{at_short}"


def cause_words(verdict: Verdict) -> str:
    """The verdict with the figures that show it: for the KV cache, the live population against the usable."""
    f = verdict.figures
    needed, usable = f.get("kv_tokens_needed_padded"), f.get("kv_cache_tokens_usable")
    if verdict.bound_by == KV_CAPACITY and needed and usable:
        in_flight = _in_flight(f)
        per = needed / in_flight
        sign = ">" if needed > usable else "≤"
        preempted = f.get("preemptions_during_run")
        return (f"{verdict.bound_by}: {number(in_flight)} × {number(per)} block-padded tokens = {number(needed)} "
                f"{sign} {number(usable)} usable" + (f"; {number(preempted)} preemptions" if preempted else "")
                + f" (run {verdict.run_uuid})")
    return f"{verdict.text} (run {verdict.run_uuid})"


def _in_flight(f: dict[str, Any]) -> float:
    concurrency = f.get("concurrency") or f.get("engine_running_requests_mean") or 1
    seqs = f.get("max_num_seqs")
    return min(concurrency, seqs) if seqs else concurrency


def remedy_words(verdict: Verdict | None, engine: EngineFacts | None) -> str | None:
    if verdict is None or engine is None:
        return None
    if verdict.bound_by == KV_CAPACITY and engine.kv_cache_bytes:
        return kv_remedy(verdict, engine)
    if verdict.bound_by == SCHEDULING:
        return sequence_remedy(verdict, engine)
    return None


def kv_remedy(verdict: Verdict, engine: EngineFacts) -> str:
    """The KV memory that holds the first short load's largest population: whole blocks, one more for the
    engine's null block, at the bytes per block the engine logged."""
    blocks, bytes_now = engine.num_gpu_blocks, engine.kv_cache_bytes or 0
    per_block = bytes_now // blocks
    in_flight = int(_in_flight(verdict.figures))
    population = live_population(engine.request_tokens, in_flight, block_size=engine.block_size,
                                 usable_blocks=blocks - 1, conversation_ids=engine.conversation_ids)
    needed_blocks = population.max_blocks + 1
    needed_bytes = needed_blocks * per_block
    words = (f"kv_cache_memory_bytes ≥ {needed_bytes:,} ({needed_blocks} blocks of {per_block:,} bytes, for "
             f"{in_flight} requests in flight; now {bytes_now:,} = {blocks} blocks)")
    total, utilization = engine.gpu_memory_total_bytes, engine.gpu_memory_utilization
    if total and utilization:
        raised = utilization + (needed_bytes - bytes_now) / total
        words += f", or gpu_memory_utilization ≥ {math.ceil(raised * 1000) / 1000:g} on this GPU"
    else:
        words += "; gpu_memory_utilization: no GPU memory total known on this device"
    return words


def cache_holds(engine: EngineFacts, largest: int) -> int:
    """How many of the inventory's requests the cache always holds at once, looking up to `largest`."""
    return predict_knee(engine.prompt_tokens, engine.output_tokens, block_size=engine.block_size,
                        usable_blocks=engine.num_gpu_blocks - 1, max_num_seqs=None, largest_concurrency=largest,
                        conversation_ids=engine.conversation_ids).always_fits_up_to_concurrency


def sequence_remedy(verdict: Verdict, engine: EngineFacts) -> str:
    """The largest max_num_seqs whose population always fits the cache."""
    seqs = verdict.figures.get("max_num_seqs")
    fits = cache_holds(engine, max(int(seqs or 1) * 4, 64))
    if seqs is not None and fits <= seqs:
        return (f"not max_num_seqs alone: the cache holds only {fits} of these requests at once, and "
                f"max_num_seqs is {number(seqs)}")
    per = max(math.ceil(tokens / engine.block_size) for tokens in engine.request_tokens) * engine.block_size
    usable_tokens = (engine.num_gpu_blocks - 1) * engine.block_size
    return (f"max_num_seqs {fits}: the cache holds {fits} of these requests ({fits} × {per:,} block-padded tokens "
            f"= {fits * per:,} ≤ {usable_tokens:,} usable); beyond that the KV cache binds")


def outputs(result: SearchAnswer) -> dict[str, Any]:
    """The search run's outputs: the answer, its figure and interval at the capacity and at the first short load."""
    knob = KNOB_COLUMN[result.knob]  # the unit in the name: concurrency, rate_per_s
    figures: dict[str, Any] = {
        f"capacity_{knob}": result.capacity, "capacity_bound_by": result.bound_by,
        "predicted_knee_concurrency": result.predicted_knee_concurrency, f"first_short_{knob}": result.first_short,
        "probes": result.probes, "search_stopped": result.stopped_reason}
    for where, reading in (("capacity", result.capacity_reading), ("first_short", result.first_short_reading)):
        if reading is not None:
            figures.update({f"{where}_{reading.figure}": reading.value, f"{where}_{reading.figure}_low": reading.low,
                            f"{where}_{reading.figure}_high": reading.high})
    return {name: value for name, value in figures.items() if value is not None}
