"""The chat-like bundled inventories: the commands prompts/README.md shows, run as written, rebuild them byte
for byte, and the figures the README states are theirs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from harness.inventory.check import check_fits
from harness.inventory.frozen import MANIFEST_FILE, PROMPTS_FILE, load_inventory

from conftest import bash_commands

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "prompts" / "README.md"
BIN = Path(sys.executable).parent


def run(words: list[str]) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "COLUMNS": "200"}
    return subprocess.run([str(BIN / words[0]), *words[1:]], cwd=ROOT, capture_output=True, text=True, env=env,
                          timeout=120)


def test_the_readme_build_commands_rebuild_the_committed_bytes(tmp_path: Path) -> None:
    builds = [words for words in bash_commands(README) if words[:4] == ["harness", "prompts", "build", "token-ids"]]
    assert [words[4] for words in builds] == ["prompts/qwen3-4b-chat-lognormal", "prompts/tiny-qwen3-chat-lognormal"]
    for words in builds:
        committed = ROOT / words[4]
        out = tmp_path / committed.name
        built = run([*words[:4], str(out), *words[5:]])
        assert built.returncode == 0, built.stderr
        for file in (PROMPTS_FILE, MANIFEST_FILE):
            assert (out / file).read_bytes() == (committed / file).read_bytes(), committed.name


def lengths(name: str) -> tuple[np.ndarray, np.ndarray]:
    inventory = load_inventory(ROOT / "prompts" / name)
    return (np.array([p.prompt_tokens for p in inventory.prompts]),
            np.array([p.output_cap_tokens for p in inventory.prompts]))


def test_the_stated_shapes_are_the_inventories() -> None:
    prompts, caps = lengths("qwen3-4b-chat-lognormal")
    assert len(prompts) == 128
    assert (np.median(prompts), round(float(np.quantile(prompts, 0.99))), prompts.max()) == (946.5, 3235, 3347)
    assert (np.median(caps), caps.max()) == (131, 875)
    check_fits(load_inventory(ROOT / "prompts" / "qwen3-4b-chat-lognormal"), 40_960)  # Qwen3-4B's default
    tiny = load_inventory(ROOT / "prompts" / "tiny-qwen3-chat-lognormal")
    assert len(tiny.prompts) == 16
    check_fits(tiny, 1024)  # the local-cpu preset's max_model_len
    used = {token for prompt in tiny.prompts for token in prompt.token_ids or []}
    assert max(used) < 2045  # ids 2045-2047 are the tiny tokenizer's special tokens
    manifest = json.loads((ROOT / "prompts" / "qwen3-4b-chat-lognormal" / MANIFEST_FILE).read_text())
    drawn = manifest["recipe"]["lengths"]
    assert (drawn["prompt_tokens"]["median_tokens"], drawn["prompt_tokens"]["sigma"]) == (1020, 0.602)
    assert (drawn["output_cap_tokens"]["median_tokens"], drawn["output_cap_tokens"]["sigma"]) == (129, 0.661)


def test_the_fit_is_the_one_the_readme_derives() -> None:
    # sigma = ln(p99 / median) / z(0.99), z(0.99) = 2.3263: the trace's p99 4,142 over its median 1,020 for
    # prompts, 601 over 129 for outputs.
    assert round(np.log(4142 / 1020) / 2.3263, 3) == 0.602
    assert round(np.log(601 / 129) / 2.3263, 3) == 0.661


def test_the_readme_budget_command_prints_the_stated_population() -> None:
    [words] = [words for words in bash_commands(README) if words[:2] == ["harness", "budget"]]
    priced = run([*words, "--json"])
    assert priced.returncode == 0, priced.stderr
    population = json.loads(priced.stdout)["population"]
    # 32 blocks, 31 for requests; the README states p50 23, p99 30, max 32 blocks: only the worst draws miss.
    assert (population["p50_blocks"], population["p99_blocks"], population["max_blocks"]) == (23, 30, 32)
    assert population["usable_blocks"] == 31 and 0.99 < population["fit_share"] < 1
    table = run(words)
    assert table.returncode == 0 and "p50 block-padded live tokens" in table.stdout


def test_the_readme_import_command_runs_as_written(tmp_path: Path) -> None:
    [words] = [words for words in bash_commands(README) if words[:3] == ["harness", "prompts", "import"]]
    out = tmp_path / words[4]  # OUT in a folder of the test's own
    imported = run([*words[:4], str(out), *words[5:]])
    assert imported.returncode == 0, imported.stderr
    assert [(p.prompt_tokens, p.output_cap_tokens) for p in load_inventory(out).prompts][:2] == [(300, 40), (410, 100)]
