"""The search on a Polyaxon API (`harness search --project`): the service started as `harness sweep` starts it,
every probe a harness job against it.

Per configuration: the service run is created and waited for until it is running (PolyaxonBackend, with
its deadline, its logs kept when it fails, and always stopped at the end); each probe is one run of the
harness job with `service_uuid` and the probe's load (PolyaxonProbeRunner), its record read back through
the API. The engine's capacity is known here only from a probe's record — the job reads the service's
start-up log and /metrics into its capacity.json — so the lowest load is measured first, the knee is
predicted from that record, and the search goes on as it does locally.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from harness.errors import HarnessError
from harness.launch.specs import render
from harness.launch.sweep import PointFailed, PolyaxonBackend
from harness.predict.population import KneePrediction
from harness.search.answer import EngineFacts, answer
from harness.search.driver import SearchPlan, SearchTrace, StepResult, run_search
from harness.search.facts import Sizing, predicted_knee, prediction_line, record_facts
from harness.search.local import Configuration, step_line
from harness.search.polyaxon_probes import PolyaxonProbeRunner
from harness.search.report import SearchedConfiguration, SearchResult


class ApiSearch(BaseModel):
    """Where the probes run: the project, the harness job and its values, the queue and the deadlines."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    project: str
    harness_files: list[Path]
    harness_params: dict[str, Any]
    queue: str | None
    running_deadline_s: float
    harness_deadline_s: float
    out: Path
    poll_s: float = 2.0


class FactsFromRecord:
    """The prediction made once the first step's record holds the engine's capacity; None where it does not."""

    def __init__(self, sizing: Sizing, point: dict[str, Any], plan: SearchPlan,
                 announce: Callable[[str], None]) -> None:
        self.sizing, self.point, self.largest, self.knob = sizing, point, plan.most_in_flight, plan.knob
        self.announce = announce
        self.facts: EngineFacts | None = None

    def predict(self, step: StepResult) -> KneePrediction | None:
        records = [Path(probe.run_dir) for probe in step.probes if not probe.invalid_reasons] or [
            Path(probe.run_dir) for probe in step.probes]
        try:
            self.facts = record_facts(records[-1], self.sizing)
        except HarnessError as error:
            self.announce(f"no prediction: {error}; the search bisects the range")
            return None
        prediction = predicted_knee(self.facts, self.largest)
        self.announce(prediction_line(self.point, prediction, self.facts, self.knob))
        return prediction


def search_on_api(searched: list[Configuration], plan: SearchPlan, api: ApiSearch, sizing: Sizing, *,
                  announce: Callable[[str], None] = lambda line: None) -> SearchResult:
    """Each configuration's service started once on the API, its load searched with harness jobs, stopped."""
    backend = PolyaxonBackend(api.project, searched[0].service_files, api.harness_files, api.harness_params,
                              queue=api.queue, running_deadline_s=api.running_deadline_s,
                              harness_deadline_s=api.harness_deadline_s, logs_dir=api.out / "logs",
                              poll_s=api.poll_s, announce=announce)
    results = [search_service(configuration, plan, api, backend, sizing, announce) for configuration in searched]
    return SearchResult(search_id=plan.search_id, configurations=results)


def search_service(configuration: Configuration, plan: SearchPlan, api: ApiSearch, backend: PolyaxonBackend,
                   sizing: Sizing, announce: Callable[[str], None]) -> SearchedConfiguration:
    """One service run, probed until the bracket closes; a service that never ran stops this search."""
    out = api.out / f"point-{configuration.index}" if configuration.point else api.out
    # the service's own input states max_num_seqs where its log (non-default arguments only) does not
    started_with = render(configuration.service_files, configuration.params).inputs.get("max_num_seqs")
    known = FactsFromRecord(sizing.model_copy(update={"max_num_seqs": started_with}), configuration.point,
                            plan, announce)
    try:
        with backend.service(configuration.index, configuration.params) as service:
            runner = PolyaxonProbeRunner(api.project, api.harness_files,
                                         {**api.harness_params, "service_uuid": service}, out=out,
                                         deadline_s=api.harness_deadline_s, queue=api.queue, poll_s=api.poll_s,
                                         announce=announce)
            trace = run_search(plan, runner, None, on_step=lambda step: announce(step_line(plan, step)),
                               predict_from=known.predict)
    except PointFailed as failed:
        trace = SearchTrace(plan=plan, prediction=None, steps=[], stopped_reason=failed.detail)
    return SearchedConfiguration(index=configuration.index, point=configuration.point, trace=trace,
                                 answer=answer(trace, known.facts))
