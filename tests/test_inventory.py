"""Prompt inventories: exact, seeded builds; a format that refuses every edit; bad input in one line."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from harness.errors import HarnessError
from harness.inventory import (
    MANIFEST_FILE,
    PROMPTS_FILE,
    SALT_TOKENS,
    TokenIdRecipe,
    VocabularyRange,
    assemble_inventory,
    check_fits,
    load_inventory,
    make_prompt,
    prompt_token_mismatches,
    write_inventory,
)
from harness.inventory_build import build_token_id_inventory, token_id_recipe, token_shapes

SMALL_VOCABULARY = VocabularyRange(low=3, high=50, excluded_ids=[10, 11, 12])


def small_recipe(**changes: object) -> TokenIdRecipe:
    fields: dict[str, object] = dict(
        vocabulary=SMALL_VOCABULARY, prompt_tokens=[30, 40, 50], output_cap_tokens=[5, 6, 7], seed=7
    )
    return TokenIdRecipe(**(fields | changes))


def written(tmp_path: Path, name: str = "small", **changes: object) -> Path:
    return write_inventory(build_token_id_inventory(name, small_recipe(**changes)), tmp_path / name)


def edit_line(directory: Path, number: int, old: str, new: str) -> None:
    """Replace the first `old` in line `number` (1-based) of prompts.jsonl."""
    file = directory / PROMPTS_FILE
    lines = file.read_text().split("\n")
    assert old in lines[number - 1]
    lines[number - 1] = lines[number - 1].replace(old, new, 1)
    file.write_text("\n".join(lines))


def test_token_id_prompts_have_exact_lengths_and_only_allowed_ids(tmp_path: Path) -> None:
    inventory = load_inventory(written(tmp_path))
    assert [len(p.token_ids or []) for p in inventory.prompts] == [30, 40, 50]
    assert [p.prompt_tokens for p in inventory.prompts] == [30, 40, 50]
    assert [p.output_cap_tokens for p in inventory.prompts] == [5, 6, 7]
    used = {t for p in inventory.prompts for t in p.token_ids or []}
    assert used <= set(range(3, 50)) - {10, 11, 12}
    assert len(used) > 30  # really drawn from the range, not one repeated id
    assert inventory.manifest.prompt_tokens_total == 120
    assert inventory.manifest.output_cap_tokens_total == 18
    assert inventory.manifest.vocabulary == SMALL_VOCABULARY
    assert inventory.manifest.seed == 7


def test_same_recipe_builds_byte_identical_files_and_another_seed_does_not(tmp_path: Path) -> None:
    first, second = written(tmp_path / "a"), written(tmp_path / "b")
    for file in (PROMPTS_FILE, MANIFEST_FILE):
        assert (first / file).read_bytes() == (second / file).read_bytes()
    other = written(tmp_path / "c", seed=8)
    assert (other / PROMPTS_FILE).read_bytes() != (first / PROMPTS_FILE).read_bytes()
    assert load_inventory(other).digest != load_inventory(first).digest


def test_hashes_follow_the_documented_canonical_form(tmp_path: Path) -> None:
    directory = written(tmp_path)
    lines = (directory / PROMPTS_FILE).read_text().splitlines()
    hashes = []
    for line in lines:
        record = json.loads(line)
        stored = record.pop("sha256")
        canonical = json.dumps(record, separators=(",", ":"), ensure_ascii=False)
        assert hashlib.sha256(canonical.encode()).hexdigest() == stored
        hashes.append(stored)
    manifest = json.loads((directory / MANIFEST_FILE).read_text())
    assert [entry["sha256"] for entry in manifest["prompts"]] == hashes
    digest = manifest.pop("inventory_sha256")
    canonical = json.dumps(manifest, separators=(",", ":"), ensure_ascii=False)
    assert hashlib.sha256(canonical.encode()).hexdigest() == digest == load_inventory(directory).digest


def test_shared_prefix_is_shared_and_the_rest_differs(tmp_path: Path) -> None:
    recipe = small_recipe(
        vocabulary=VocabularyRange(low=0, high=151_643), prompt_tokens=[64] * 4, output_cap_tokens=[8] * 4,
        shared_prefix_tokens=40,
    )
    prompts = build_token_id_inventory("prefix", recipe).prompts
    prefixes = {tuple((p.token_ids or [])[:40]) for p in prompts}
    assert len(prefixes) == 1
    assert len({(p.token_ids or [])[40] for p in prompts}) == 4


def test_salt_makes_every_prompt_unique_and_changes_only_the_leading_tokens() -> None:
    base = dict(prompt_tokens=[32] * 6, output_cap_tokens=[4] * 6, shared_prefix_tokens=24)
    plain = build_token_id_inventory("s", small_recipe(**base)).prompts
    salted = build_token_id_inventory("s", small_recipe(**base, salt="run-1")).prompts
    resalted = build_token_id_inventory("s", small_recipe(**base, salt="run-2")).prompts
    for a, b in zip(plain, salted):
        assert (a.token_ids or [])[SALT_TOKENS:] == (b.token_ids or [])[SALT_TOKENS:]
        assert len(b.token_ids or []) == 32
    assert len({tuple((p.token_ids or [])[:SALT_TOKENS]) for p in salted}) == 6
    assert [p.token_ids for p in salted] != [p.token_ids for p in resalted]
    used = {t for p in salted for t in p.token_ids or []}
    assert not used & {0, 1, 2, 10, 11, 12}


def test_a_one_byte_edit_is_refused_naming_the_prompt(tmp_path: Path) -> None:
    directory = written(tmp_path)
    record = json.loads((directory / PROMPTS_FILE).read_text().splitlines()[1])
    first_id = record["token_ids"][0]
    replacement = 4 if first_id != 4 else 5  # one digit, still an allowed id
    edit_line(directory, 2, f"[{first_id},", f"[{replacement},")
    with pytest.raises(HarnessError, match=r"modified.*prompt p0001$"):
        load_inventory(directory)


def test_whitespace_edit_is_refused_too(tmp_path: Path) -> None:
    directory = written(tmp_path)
    edit_line(directory, 3, '"chat":false', '"chat": false')
    with pytest.raises(HarnessError, match="p0002"):
        load_inventory(directory)


def test_malformed_json_line_is_named(tmp_path: Path) -> None:
    directory = written(tmp_path)
    edit_line(directory, 3, "{", "")
    with pytest.raises(HarnessError, match=r"prompts\.jsonl line 3 \(prompt p0002\): malformed JSON"):
        load_inventory(directory)


def test_count_that_disagrees_with_the_token_ids_is_refused(tmp_path: Path) -> None:
    directory = written(tmp_path)
    edit_line(directory, 1, '"prompt_tokens":30', '"prompt_tokens":31')
    with pytest.raises(HarnessError, match=r"line 1 .*prompt_tokens is 31 but token_ids holds 30 ids"):
        load_inventory(directory)


def test_manifest_totals_that_disagree_are_refused(tmp_path: Path) -> None:
    directory = written(tmp_path)
    manifest_file = directory / MANIFEST_FILE
    manifest_file.write_text(manifest_file.read_text().replace('"prompt_tokens_total": 120', '"prompt_tokens_total": 121'))
    with pytest.raises(HarnessError, match=r"manifest\.json.*prompt_tokens_total is 121 but the prompt list adds up to 120"):
        load_inventory(directory)


def test_ids_outside_the_vocabulary_are_refused_even_with_fresh_hashes(tmp_path: Path) -> None:
    # An id the recipe excludes: rewrite a prompt and its hashes consistently, so only the range check can catch it.
    inventory = build_token_id_inventory("small", small_recipe())
    bad = make_prompt("p0000", 30, 5, token_ids=[10] + (inventory.prompts[0].token_ids or [])[1:])
    forged = assemble_inventory("small", small_recipe(), None, [bad, *inventory.prompts[1:]])
    directory = write_inventory(forged, tmp_path / "forged")
    with pytest.raises(HarnessError, match=r"line 1 \(prompt p0000\): token ids outside .*\[10\]"):
        load_inventory(directory)


def test_missing_files_are_named(tmp_path: Path) -> None:
    directory = written(tmp_path)
    (directory / PROMPTS_FILE).unlink()
    with pytest.raises(HarnessError, match=r"prompts\.jsonl: no such file"):
        load_inventory(directory)


def test_check_fits_names_the_prompts_that_exceed_max_model_len(tmp_path: Path) -> None:
    inventory = build_token_id_inventory(
        "fits", small_recipe(prompt_tokens=[100, 220, 300], output_cap_tokens=[50, 50, 50])
    )
    check_fits(inventory, 350)
    with pytest.raises(HarnessError, match=r"2 prompt\(s\) exceed max_model_len 260.*p0001 \(220\+50=270\), p0002 \(300\+50=350\)"):
        check_fits(inventory, 260)


def test_prompt_token_mismatches_flags_only_differing_counts() -> None:
    inventory = build_token_id_inventory("m", small_recipe())
    mismatches = prompt_token_mismatches(inventory, {"p0000": 30, "p0001": 41, "p0002": 50})
    assert [(m.prompt_id, m.manifest_prompt_tokens, m.server_prompt_tokens) for m in mismatches] == [
        ("p0001", 40, 41)
    ]
    with pytest.raises(HarnessError, match="no prompt p9999"):
        prompt_token_mismatches(inventory, {"p9999": 1})


def test_recipe_refuses_a_prefix_as_long_as_a_prompt() -> None:
    with pytest.raises(HarnessError, match=r"token-id recipe: field '\(root\)'.*shared_prefix_tokens 30"):
        token_id_recipe(
            vocabulary=SMALL_VOCABULARY, prompt_tokens=[30], output_cap_tokens=[5], shared_prefix_tokens=30, seed=0
        )


def test_token_shapes_repeat_and_broadcast() -> None:
    assert token_shapes("512,1024", "64", 2) == ([512, 512, 1024, 1024], [64, 64, 64, 64])
    with pytest.raises(HarnessError, match="--prompt-tokens: '512,x'"):
        token_shapes("512,x", "64", 1)
    with pytest.raises(HarnessError, match="--output-cap-tokens: 2 values for 3"):
        token_shapes("1,2,3", "4,5", 1)
