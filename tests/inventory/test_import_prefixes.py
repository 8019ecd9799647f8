"""Prefixes found in imported traffic: the leading tokens requests share, recorded at token level and priced
by the prefix-cache prediction in the engine's whole blocks.

The fixture tests/fixtures/traffic/shared-system.jsonl holds 4 chat requests sharing one system prompt and a
fifth without it; counts are checked against the raw `tokenizers` library on the tiny model's tokenizer.
"""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from harness.inventory.frozen import load_inventory
from harness.inventory.segments import sent_prompts
from harness.inventory.shared_prefixes import find_shared_prefixes
from harness.predict.prefix_cache import predict_prefix_hits

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "traffic"
HARNESS = str(Path(sys.executable).parent / "harness")


def harness(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([HARNESS, *args], capture_output=True, text=True, timeout=120)


def common_length(first: list[int], second: list[int]) -> int:
    differing = (i for i, (a, b) in enumerate(zip(first, second, strict=False)) if a != b)
    return next(differing, min(len(first), len(second)))


def test_the_lengths_each_prompt_shares_are_its_common_lengths_with_every_other() -> None:
    rng = random.Random(3)
    for _ in range(200):  # small alphabets, so that prompts share often and at many lengths
        prompts = [[rng.randint(0, 2) for _ in range(rng.randint(1, 6))] for _ in range(rng.randint(1, 9))]
        found = [[shared.prefix_tokens for shared in prompt] for prompt in find_shared_prefixes(prompts)]
        pairwise = [sorted({common_length(p, q) for j, q in enumerate(prompts) if j != i} - {0})
                    for i, p in enumerate(prompts)]
        assert found == pairwise, prompts


@pytest.fixture(scope="module")
def imported(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("import") / "shared-system"
    done = harness("prompts", "import", str(FIXTURES / "shared-system.jsonl"), str(out),
                   "--tokenizer", str(tiny_model_dir))
    assert done.returncode == 0, done.stderr
    return out


def test_requests_sharing_a_system_prompt_record_how_far_they_agree(imported: Path, tiny_model_dir: Path) -> None:
    raw = Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))
    system = load_inventory(imported).prompts[0].chat_messages()[0]["content"]
    # The first 4 are rendered <|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{question}...: they
    # agree up to their questions, which begin "How", "Which", "What", "Who"; the fifth has no system turn.
    header = f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n"
    agreed = len(raw.encode(header, add_special_tokens=False).ids)
    assert agreed == 225
    prompts = load_inventory(imported).prompts
    shared = [[p.prefix_tokens for p in prompt.shared_prefixes or []] for prompt in prompts]
    # Every prompt starts with the <|im_start|> token (1); the 4 agree on 225; "Which", "What" and "Who" share
    # one token more ("W"), 226.
    assert shared == [[1, 225], [1, 225, 226], [1, 225, 226], [1, 225, 226], [1]]
    names = {prefix.sha256 for prompt in prompts[:4] for prefix in prompt.shared_prefixes or []
             if prefix.prefix_tokens == 225}
    assert len(names) == 1  # one name for the same 225 tokens
    verified = harness("prompts", "verify", str(imported), "--rebuild")
    assert verified.returncode == 0, verified.stderr


def test_the_prediction_pads_imported_prefixes_to_whole_blocks(imported: Path) -> None:
    inventory = load_inventory(imported)
    sent = sent_prompts(inventory, [(p.prompt_id, p.output_cap_tokens) for p in inventory.prompts])
    # Block 16: the first request misses; each of the next 3 hits the whole blocks of the 225 (or 226) shared
    # tokens, 225 // 16 = 226 // 16 = 14 blocks = 224 tokens (its last prompt token, at 239 or later, is
    # computed anyway); the fifth shares 1 token, no whole block. 3 x 224 = 672.
    assert predict_prefix_hits(sent, 16).hit_tokens_by_request == [0, 224, 224, 224, 0]
    # Block 128: 225 // 128 = 1 block each, 3 x 128 = 384.
    assert predict_prefix_hits(sent, 128).hit_tokens == 384
    priced = harness("prompts", "reuse", str(imported), "--block-size", "16")
    assert priced.returncode == 0, priced.stderr
    assert "672 hit in blocks of 16" in priced.stdout
