"""Prompt inventories: exact, seeded builds; a format that refuses every edit; bad input in one line."""

from __future__ import annotations

import hashlib
import http.server
import json
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from harness.errors import HarnessError
from harness.inventory.build import (
    build_text_inventory,
    build_token_id_inventory,
    check_rebuilds,
    rebuild,
    salted,
    text_recipe,
    token_id_recipe,
    token_shapes,
)
from harness.inventory.check import (
    check_fits,
    prompt_token_mismatches,
    verify_with_server,
)
from harness.inventory.frozen import (
    MANIFEST_FILE,
    PROMPTS_FILE,
    Inventory,
    TokenIdRecipe,
    VocabularyRange,
    assemble_inventory,
    load_inventory,
    make_prompt,
    write_inventory,
)
from harness.inventory.recipe import SALT_TOKENS

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
    for a, b in zip(plain, salted, strict=True):
        assert (a.token_ids or [])[SALT_TOKENS:] == (b.token_ids or [])[SALT_TOKENS:]
        assert len(b.token_ids or []) == 32
    assert len({tuple((p.token_ids or [])[:SALT_TOKENS]) for p in salted}) == 6
    assert [p.token_ids for p in salted] != [p.token_ids for p in resalted]
    used = {t for p in salted for t in p.token_ids or []}
    assert not used & {0, 1, 2, 10, 11, 12}


def test_salted_copy_of_an_inventory_changes_its_digest_but_not_its_shape() -> None:
    inventory = build_token_id_inventory("s", small_recipe(shared_prefix_tokens=20))
    run_1, run_2 = salted(inventory, "run-1"), salted(inventory, "run-2")
    assert len({inventory.digest, run_1.digest, run_2.digest}) == 3
    assert [p.prompt_tokens for p in run_1.prompts] == [30, 40, 50]
    assert salted(inventory, "run-1").digest == run_1.digest  # the same salt reproduces the same run
    first_blocks = {tuple((p.token_ids or [])[:SALT_TOKENS]) for p in [*run_1.prompts, *run_2.prompts]}
    assert len(first_blocks) == 6


def test_text_inventories_cannot_be_salted(tokenizer_dir: Path, corpus_file: Path) -> None:
    with pytest.raises(HarnessError, match="only token-id inventories can be salted"):
        salted(build_text(corpus_file, tokenizer_dir, False, [20]), "run-1")


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
    edited = manifest_file.read_text().replace('"prompt_tokens_total": 120', '"prompt_tokens_total": 121')
    manifest_file.write_text(edited)
    message = r"manifest\.json.*prompt_tokens_total is 121 but the prompt list adds up to 120"
    with pytest.raises(HarnessError, match=message):
        load_inventory(directory)


def test_ids_outside_the_vocabulary_are_refused_even_with_fresh_hashes(tmp_path: Path) -> None:
    # An id the recipe excludes: rewrite a prompt and its hashes consistently, so only the range check can catch it.
    inventory = build_token_id_inventory("small", small_recipe())
    bad = make_prompt("p0000", 30, 5, token_ids=[10, *(inventory.prompts[0].token_ids or [])[1:]])
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
    message = r"2 prompt\(s\) exceed max_model_len 260.*p0001 \(220\+50=270\), p0002 \(300\+50=350\)$"
    with pytest.raises(HarnessError, match=message):
        check_fits(inventory, 260)


def test_prompt_token_mismatches_flags_only_differing_counts() -> None:
    inventory = build_token_id_inventory("m", small_recipe())
    mismatches = prompt_token_mismatches(inventory, {"p0000": 30, "p0001": 41, "p0002": 50})
    assert [(m.prompt_id, m.manifest_prompt_tokens, m.server_prompt_tokens) for m in mismatches] == [
        ("p0001", 40, 41)
    ]
    with pytest.raises(HarnessError, match="no prompt p9999"):
        prompt_token_mismatches(inventory, {"p9999": 1})


def test_prompt_token_mismatches_checks_every_request_of_a_repeated_prompt() -> None:
    inventory = build_token_id_inventory("m", small_recipe())
    requests = [("p0000", 30), ("p0000", 29), ("p0002", 50), ("p0000", 30), ("p0002", 52)]
    mismatches = prompt_token_mismatches(inventory, requests)
    assert [(m.prompt_id, m.server_prompt_tokens) for m in mismatches] == [("p0000", 29), ("p0002", 52)]


class NotVllm(http.server.BaseHTTPRequestHandler):
    """Answers /v1/models with 200 and a body that is no model list, everything else with 404."""

    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/v1/models" else 404)
        self.end_headers()
        self.wfile.write(b"<html>hello</html>")

    def log_message(self, *args: object) -> None:
        pass


def test_verify_against_something_that_is_not_vllm_is_one_line() -> None:
    inventory = build_token_id_inventory("m", small_recipe())
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NotVllm)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_port}"
        with pytest.raises(HarnessError, match=r"/v1/models: not a vLLM model list") as refused:
            verify_with_server(inventory, url)
        assert "\n" not in str(refused.value)
        with pytest.raises(HarnessError, match=r"HTTPStatusError: Client error '404 Not Found'") as missing:
            verify_with_server(inventory, url + "/elsewhere")
        assert "\n" not in str(missing.value)
    finally:
        server.shutdown()


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


# --- text inventories -------------------------------------------------------------------------------

CHAT_TEMPLATE = (
    "{% for m in messages %}<|user|>{{ m['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
WORDS = [
    "the", "cache", "holds", "keys", "and", "values", "for", "every", "live", "sequence",
    "café", "naïve", "—", "long", "contexts", "grow",
]


def corpus_text() -> str:
    """Varied prose with multi-byte characters, so token cuts can land inside a character."""
    return " ".join(
        " ".join(WORDS[(i * 7 + j * 3) % len(WORDS)] for j in range(5 + i % 9)) + "." for i in range(400)
    )


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
        special_tokens=["<|user|>", "<|end|>", "<|assistant|>"],
    )
    tokenizer.train_from_iterator([corpus_text()], trainer=trainer)
    directory = tmp_path_factory.mktemp("tokenizer")
    tokenizer.save(str(directory / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "chat_template": CHAT_TEMPLATE}
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    file = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    file.write_text(corpus_text(), encoding="utf-8")
    return file


def build_text(corpus: Path, tokenizer: Path, chat: bool, lengths: list[int]) -> Inventory:
    recipe = text_recipe(
        corpus, tokenizer=str(tokenizer), chat=chat, prompt_tokens=lengths,
        output_cap_tokens=[16] * len(lengths), seed=3,
    )
    return build_text_inventory("text", recipe)


@pytest.mark.parametrize("chat", [False, True])
def test_text_prompts_count_exactly_as_the_raw_tokenizer_counts(
    tokenizer_dir: Path, corpus_file: Path, chat: bool
) -> None:
    from tokenizers import Tokenizer

    raw = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    lengths = [5, 17, 64, 333, 1500]  # 1500 is longer than the corpus: the cut wraps around
    inventory = build_text(corpus_file, tokenizer_dir, chat, lengths)
    for prompt, length in zip(inventory.prompts, lengths, strict=True):
        assert prompt.text and prompt.chat is chat and prompt.token_ids is None
        sent = f"<|user|>{prompt.text}<|end|><|assistant|>" if chat else prompt.text
        assert len(raw.encode(sent).ids) == length == prompt.prompt_tokens
    assert len({p.text for p in inventory.prompts}) == len(lengths)


def test_text_builds_are_byte_identical_and_pin_the_tokenizer(
    tokenizer_dir: Path, corpus_file: Path, tmp_path: Path
) -> None:
    first = write_inventory(build_text(corpus_file, tokenizer_dir, True, [40, 80]), tmp_path / "a")
    second = write_inventory(build_text(corpus_file, tokenizer_dir, True, [40, 80]), tmp_path / "b")
    for file in (PROMPTS_FILE, MANIFEST_FILE):
        assert (first / file).read_bytes() == (second / file).read_bytes()
    inventory = load_inventory(first)
    check_rebuilds(inventory)
    assert inventory.manifest.tokenizer is not None
    assert inventory.manifest.tokenizer.name == str(tokenizer_dir)

    changed = tmp_path / "changed-tokenizer"
    shutil.copytree(tokenizer_dir, changed)
    config = json.loads((changed / "tokenizer_config.json").read_text())
    config["chat_template"] = "{{ messages[0]['content'] }}"
    (changed / "tokenizer_config.json").write_text(json.dumps(config))
    other = build_text(corpus_file, changed, True, [40, 80])
    assert other.manifest.tokenizer is not None
    assert other.manifest.tokenizer.files_sha256 != inventory.manifest.tokenizer.files_sha256


def test_text_rebuild_refuses_a_changed_corpus(tokenizer_dir: Path, tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(corpus_text(), encoding="utf-8")
    inventory = build_text(corpus, tokenizer_dir, False, [30])
    corpus.write_text(corpus_text() + " more", encoding="utf-8")
    with pytest.raises(HarnessError, match=r"corpus .*corpus\.txt: its sha256 differs"):
        check_rebuilds(inventory)


def test_hub_tokenizer_needs_a_pinned_revision(corpus_file: Path) -> None:
    recipe = text_recipe(
        corpus_file, tokenizer="Qwen/Qwen3-4B", chat=False, prompt_tokens=[8], output_cap_tokens=[8], seed=0
    )
    with pytest.raises(HarnessError, match="Qwen/Qwen3-4B: not a local directory, and a hub id needs --revision"):
        build_text_inventory("hub", recipe)


def test_unreadable_corpus_and_tokenizer_are_named(tokenizer_dir: Path, corpus_file: Path, tmp_path: Path) -> None:
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("caf\u00e9 au lait".encode("latin-1"))
    with pytest.raises(HarnessError, match=r"latin1\.txt: not UTF-8 text \(byte 3\)"):
        build_text(latin1, tokenizer_dir, False, [4])
    broken = tmp_path / "broken-tokenizer"
    broken.mkdir()
    (broken / "tokenizer.json").write_text("{not json")
    with pytest.raises(HarnessError, match=r"broken-tokenizer: cannot be loaded"):
        build_text(corpus_file, broken, False, [4])


def test_vocabulary_too_large_to_list_is_refused() -> None:
    with pytest.raises(HarnessError, match=r"field 'vocabulary.high': Input should be less than or equal to 16777216"):
        token_id_recipe(vocabulary={"low": 0, "high": 10**12}, prompt_tokens=[4], output_cap_tokens=[1], seed=0)


# --- bundled inventories for the pinned model ------------------------------------------------------------

PROMPTS_DIR = Path(__file__).resolve().parents[2] / "prompts"
QWEN3_4B_VOCABULARY = VocabularyRange(low=0, high=151_643)  # ids >= 151,643 are Qwen's special tokens


@pytest.mark.parametrize(
    "name", ["qwen3-4b-fixed-4096x8", "qwen3-4b-length-ladder", "qwen3-4b-shared-prefix"]
)
def test_bundled_inventories_rebuild_byte_identically(name: str, tmp_path: Path) -> None:
    committed = PROMPTS_DIR / name
    inventory = load_inventory(committed)
    assert inventory.manifest.vocabulary == QWEN3_4B_VOCABULARY
    again = write_inventory(rebuild(inventory.manifest), tmp_path / name)
    for file in (PROMPTS_FILE, MANIFEST_FILE):
        assert (again / file).read_bytes() == (committed / file).read_bytes()


def test_bundled_shapes_are_the_documented_ones() -> None:
    fixed = load_inventory(PROMPTS_DIR / "qwen3-4b-fixed-4096x8")
    assert [p.prompt_tokens + p.output_cap_tokens for p in fixed.prompts] == [4096] * 8
    ladder = load_inventory(PROMPTS_DIR / "qwen3-4b-length-ladder")
    assert [p.prompt_tokens for p in ladder.prompts] == [512 * 2**i for i in range(7)]
    check_fits(ladder, 40_960)  # Qwen3-4B's default max_model_len
    shared = load_inventory(PROMPTS_DIR / "qwen3-4b-shared-prefix")
    assert len({tuple((p.token_ids or [])[:1536]) for p in shared.prompts}) == 1
    assert len({(p.token_ids or [])[1536] for p in shared.prompts}) == 8
    digests = {fixed.digest, ladder.digest, shared.digest}
    assert len(digests) == 3


# --- the command line ------------------------------------------------------------------------------------

HARNESS = str(Path(sys.executable).parent / "harness")


def harness(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([HARNESS, *args], capture_output=True, text=True, timeout=120)


def assert_one_line_error(result: subprocess.CompletedProcess[str], *fragments: str) -> None:
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0]


def test_cli_builds_then_verifies_and_refuses_an_edit(tmp_path: Path) -> None:
    out = tmp_path / "cli-built"
    built = harness(
        "prompts", "build", "token-ids", str(out), "--vocab-high", "64", "--exclude-ids", "5,6",
        "--prompt-tokens", "12,24", "--output-cap-tokens", "4", "--count", "2", "--seed", "9",
    )
    assert built.returncode == 0, built.stderr
    inventory = load_inventory(out)
    assert [p.prompt_tokens for p in inventory.prompts] == [12, 12, 24, 24]
    assert inventory.digest in built.stdout

    verified = harness("prompts", "verify", str(out), "--rebuild", "--max-model-len", "28")
    assert verified.returncode == 0, verified.stderr
    assert "intact, 4 prompts" in verified.stdout

    assert_one_line_error(
        harness("prompts", "verify", str(out), "--max-model-len", "27"), "p0002 (24+4=28)", "p0003 (24+4=28)"
    )
    edit_line(out, 4, '"output_cap_tokens":4', '"output_cap_tokens":5')
    assert_one_line_error(harness("prompts", "verify", str(out)), "line 4 (prompt p0003)")


def test_cli_bad_input_is_one_line(tmp_path: Path) -> None:
    assert_one_line_error(harness("prompts", "verify", str(tmp_path)), "manifest.json: no such file")
    assert_one_line_error(
        harness("prompts", "build", "token-ids", str(tmp_path / "x"), "--vocab-high", "10",
                "--prompt-tokens", "4", "--output-cap-tokens", "1", "--exclude-ids", "99"),
        "token-id recipe: field 'vocabulary'", "excluded_ids outside [0, 10)",
    )
    assert_one_line_error(
        harness("prompts", "build", "token-ids", str(tmp_path / "x y"), "--vocab-high", "10",
                "--prompt-tokens", "4", "--output-cap-tokens", "1"),
        "inventory 'x y': field 'name'",
    )
    assert_one_line_error(
        harness("prompts", "build", "text", str(tmp_path / "y"), "--corpus", str(tmp_path / "missing.txt"),
                "--tokenizer", "t", "--prompt-tokens", "4", "--output-cap-tokens", "1"),
        "missing.txt: no such file",
    )


def test_chat_prompt_shorter_than_its_template_is_refused_naming_it(tokenizer_dir: Path, corpus_file: Path) -> None:
    # "<|user|>" + "<|end|>" + "<|assistant|>" alone are 3 tokens, so 3 leaves no room for any text.
    message = r"prompt p0001: 3 tokens leave no room for text: an empty prompt already counts 3"
    with pytest.raises(HarnessError, match=message):
        build_text(corpus_file, tokenizer_dir, True, [10, 3])


def test_the_tiny_models_bundled_inventory_rebuilds_and_avoids_its_special_tokens(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    committed = PROMPTS_DIR / "tiny-qwen3-600x8"
    inventory = load_inventory(committed)
    tokenizer = json.loads((tiny_model_dir / "tokenizer.json").read_text())
    specials = {token["id"] for token in tokenizer["added_tokens"]}
    used = {token for prompt in inventory.prompts for token in prompt.token_ids or []}
    assert used.isdisjoint(specials) and max(used) < len(tokenizer["model"]["vocab"]) + len(specials)
    assert [(p.prompt_tokens, p.output_cap_tokens) for p in inventory.prompts] == [(600, 300)] * 8
    again = write_inventory(rebuild(inventory.manifest), tmp_path / "again")
    for file in (PROMPTS_FILE, MANIFEST_FILE):
        assert (again / file).read_bytes() == (committed / file).read_bytes()
