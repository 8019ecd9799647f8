"""`harness prompts import`: the user's own traffic frozen, every prompt counted as the server counts it.

The fixtures in tests/fixtures/traffic are small files in each format; counts are checked against the raw
`tokenizers` library on the generated tiny model's tokenizer, with its chat template written out by hand.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from harness.inventory.frozen import MANIFEST_FILE, PROMPTS_FILE, load_inventory

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "traffic"
HARNESS = str(Path(sys.executable).parent / "harness")


def harness(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([HARNESS, *args], capture_output=True, text=True, timeout=120)


def templated(messages: list[tuple[str, str]]) -> str:
    """The tiny model's chat template, by hand: each message in <|im_start|>role ... <|im_end|>, then the
    generation prompt."""
    return "".join(f"<|im_start|>{role}\n{content}<|im_end|>\n" for role, content in messages) + \
        "<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def raw(tiny_model_dir: Path) -> Tokenizer:
    return Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))


def count(raw: Tokenizer, text: str) -> int:
    return len(raw.encode(text, add_special_tokens=False).ids)


def test_openai_requests_keep_their_form_and_count_as_the_server_does(
        tiny_model_dir: Path, raw: Tokenizer, tmp_path: Path) -> None:
    out = tmp_path / "requests"
    imported = harness("prompts", "import", str(FIXTURES / "requests.jsonl"), str(out),
                       "--tokenizer", str(tiny_model_dir))
    assert imported.returncode == 0, imported.stderr
    assert "4 prompts from 4 records" in imported.stdout and "1 skipped: generated nothing" in imported.stdout
    # line 2's usage says 999 prompt tokens: the log came from another tokenizer; the count is the tokenizer's
    assert "line 2: usage.prompt_tokens 999 but the tokenizer counts" in imported.stderr
    prompts = load_inventory(out).prompts
    one = "What does the cache hold for every live sequence?"
    system = [("system", "You answer briefly."), ("user", "Why do long contexts grow the cache?")]
    turns = [("user", "hello"), ("assistant", "Hello! How can I help?"), ("user", "Tell me about the cache.")]
    # one user message: text sent as one chat turn; several: the messages as recorded; a prompt: completions
    assert (prompts[0].text, prompts[0].chat, prompts[0].messages) == (one, True, None)
    assert prompts[1].chat_messages() == [{"role": r, "content": c} for r, c in system]
    assert (prompts[2].text, prompts[2].chat) == ("The keys and values for every live sequence", False)
    assert [m.role for m in prompts[3].messages or []] == ["user", "assistant", "user"]
    assert [p.prompt_tokens for p in prompts] == [
        count(raw, templated([("user", one)])), count(raw, templated(system)),
        len(raw.encode("The keys and values for every live sequence").ids), count(raw, templated(turns))]
    # output caps: max_tokens 64; usage.completion_tokens 41 (what it generated) over max_tokens 256; 16;
    # max_completion_tokens 32
    assert [p.output_cap_tokens for p in prompts] == [64, 41, 16, 32]
    manifest = json.loads((out / MANIFEST_FILE).read_text())
    assert manifest["recipe"]["source_sha256"] == hashlib.sha256((FIXTURES / "requests.jsonl").read_bytes()).hexdigest()
    assert manifest["kind"] == "text" and manifest["tokenizer"]["name"] == str(tiny_model_dir)
    verified = harness("prompts", "verify", str(out), "--rebuild")
    assert verified.returncode == 0, verified.stderr


def test_sharegpt_first_exchange_takes_it_and_the_replys_length_as_the_cap(
        tiny_model_dir: Path, raw: Tokenizer, tmp_path: Path) -> None:
    out = tmp_path / "conversations"
    imported = harness("prompts", "import", str(FIXTURES / "conversations.json"), str(out),
                       "--tokenizer", str(tiny_model_dir), "--first-exchange")
    assert imported.returncode == 0, imported.stderr
    # a3 has no question; a2 goes on after its first exchange (counted: without --first-exchange its turns are
    # all imported, test_import_conversations.py); a4's leading system turn is before the first human turn
    assert "3 prompts from 3 records" in imported.stdout
    assert "1 skipped: no human turn answered by the assistant" in imported.stdout
    assert "1 conversation(s) went on after the first exchange" in imported.stdout
    prompts = load_inventory(out).prompts
    questions = ["What does the cache hold?", "Why do long contexts grow?", "Is the café naïve?"]
    replies = ["Keys and values for every live sequence, one block at a time.", "Each token adds keys and values.",
               "Only about the long contexts."]
    assert [p.text for p in prompts] == questions and all(p.chat for p in prompts)
    assert [p.prompt_tokens for p in prompts] == [count(raw, templated([("user", q)])) for q in questions]
    assert [p.output_cap_tokens for p in prompts] == [count(raw, reply) for reply in replies]


def test_csv_counts_become_token_id_prompts_of_those_lengths(tmp_path: Path) -> None:
    out = tmp_path / "counts"
    imported = harness("prompts", "import", str(FIXTURES / "counts.csv"), str(out), "--vocab-high", "2045")
    assert imported.returncode == 0, imported.stderr
    inventory = load_inventory(out)
    # the row with 0 generated tokens (a failed request in a trace) is skipped
    assert [(p.prompt_tokens, p.output_cap_tokens) for p in inventory.prompts] == \
        [(300, 40), (410, 100), (800, 60), (90, 20), (1200, 150)]
    assert all(len(p.token_ids or []) == p.prompt_tokens for p in inventory.prompts)
    lengths = json.loads((out / MANIFEST_FILE).read_text())["recipe"]["lengths"]
    assert (lengths["kind"], lengths["format"], lengths["source"]) == ("imported", "csv", "counts.csv")
    assert (lengths["records"], lengths["skipped_records"], lengths["tokenizer"]) == (5, 1, None)
    assert harness("prompts", "verify", str(out), "--rebuild").returncode == 0


def test_a_file_saved_with_a_byte_order_mark_imports_as_without_it(tmp_path: Path) -> None:
    marked = tmp_path / "counts.csv"
    marked.write_bytes(b"\xef\xbb\xbf" + (FIXTURES / "counts.csv").read_bytes())  # as Windows editors save it
    for source, out in ((FIXTURES / "counts.csv", tmp_path / "plain"), (marked, tmp_path / "marked")):
        imported = harness("prompts", "import", str(source), str(out), "--vocab-high", "2045")
        assert imported.returncode == 0, imported.stderr
    assert [(p.prompt_tokens, p.output_cap_tokens) for p in load_inventory(tmp_path / "marked").prompts] == \
        [(p.prompt_tokens, p.output_cap_tokens) for p in load_inventory(tmp_path / "plain").prompts]


def test_lengths_only_keeps_the_lengths_and_none_of_the_text(tiny_model_dir: Path, tmp_path: Path) -> None:
    text, lengths_only = tmp_path / "text", tmp_path / "lengths"
    for out, extra in ((text, []), (lengths_only, ["--lengths-only", "--vocab-high", "2045"])):
        imported = harness("prompts", "import", str(FIXTURES / "requests.jsonl"), str(out), "--tokenizer",
                           str(tiny_model_dir), "--sample", "3", "--seed", "2", *extra)
        assert imported.returncode == 0, imported.stderr
    kept = load_inventory(lengths_only)
    assert [(p.prompt_tokens, p.output_cap_tokens) for p in kept.prompts] == \
        [(p.prompt_tokens, p.output_cap_tokens) for p in load_inventory(text).prompts]
    assert all(p.token_ids is not None and p.text is None for p in kept.prompts)
    written = (lengths_only / PROMPTS_FILE).read_text() + (lengths_only / MANIFEST_FILE).read_text()
    assert not any(words in written for words in ("live sequence", "briefly", "Tell me", "keys and values"))
    lengths = json.loads((lengths_only / MANIFEST_FILE).read_text())["recipe"]["lengths"]
    assert (lengths["sample"], lengths["records"], lengths["tokenizer"]["name"]) == (3, 4, str(tiny_model_dir))


@pytest.mark.parametrize(("fixture", "message"), [
    ("bad-role.jsonl", "bad-role.jsonl line 2: field 'messages.0.role': Input should be 'system', 'user' or "
                       "'assistant'"),
    ("no-cap.jsonl", "no-cap.jsonl line 2: field 'max_tokens': no max_tokens, max_completion_tokens or "
                     "usage.completion_tokens"),
    ("bad-turn.json", "bad-turn.json line 3: field 'conversations.0.value': Input should be a valid string"),
    ("bad-count.csv", "bad-count.csv line 3: field 'output_tokens': 'twenty' is not a whole number of tokens"),
    # 20,000,000 > 2**24 = 16,777,216, the most tokens an inventory's request may hold
    ("huge-count.csv", "huge-count.csv line 3: field 'input_tokens': 20,000,000 tokens, more than the 16,777,216"),
    # the same bound on a request's own cap: once a traceback from the frozen model the cap lands in
    ("huge-cap.jsonl", "huge-cap.jsonl line 2: field 'max_tokens': Input should be less than or equal to 16777216"),
])
def test_a_bad_record_is_one_line_and_nothing_is_written(
        fixture: str, message: str, tiny_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "refused"
    refused = harness("prompts", "import", str(FIXTURES / fixture), str(out), "--tokenizer", str(tiny_model_dir),
                      "--vocab-high", "2045")
    assert refused.returncode == 2, refused.stdout
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {FIXTURES / fixture}".replace(fixture, message)), \
        refused.stderr
    assert not (out / MANIFEST_FILE).exists() and not (out / PROMPTS_FILE).exists()


def test_a_text_import_rebuilds_only_from_the_same_source(tiny_model_dir: Path, tmp_path: Path) -> None:
    source = tmp_path / "requests.jsonl"
    shutil.copy(FIXTURES / "requests.jsonl", source)
    out = tmp_path / "imported"
    assert harness("prompts", "import", str(source), str(out), "--tokenizer", str(tiny_model_dir)).returncode == 0
    source.write_text(source.read_text() + '{"prompt": "one more", "max_tokens": 4}\n')
    refused = harness("prompts", "verify", str(out), "--rebuild")
    assert refused.returncode == 2 and "its sha256 differs from the recipe's source_sha256" in refused.stderr


def test_a_sample_larger_than_the_file_and_a_missing_tokenizer_are_refused(tmp_path: Path) -> None:
    refused = harness("prompts", "import", str(FIXTURES / "counts.csv"), str(tmp_path / "x"), "--vocab-high",
                      "2045", "--sample", "9")
    assert refused.returncode == 2 and "--sample 9: FILE" in refused.stderr and "holds only 5 records" in refused.stderr
    refused = harness("prompts", "import", str(FIXTURES / "requests.jsonl"), str(tmp_path / "y"))
    assert refused.returncode == 2 and "--tokenizer: a openai import counts text" in refused.stderr


def test_a_recorded_conversation_is_sent_as_recorded(tiny_model_dir: Path, tmp_path: Path) -> None:
    from harness.measure.client import PromptRequest, request_body

    out = tmp_path / "requests"
    assert harness("prompts", "import", str(FIXTURES / "requests.jsonl"), str(out), "--tokenizer",
                   str(tiny_model_dir)).returncode == 0
    prompt = load_inventory(out).prompts[1]
    sent = PromptRequest(index=0, prompt_id=prompt.prompt_id, warmup=False, max_tokens=prompt.output_cap_tokens,
                         token_ids=None, text=prompt.text, chat=prompt.chat, messages=prompt.chat_messages())
    endpoint, body = request_body("tiny", sent, 0.0)
    assert endpoint == "/v1/chat/completions"
    assert body["messages"] == [{"role": "system", "content": "You answer briefly."},
                                {"role": "user", "content": "Why do long contexts grow the cache?"}]
