"""The search against a server already running (`harness search --base-url`): no engine is started.

The engine's facts come from what the server gives (`vllm:cache_config_info` on /metrics) and, where the
user gives it, its start-up log ($HARNESS_SERVICE_LOG, as `harness run` takes it). Every probe is a run as
`harness run --base-url` leaves it: the figures, and with the log its limits and capacity beside them.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from harness.inventory.frozen import load_inventory
from harness.launch.experiment import attach_server_log, stated_limits
from harness.measure.run_options import RunOptions
from harness.search.driver import SearchPlan
from harness.search.facts import Sizing, server_facts
from harness.search.local import Configuration, LocalProbeRunner, LocalSearch, search_known
from harness.search.report import SearchResult


class ServerProbeRunner(LocalProbeRunner):
    """Probes as runs against a server this search did not start; tracked offline like the local ones."""

    def __init__(self, log_text: str | None, options: RunOptions, out: Path, *, project: str,
                 offline_root: Path | None) -> None:
        self.options, self.out, self.log_text = options, out, log_text
        self.project, self.offline_root = project, offline_root
        self.limits = stated_limits(log_text) if log_text else {}
        self.api_key = None  # the server's key is the caller's $VLLM_API_KEY, as for `harness run`

    def _engine_record(self, run_dir: Path) -> None:
        if self.log_text and self.options.base_url:
            attach_server_log(run_dir, self.log_text, self.options.base_url)


def search_server(base_url: str, log_text: str | None, max_num_seqs: int | None, plan: SearchPlan,
                  local: LocalSearch, *, announce: Callable[[str], None] = lambda line: None) -> SearchResult:
    """The load searched on the server at `base_url`, bracketed by the knee its stated capacity predicts."""
    sizing = Sizing(inventory=load_inventory(local.options.inventory), max_tokens=local.options.max_tokens,
                    max_num_seqs=max_num_seqs)
    facts = server_facts(base_url, log_text, sizing)
    runner = ServerProbeRunner(log_text, local.options.model_copy(update={"base_url": base_url}), local.out,
                               project=local.project, offline_root=local.offline_root)
    searched = search_known(Configuration(index=0, service_files=[], params={}, point={}), plan, runner, facts,
                            announce)
    return SearchResult(search_id=plan.search_id, configurations=[searched])
