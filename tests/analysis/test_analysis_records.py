"""The sources read run records (directories, an offline root, the Polyaxon API) back into one table."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from analysis.sources import (
    collect_runs,
    runs_from_directories,
    runs_from_offline_root,
    runs_from_polyaxon,
)
from analysis.table import build_table
from harness.errors import HarnessError
from harness.schema import RunFile
from harness.track.tracking import track_run

from conftest import create_project
from run_records import STARVED_LOG, write_failed_run, write_run


def test_run_directories_land_in_one_table_keyed_by_uuid(tmp_path: Path) -> None:
    fast = write_run(tmp_path / "sweep", limits={"max_num_seqs": 2}, samples=[(0, 1, 0.1, 0), (3, 2, 0.2, 0)])
    slow = write_run(tmp_path / "sweep" / "nested", limits={"max_num_seqs": 8}, ttft_ms=80.0)
    failed = write_failed_run(tmp_path / "sweep")
    (tmp_path / "sweep" / "model").mkdir()
    (tmp_path / "sweep" / "model" / "config.json").write_text("{}")  # a model's config is not a run

    table = build_table(runs_from_directories([tmp_path / "sweep"]))
    assert sorted(table.frame.index) == sorted([fast.name, slow.name, failed.name])
    assert table.frame.loc[fast.name, "max_num_seqs"] == 2 and table.frame.loc[slow.name, "max_num_seqs"] == 8
    assert "max_num_seqs" in table.input_columns and "ttft_ms_p99" not in table.input_columns
    assert table.frame.loc[slow.name, "ttft_ms_p99"] == pytest.approx(80.0)
    assert table.frame.loc[fast.name, "peak_running_requests"] == 2  # the largest running count scraped
    assert table.frame.loc[fast.name, "kv_cache_tokens_logged"] == 1_048_576  # "CPU KV cache size: 1,048,576 tokens"
    assert table.frame.loc[fast.name, "kv_cache_tokens_predicted"] == 1_048_576  # 1 GiB / 1,024 bytes per token
    assert not table.frame.loc[failed.name, "engine_started"]
    assert list(table.series[fast.name]["waiting_requests"]) == [0, 3]


def test_offline_root_reads_the_same_figures_as_the_directories(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "runs", samples=[(0, 2, 0.1, 0), (2, 4, 0.5, 1), (1, 4, 0.3, 1)])
    track_run(run_dir, project="local/analysis", offline_root=tmp_path / "offline")
    from_dirs = build_table(runs_from_directories([tmp_path / "runs"]))
    offline = build_table(runs_from_offline_root(tmp_path / "offline"))
    assert list(offline.frame.index) == [run_dir.name]
    for column in ("ttft_ms_p99", "tpot_ms_p50", "requests_per_s", "kv_cache_tokens_logged", "max_num_seqs",
                   "preemptions_during_run", "peak_running_requests"):
        expected = from_dirs.frame.loc[run_dir.name, column]
        assert offline.frame.loc[run_dir.name, column] == pytest.approx(expected), column
    assert set(offline.input_columns) == set(from_dirs.input_columns)
    assert list(offline.series[run_dir.name]["running_requests"]) == [2, 4, 4]
    assert list(offline.series[run_dir.name]["t_s"]) == [0, 1, 2]  # one scrape a second


def test_harness_run_joins_its_service_run_capacity(tmp_path: Path) -> None:
    service = write_failed_run(tmp_path, log=STARVED_LOG)  # a service run: limits and captured capacity only
    harness_run = write_run(tmp_path, log=None, service_uuid=service.name)
    (harness_run / RunFile.ENGINE).unlink()
    table = build_table(runs_from_directories([tmp_path]))
    assert list(table.frame.index) == [harness_run.name]
    assert table.frame.loc[harness_run.name, "kv_cache_tokens_logged"] == 4_096
    assert table.frame.loc[harness_run.name, "max_num_seqs"] == 4
    assert "max_num_seqs" in table.input_columns


def test_bad_sources_are_one_line_naming_the_file(tmp_path: Path) -> None:
    with pytest.raises(HarnessError, match=f"no run records found in --runs {tmp_path}"):
        collect_runs([tmp_path])
    with pytest.raises(HarnessError, match=r"--runs .*missing: no such directory"):
        runs_from_directories([tmp_path / "missing"])
    run_dir = write_run(tmp_path)
    summary = json.loads((run_dir / "summary.json").read_text())
    summary["requests_ok"] = "many"
    (run_dir / "summary.json").write_text(json.dumps(summary))
    with pytest.raises(HarnessError, match=r"summary\.json: field 'requests_ok'"):
        runs_from_directories([tmp_path])
    (run_dir / "summary.json").unlink()
    (run_dir / "engine.json").write_text('{"limits": [1, 2]}')
    with pytest.raises(HarnessError, match=r"engine\.json: field 'limits'"):
        runs_from_directories([tmp_path])
    (run_dir / "config.json").write_text("{not json")
    with pytest.raises(HarnessError, match=r"config\.json"):
        runs_from_directories([tmp_path])
    with pytest.raises(HarnessError, match="not a Polyaxon offline root"):
        runs_from_offline_root(tmp_path)


@pytest.mark.parametrize("name", [RunFile.CONFIG, RunFile.ENGINE, RunFile.CAPACITY])
def test_a_record_file_that_is_not_text_is_one_line_naming_it(tmp_path: Path, name: str) -> None:
    run_dir = write_run(tmp_path)
    (run_dir / name).write_bytes(b"\xff\xfe" + (run_dir / name).read_bytes()[2:])  # a UTF-16 mark: not UTF-8
    with pytest.raises(HarnessError, match=rf"{name}: not UTF-8 text; the record is damaged$"):
        runs_from_directories([tmp_path])


def test_a_figure_no_table_column_holds_is_refused_naming_it(tmp_path: Path) -> None:
    """500 nines as the count of measured requests: pydantic reads the text as a whole number, which no float nor
    64-bit integer holds; the table is refused naming the run and the figure instead of pandas overflowing."""
    run_dir = write_run(tmp_path)
    summary = json.loads((run_dir / "summary.json").read_text())
    (run_dir / "summary.json").write_text(json.dumps({**summary, "requests_measured": "9" * 500}))
    with pytest.raises(HarnessError) as refused:
        build_table(runs_from_directories([tmp_path]))
    assert str(refused.value) == (f"{run_dir}: requests_measured is {'9' * 20}… (500 characters), past any figure a "
                                  "run records (a 64-bit integer); the record is damaged")
    # the same digits as a rate: pydantic reads them as a float, which they overflow to infinity
    (run_dir / "summary.json").write_text(json.dumps({**summary, "output_tokens_per_s": "9" * 500}))
    with pytest.raises(HarnessError, match=r"output_tokens_per_s is infinite, which no run records; the record is "
                                           r"damaged$"):
        build_table(runs_from_directories([tmp_path]))


@pytest.mark.sandbox
def test_polyaxon_api_runs_read_back_with_their_series_and_query(tmp_path: Path, polyaxon_api: str) -> None:
    create_project("analysis-api")
    two = write_run(tmp_path / "runs", limits={"max_num_seqs": 2}, samples=[(1, 2, 0.1, 0), (0, 2, 0.2, 0)])
    four = write_run(tmp_path / "runs", limits={"max_num_seqs": 4}, ttft_ms=75.0, samples=[(0, 3, 0.1, 0)])
    two_uuid, four_uuid = (track_run(run_dir, project="default/analysis-api").run_uuid for run_dir in (two, four))

    table = build_table(runs_from_polyaxon("default/analysis-api"))
    assert sorted(table.frame.index) == sorted([two_uuid, four_uuid])
    assert table.frame.loc[four_uuid, "ttft_ms_p99"] == pytest.approx(75.0)
    assert table.frame.loc[two_uuid, "peak_running_requests"] == 2
    assert table.frame.loc[four_uuid, "peak_running_requests"] == 3
    assert table.frame.loc[two_uuid, "kv_cache_tokens_logged"] == 1_048_576
    assert "max_num_seqs" in table.input_columns and "ttft_ms_p99" not in table.input_columns
    assert list(table.series[two_uuid]["waiting_requests"]) == [1, 0]

    queried = runs_from_polyaxon("default/analysis-api", query="inputs.max_num_seqs: 4")
    assert [run.run_uuid for run in queried] == [four_uuid]
    with pytest.raises(HarnessError, match="cannot read runs of Polyaxon project 'default/no-such-project'"):
        runs_from_polyaxon("default/no-such-project")


def test_the_api_reader_asks_again_while_polyaxon_is_busy(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sandbox answers 405 while it compiles what it was just sent; the report reads on once it is free."""
    import polyaxon.client
    from polyaxon.exceptions import ApiException

    from harness import polyaxon_client

    busy = {"list", "get_metrics"}  # the calls still to be refused once

    class BusyOnce:
        """A project whose first listing and first metrics read are refused as busy."""

        def __init__(self, owner: str, project: str, run_uuid: str | None = None) -> None:
            self.run_uuid = run_uuid

        def answer(self, call: str, value: object) -> object:
            if call in busy:
                busy.discard(call)
                raise ApiException(status=405)
            return value

        def list(self, **_: object) -> object:
            return self.answer("list", SimpleNamespace(results=[SimpleNamespace(uuid="a" * 32, inputs={}, outputs={})]))

        def get_metrics(self, **_: object) -> object:
            return self.answer("get_metrics", {})

    monkeypatch.setattr(polyaxon_client, "BUSY_RETRY_INTERVAL_S", 0.0)
    monkeypatch.setattr(polyaxon.client, "RunClient", BusyOnce)
    [run] = runs_from_polyaxon("default/busy")
    assert run.run_uuid == "a" * 32 and busy == set()


@pytest.mark.parametrize("failing", ["constructor", "payload"])
def test_an_api_reader_that_cannot_build_its_client_or_read_an_answer_is_one_line(
    monkeypatch: pytest.MonkeyPatch, failing: str
) -> None:
    """A client without configuration fails in its constructor; a metrics answer without its data is malformed."""
    import polyaxon.client

    class Failing:
        def __init__(self, owner: str, project: str, run_uuid: str | None = None) -> None:
            if failing == "constructor":
                raise ValueError("no host configured")

        def list(self, **_: object) -> object:
            return SimpleNamespace(results=[SimpleNamespace(uuid="a" * 32, inputs={}, outputs={})])

        def get_metrics(self, **_: object) -> object:
            return {"live_running_requests": {"no": "data"}}

    monkeypatch.setattr(polyaxon.client, "RunClient", Failing)
    with pytest.raises(HarnessError, match=r"^cannot read runs of Polyaxon project 'default/p': "
                                           r"(ValueError no host configured|KeyError 'data')$"):
        runs_from_polyaxon("default/p")
