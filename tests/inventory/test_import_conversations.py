"""`harness prompts import --format sharegpt`: recorded conversations kept whole, each turn sent with its history.

tests/fixtures/traffic/multi-turn.json holds three conversations: m1 (a system turn, then three exchanges), m2
(one exchange, then a question nobody answered) and m3 (two human turns in a row: no exchange). Counts are the
generated tiny model's tokenizer (the raw `tokenizers` library) with its chat template written out by hand.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from harness.inventory.frozen import MANIFEST_FILE, PROMPTS_FILE, load_inventory
from harness.inventory.segments import sent_prompts
from harness.predict.prefix_cache import predict_prefix_hits

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "traffic"
HARNESS = str(Path(sys.executable).parent / "harness")
M1 = [("What does the cache hold?", "Keys and values."), ("For how long?", "While the sequence lives."),
      ("And then?", "Its blocks are freed.")]
M2 = [("Why do long contexts grow?", "Each token adds keys and values.")]


def harness(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([HARNESS, *args], capture_output=True, text=True, timeout=120)


def templated(messages: list[tuple[str, str]]) -> str:
    return "".join(f"<|im_start|>{role}\n{content}<|im_end|>\n" for role, content in messages) + \
        "<|im_start|>assistant\n"


def history(exchanges: list[tuple[str, str]], turn: int) -> list[tuple[str, str]]:
    """Turn `turn`'s messages: the exchanges before it, then its question."""
    earlier = [message for q, a in exchanges[:turn - 1] for message in (("user", q), ("assistant", a))]
    return [*earlier, ("user", exchanges[turn - 1][0])]


@pytest.fixture(scope="module")
def raw(tiny_model_dir: Path) -> Tokenizer:
    return Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))


def count(raw: Tokenizer, text: str) -> int:
    return len(raw.encode(text, add_special_tokens=False).ids)


@pytest.fixture(scope="module")
def imported(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("imports") / "talks"
    result = harness("prompts", "import", str(FIXTURES / "multi-turn.json"), str(out), "--tokenizer",
                     str(tiny_model_dir))
    assert result.returncode == 0, result.stderr
    assert "4 prompts (2 conversations) from 2 records" in result.stdout
    assert "1 skipped: no human turn answered by the assistant" in result.stdout  # m3
    assert "1 conversation(s) kept up to a question with no answer" in result.stdout  # m2's last question
    return out


def test_every_turn_is_its_history_then_its_question_counted_as_the_server_counts_it(
        imported: Path, raw: Tokenizer) -> None:
    prompts = load_inventory(imported).prompts
    assert [p.prompt_id for p in prompts] == ["c0000t01", "c0000t02", "c0000t03", "c0001t01"]
    assert [(p.conversation_id, p.turn) for p in prompts] == [("c0000", 1), ("c0000", 2), ("c0000", 3), ("c0001", 1)]
    # m1's system turn comes before its first question, so no turn holds it; turn 3 holds both earlier exchanges
    assert prompts[2].chat_messages() == [{"role": r, "content": c} for r, c in history(M1, 3)]
    # The worked example, on the tiny tokenizer: "<|im_start|>user\n" is 3 tokens, "<|im_end|>\n<|im_start|>user\n"
    # and "<|im_end|>\n<|im_start|>assistant\n" 5 each; the questions 7, 5 and 4 tokens, the replies 6, 8 and 6.
    # Turn 1: 3 + 7 + 5 = 15. Turn 2 repeats turn 1, then reply 1, the next user header, question 2, the
    # generation prompt: 15 + 6 + 5 + 5 + 5 = 36. Turn 3: 36 + 8 + 5 + 4 + 5 = 58. m2: 3 + 11 + 5 = 19.
    assert [p.prompt_tokens for p in prompts] == [15, 36, 58, 19]
    assert [p.prompt_tokens for p in prompts] == [count(raw, templated(history(M1, k))) for k in (1, 2, 3)] + \
        [count(raw, templated(history(M2, 1)))]
    # each turn's cap is its recorded answer's length: 6, 8 and 6 tokens; m2's 8
    assert [p.output_cap_tokens for p in prompts] == [6, 8, 6, 8] == [count(raw, a) for _, a in M1 + M2]
    assert json.loads((imported / MANIFEST_FILE).read_text())["recipe"]["conversations"] is True
    verified = harness("prompts", "verify", str(imported), "--rebuild")
    assert verified.returncode == 0, verified.stderr


def test_the_prefix_cache_is_predicted_to_reuse_each_earlier_turn(imported: Path) -> None:
    # Blocks of 8: turn 2 repeats turn 1's 15 tokens, floor(15 / 8) = 1 block = 8 tokens; turn 3 repeats turn
    # 2's 36, floor(36 / 8) = 4 blocks = 32 tokens. Turn 1 and m2 share nothing: 8 + 32 = 40.
    inventory = load_inventory(imported)
    sent = sent_prompts(inventory, [(p.prompt_id, p.output_cap_tokens) for p in inventory.prompts])
    prediction = predict_prefix_hits(sent, 8, None)
    assert prediction.hit_tokens_by_request == [0, 8, 32, 0] and prediction.hit_tokens == 40


def test_a_sample_takes_whole_conversations(tiny_model_dir: Path, tmp_path: Path) -> None:
    # default_rng([0, 2]) picks the second of the two conversations, default_rng([4, 2]) the first
    for seed, ids in (("0", ["c0000t01"]), ("4", ["c0000t01", "c0000t02", "c0000t03"])):
        out = tmp_path / f"sample-{seed}"
        result = harness("prompts", "import", str(FIXTURES / "multi-turn.json"), str(out), "--tokenizer",
                         str(tiny_model_dir), "--sample", "1", "--seed", seed)
        assert result.returncode == 0, result.stderr
        assert [p.prompt_id for p in load_inventory(out).prompts] == ids


def test_lengths_only_keeps_each_turn_repeating_the_one_before(
        imported: Path, tiny_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "lengths"
    result = harness("prompts", "import", str(FIXTURES / "multi-turn.json"), str(out), "--tokenizer",
                     str(tiny_model_dir), "--lengths-only", "--vocab-high", "2045")
    assert result.returncode == 0, result.stderr
    kept, text = load_inventory(out).prompts, load_inventory(imported).prompts
    assert [(p.prompt_id, p.prompt_tokens, p.output_cap_tokens, p.turn) for p in kept] == \
        [(p.prompt_id, p.prompt_tokens, p.output_cap_tokens, p.turn) for p in text]
    ids = [p.token_ids or [] for p in kept]
    assert ids[1][:15] == ids[0] and ids[2][:36] == ids[1]  # turn k begins with turn k-1, whole
    written = (out / PROMPTS_FILE).read_text() + (out / MANIFEST_FILE).read_text()
    assert not any(words in written for words in ("cache hold", "Keys and values", "freed"))
    recipe = json.loads((out / MANIFEST_FILE).read_text())["recipe"]
    assert recipe["kind"] == "conversation_lengths" and recipe["lengths"]["source"] == "multi-turn.json"
    assert recipe["conversations"] == [[{"prompt_tokens": 15, "output_cap_tokens": 6},
                                        {"prompt_tokens": 36, "output_cap_tokens": 8},
                                        {"prompt_tokens": 58, "output_cap_tokens": 6}],
                                       [{"prompt_tokens": 19, "output_cap_tokens": 8}]]
    assert harness("prompts", "verify", str(out), "--rebuild").returncode == 0


def test_first_exchange_keeps_single_requests(tiny_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "first"
    result = harness("prompts", "import", str(FIXTURES / "multi-turn.json"), str(out), "--tokenizer",
                     str(tiny_model_dir), "--first-exchange")
    assert result.returncode == 0, result.stderr
    assert "2 conversation(s) went on after the first exchange" in result.stdout
    prompts = load_inventory(out).prompts
    assert [(p.text, p.prompt_tokens, p.conversation_id) for p in prompts] == \
        [(M1[0][0], 15, None), (M2[0][0], 19, None)]
    refused = harness("prompts", "import", str(FIXTURES / "counts.csv"), str(tmp_path / "x"), "--vocab-high", "2045",
                      "--first-exchange")
    assert refused.returncode == 2 and "--first-exchange: --format csv holds no conversations" in refused.stderr


def test_a_bad_later_turn_is_one_line_and_nothing_is_written(tiny_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "refused"
    refused = harness("prompts", "import", str(FIXTURES / "bad-later-turn.json"), str(out), "--tokenizer",
                      str(tiny_model_dir))
    assert refused.returncode == 2
    # the record starts on line 2 (the array opens on line 1); its third turn has no "from"
    assert refused.stderr.strip().splitlines() == [
        f"error: {FIXTURES / 'bad-later-turn.json'} line 2: field 'conversations.2.from': Field required"]
    assert not out.exists() or not any(out.iterdir())
