"""What a user chooses for one measured run, and the run record's config it resolves to.

`RunOptions` is the one description of `harness run`'s choices: the CLI maps its options onto it, the
library and the tests build it with only the fields they change. `build_run_config` resolves it against
the inventory and the environment (the service's in-cluster URL, the run's id, the default timeouts).
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from harness.errors import HarnessError, describe_option_error
from harness.inventory.frozen import Inventory, load_inventory
from harness.measure.record import DEFAULT_MAX_ERROR_FRACTION, RunConfig, Slo
from harness.measure.schedule import LoadShape
from harness.measure.timeouts import request_timeouts
from harness.polyaxon_client import managed_run_uuid
from harness.redact import refuse_url_credentials
from harness.server_url import ServerUrl, checked_server_url

LOAD_OPTION_NAMES = {"rate_per_s": "rate", "warmup_requests": "warmup"}  # `LoadShape` fields the CLI shortens
OPTION_NAMES = {**LOAD_OPTION_NAMES, "ttft_ms": "slo_ttft_ms", "tpot_ms": "slo_tpot_ms",
                "target_share": "slo_target_share"}  # fields → options


class RunOptions(BaseModel):
    """`harness run`'s options, one field each (`--max-tokens` is `max_tokens`), with the CLI's defaults."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    inventory: Path
    load: LoadShape
    base_url: ServerUrl | None = None
    # A Polyaxon run's UUID: it becomes part of the service's in-cluster host name.
    service_uuid: str | None = Field(None, pattern=r"^[0-9a-f]{32}$")
    service_port: int = Field(8000, ge=1, le=65535)
    max_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(0.0, ge=0)
    slo: Slo = Slo()
    cold: bool = False
    # Each /metrics scrape holds vLLM's API server (stats.MAX_SCRAPE_SHARE): every 1 s was 1.1-1.2 % of a run
    # on the CPU engine, over the share that qualifies a run's tails. Verdicts read histograms and counters.
    sample_interval_s: float = Field(5.0, gt=0)
    max_dispatch_lag_ms: float = Field(10.0, gt=0)  # a limit of 0 would make every run invalid
    max_error_fraction: float = Field(DEFAULT_MAX_ERROR_FRACTION, ge=0, le=1)
    read_timeout_s: float | None = None  # checked with the defaults they replace, in `request_timeouts`
    stall_timeout_s: float | None = None


def command_line_options(**values: object) -> RunOptions:
    """`RunOptions` from the command line's values (`load` a dict of `LoadShape`'s fields); a refused value
    is one line naming its option: '--max-tokens: Input should be greater than or equal to 1, not 0'."""
    try:
        load = LoadShape.model_validate(values.pop("load"))
        return RunOptions.model_validate({**values, "load": load})
    except ValidationError as error:
        raise HarnessError(describe_option_error(error, OPTION_NAMES)) from None


def build_run_config(options: RunOptions) -> tuple[RunConfig, Inventory]:
    """The record's config and the loaded inventory; the server is the URL, or the service's in-cluster one."""
    if options.base_url is None and options.service_uuid is None:
        raise HarnessError("give --base-url, --service-uuid, or both (the service's run, reached at the URL)")
    base_url = options.base_url
    if base_url is not None:
        refuse_url_credentials(base_url, "--base-url")
    if base_url is None:
        namespace = os.environ.get("POLYAXON_K8S_NAMESPACE", "polyaxon")
        base_url = f"http://plx-operation-{options.service_uuid}.{namespace}.svc:{options.service_port}"
        checked_server_url(base_url, f"POLYAXON_K8S_NAMESPACE={namespace!r} makes the service's URL")
    prompts = load_inventory(options.inventory)
    read_timeout_s, stall_timeout_s = request_timeouts(
        options.load, longest_output_tokens(options.max_tokens, prompts), options.read_timeout_s,
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


def longest_output_tokens(max_tokens: int | None, inventory: Inventory) -> int:
    return max_tokens or max(prompt.output_cap_tokens for prompt in inventory.prompts)
