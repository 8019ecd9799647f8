"""What a user chooses for one measured run, and the run record's config it resolves to.

`RunOptions` declares each of `harness run`'s choices once: its default, its constraints and its help (the
field's description), which the CLI's options read. The library and the tests build it with keyword
arguments, naming only the fields they change; a refusal names the field (the CLI turns it into the flag).
`build_run_config` resolves it against the inventory and the environment: the service's in-cluster URL,
the run's id, and the request timeouts, here and nowhere else.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field, model_validator

from harness.errors import fields_rule
from harness.measure.schedule import LoadShape
from harness.measure.timeouts import READY_TIMEOUT_S, PositiveSeconds, request_timeouts
from harness.polyaxon_client import managed_run_uuid
from harness.redact import refuse_url_credentials
from harness.server_url import ServerUrl, checked_server_url

if TYPE_CHECKING:
    from harness.inventory.frozen import Inventory
    from harness.measure.record import RunConfig

# Above this share of failed requests the figures describe a failing server, not a loaded one
# (load tools commonly fail a test at 5 %).
DEFAULT_MAX_ERROR_FRACTION = 0.05


class Slo(BaseModel):
    """Service-level objectives for goodput; a request meets them when it meets every one set."""

    ttft_ms: float | None = Field(None, gt=0, description="goodput SLO on time to first token, ms")
    tpot_ms: float | None = Field(None, gt=0, description="goodput SLO on time per output token, ms")


class RunOptions(BaseModel):
    """`harness run`'s options, one field each (`--max-tokens` is `max_tokens`), with the CLI's defaults."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    inventory: Path = Field(description="prompt inventory directory")
    load: LoadShape
    base_url: ServerUrl | None = Field(None, description="server base URL, e.g. http://127.0.0.1:8000")
    # A Polyaxon run's UUID: it becomes part of the service's in-cluster host name.
    service_uuid: str | None = Field(None, pattern=r"^[0-9a-f]{32}$", description="Polyaxon service run measured "
                                     "(reached in-cluster unless --base-url says where)")
    service_port: int = Field(8000, ge=1, le=65535, description="port of the Polyaxon service")
    max_tokens: int | None = Field(None, ge=1, description="output cap for every request (default: the inventory's)")
    temperature: float = Field(0.0, ge=0, description="sampling temperature sent with every request")
    slo: Slo = Slo()
    cold: bool = Field(False, description="declare the run cold: prefix-cache hits make it invalid")
    # Each /metrics scrape holds vLLM's API server (stats.MAX_SCRAPE_SHARE): every 1 s was 1.1-1.2 % of a run
    # on the CPU engine, over the share that qualifies a run's tails. Verdicts read histograms and counters.
    sample_interval_s: float = Field(5.0, gt=0, description="seconds between /metrics scrapes (each holds vLLM's "
                                     "API server a few ms)")
    max_dispatch_lag_ms: float = Field(10.0, gt=0,  # a limit of 0 would make every run invalid
                                       description="p99 dispatch lag above which the run is invalid")
    max_error_fraction: float = Field(DEFAULT_MAX_ERROR_FRACTION, ge=0, le=1,
                                      description="share of failed requests above which the run is invalid")
    read_timeout_s: PositiveSeconds | None = Field(None, description="longest wait for a request's first byte, s "
                                                   "(default: 60 + every request in flight producing its cap at "
                                                   "40 tokens/s)")
    stall_timeout_s: PositiveSeconds | None = Field(None, description="no byte for this long once a response "
                                                    "started ends the request as 'stalled' (at most 5% later), s "
                                                    "(default: 30 + 0.1 per request in flight)")
    ready_timeout_s: PositiveSeconds = Field(READY_TIMEOUT_S, description="seconds to wait for the server's /health "
                                             "(progress on stderr; a server that answers but is not vLLM fails "
                                             "at once)")

    @model_validator(mode="after")
    def one_server(self) -> RunOptions:
        if self.base_url is None and self.service_uuid is None:
            raise fields_rule("give {url}, {service}, or both (the service's run, reached at the URL)",
                              url="base_url", service="service_uuid")
        return self


def build_run_config(options: RunOptions) -> tuple[RunConfig, Inventory]:
    """The record's config and the loaded inventory; the server is the URL, or the service's in-cluster one."""
    # Imported here: the CLI reads its options' declarations from this module at start-up, and the record
    # (pandas, the HTTP client) and the inventory are needed only once a run is built.
    from harness.inventory.frozen import load_inventory
    from harness.inventory.output_cap import longest_output_cap_tokens
    from harness.measure.record import RunConfig

    base_url = options.base_url
    if base_url is not None:
        refuse_url_credentials(base_url, "base_url")
    if base_url is None:
        namespace = os.environ.get("POLYAXON_K8S_NAMESPACE", "polyaxon")
        base_url = f"http://plx-operation-{options.service_uuid}.{namespace}.svc:{options.service_port}"
        checked_server_url(base_url, f"POLYAXON_K8S_NAMESPACE={namespace!r} makes the service's URL")
    prompts = load_inventory(options.inventory)
    read_timeout_s, stall_timeout_s = request_timeouts(
        options.load, longest_output_cap_tokens(prompts, options.max_tokens), options.read_timeout_s,
        options.stall_timeout_s)
    config = RunConfig(
        run_id=managed_run_uuid() or uuid.uuid4().hex,  # inside Polyaxon, the record's id is the run's
        base_url=base_url.rstrip("/"),
        service_uuid=options.service_uuid,
        inventory_path=str(options.inventory),
        inventory_digest=prompts.digest,
        load=options.load,
        max_tokens=options.max_tokens,
        temperature=options.temperature,
        slo=options.slo,
        cold=options.cold,
        max_dispatch_lag_ms=options.max_dispatch_lag_ms,
        max_error_fraction=options.max_error_fraction,
        read_timeout_s=read_timeout_s,
        stall_timeout_s=stall_timeout_s,
        sample_interval_s=options.sample_interval_s,
    )
    return config, prompts
