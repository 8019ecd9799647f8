"""`--concurrency` and `--inventory` reach the client as typed objects, never as dicts on the way.

The hops, each a pydantic model or a dataclass: harness/cli/measure.py:run_command builds `LoadShape` and
`RunOptions` → harness/measure/run_options.py:build_run_config gives `RunConfig` (its `load: LoadShape`) and the
loaded `Inventory` → harness/launch/experiment.py:measure → harness/measure/runner.py:run_load, whose
_client_settings sizes `ClientSettings.pool_size` from the load → harness/measure/dispatch.py:send_all runs
`config.load.concurrency` workers, each turning an `InventoryPrompt` into the `PromptRequest` the client sends.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import cast

import pytest
from typer.testing import CliRunner

from harness.cli import app
from harness.inventory.build import build_token_id_inventory
from harness.inventory.frozen import Inventory, TokenIdRecipe, VocabularyRange, write_inventory
from harness.measure.client import PromptRequest, RequestRecord, StreamingClient
from harness.measure.dispatch import send_all
from harness.measure.record import RunConfig
from harness.measure.runner import _client_settings
from harness.measure.schedule import LoadShape


class RecordingClient:
    """Stands in for `StreamingClient`: keeps every request it is handed and the most it held at once."""

    def __init__(self) -> None:
        self.sent: list[PromptRequest] = []
        self.in_flight = 0
        self.most_in_flight = 0

    def now(self) -> float:
        return time.perf_counter()

    async def send(self, request: PromptRequest, scheduled_s: float | None = None) -> RequestRecord:
        self.sent.append(request)
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        await asyncio.sleep(0.01)
        self.in_flight -= 1
        now = self.now()
        return RequestRecord(index=request.index, prompt_id=request.prompt_id, warmup=request.warmup,
                             max_tokens=request.max_tokens, scheduled_s=now, dispatch_s=now, end_s=now)


@pytest.fixture
def inventory_dir(tmp_path: Path) -> Path:
    recipe = TokenIdRecipe(vocabulary=VocabularyRange(low=10, high=1900), prompt_tokens=[8, 12] * 3,
                           output_cap_tokens=[20] * 6, seed=0)
    return write_inventory(build_token_id_inventory("typed-6", recipe), tmp_path / "inventory")


def test_concurrency_and_inventory_reach_the_client_typed(
    inventory_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    handed: list[tuple[object, object]] = []

    def measure(config: object, inventory: object, run_dir: Path, **_: object) -> tuple[None, None]:
        handed.append((config, inventory))
        return None, None  # as an engine that did not start: the command ends there (exit 1)

    monkeypatch.setattr("harness.launch.experiment.measure", measure)
    result = CliRunner().invoke(app, ["run", "--inventory", str(inventory_dir), "--out", str(tmp_path / "run"),
                                      "--base-url", "http://127.0.0.1:9", "--concurrency", "3", "--max-tokens", "5"])
    assert result.exit_code == 1, result.output
    ((config, inventory),) = handed
    assert isinstance(config, RunConfig) and isinstance(config.load, LoadShape) and isinstance(inventory, Inventory)
    assert (config.load.concurrency, config.max_tokens, config.inventory_digest) == (3, 5, inventory.digest)
    assert config.inventory_path == str(inventory_dir)

    assert _client_settings(config, "served", None).pool_size == 3  # one connection per request in flight
    client = RecordingClient()
    records: list[RequestRecord] = []
    asyncio.run(send_all(config, inventory, cast(StreamingClient, client), records.append))
    # one pass over the 6 prompts, by 3 workers: 3 in flight at most, every request with --max-tokens' 5 and
    # the inventory prompt's own token ids
    assert [request.prompt_id for request in client.sent] == [prompt.prompt_id for prompt in inventory.prompts]
    assert client.most_in_flight == 3 and len(records) == 6
    assert all(isinstance(request, PromptRequest) and request.max_tokens == 5 for request in client.sent)
    assert [request.token_ids for request in client.sent] == [prompt.token_ids for prompt in inventory.prompts]
