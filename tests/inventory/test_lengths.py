"""Length distributions: each draw's sample statistics match its parameters within a tolerance worked out
below, every length is exact and inside its bounds, and the recipe in the manifest rebuilds the same bytes.

Every tolerance is four standard errors of the statistic for the sample size, so a correct sampler fails
one in ~16,000 seeds; the seeds here are fixed, so the tests are also deterministic.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from harness.errors import HarnessError
from harness.inventory.build import build_text_inventory, drawn_shapes, rebuild, text_recipe
from harness.inventory.frozen import MANIFEST_FILE, PROMPTS_FILE, load_inventory, write_inventory
from harness.inventory.lengths import DrawnLengths, parse_distribution

DRAWS = 2000
HARNESS = str(Path(sys.executable).parent / "harness")


def draw(spec: str, count: int = DRAWS, seed: int = 11) -> np.ndarray:
    plan = DrawnLengths(count=count, prompt_tokens=parse_distribution(spec, "--prompt-tokens"),
                        output_cap_tokens=parse_distribution("fixed:1", "--output-cap-tokens"))
    prompts, _ = plan.draw(seed)
    return np.asarray(prompts)


def test_lognormal_median_and_sigma_match_their_parameters() -> None:
    lengths = draw("lognormal:median=1000,sigma=0.8,min=16,max=8192")
    assert lengths.dtype.kind == "i" and lengths.min() >= 16 and lengths.max() <= 8192
    logs = np.log(lengths)
    # The bounds cut P(X > 8192) = P(Z > ln(8.192)/0.8 = 2.629) = 0.0043 of the mass (below 16: P(Z < -5.17),
    # ~1e-7), which moves the median to the 0.4979 quantile: z = -0.0054, ×e^(-0.8 × 0.0054) = ×0.9957.
    # The sample median of ln X has standard error sqrt(pi/2) × 0.8 / sqrt(2000) = 0.0224; four of them are
    # ±0.0897 in ln, so the median lies within 1000 × 0.9957 × e^(±0.0897) = [910, 1089].
    assert 910 <= np.median(lengths) <= 1089
    # Truncating a normal above at b = 2.629 leaves variance 1 - bφ(b)/Φ(b) - (φ(b)/Φ(b))² = 0.9665, so the
    # standard deviation of ln X is 0.8 × 0.9831 = 0.7865; the sample sd's standard error is
    # 0.8 / sqrt(2 × 2000) = 0.0126, four of them ±0.051.
    assert abs(logs.std() - 0.7865) < 0.051


def test_normal_mean_and_sd_match_their_parameters() -> None:
    lengths = draw("normal:mean=500,sd=100")
    # Bounds [1, 2^24] cut P(Z < -4.99) ~ 3e-7: nothing. Standard errors at n = 2000: mean 100/sqrt(2000) = 2.24
    # (four: ±8.9); sd 100/sqrt(4000) = 1.58 (four: ±6.3). Rounding to whole tokens adds 1/12 to the variance.
    assert abs(lengths.mean() - 500) < 8.9
    assert abs(lengths.std() - 100) < 6.3


def test_uniform_covers_its_whole_range_evenly() -> None:
    lengths = draw("uniform:min=10,max=20")
    values, counts = np.unique(lengths, return_counts=True)
    assert values.tolist() == list(range(10, 21))
    # Each of the 11 lengths: expected 2000/11 = 181.8, sd sqrt(2000 × (1/11) × (10/11)) = 12.9, four: ±51.4.
    assert all(130 <= count <= 233 for count in counts)


def test_empirical_draws_the_histograms_frequencies_inside_the_bounds(tmp_path: Path) -> None:
    histogram = tmp_path / "histogram.csv"
    histogram.write_text("length,count\n100,1\n200,3\n300,0\n400,4\n", encoding="utf-8")
    lengths = draw(f"empirical:file={histogram},max=350")
    # max=350 drops 400: p(100) = 1/4, p(200) = 3/4 (300 has no count). Count of 100: expected 500,
    # sd sqrt(2000 × 0.25 × 0.75) = 19.4, four: ±77.5.
    assert set(lengths.tolist()) == {100, 200}
    assert 423 <= int((lengths == 100).sum()) <= 577


def test_fixed_and_bounds_and_seeds() -> None:
    assert set(draw("fixed:77", count=50).tolist()) == {77}
    assert draw("lognormal:median=50,sigma=1", seed=1).tolist() != draw("lognormal:median=50,sigma=1", seed=2).tolist()
    assert draw("lognormal:median=50,sigma=1", seed=1).tolist() == draw("lognormal:median=50,sigma=1", seed=1).tolist()


@pytest.mark.parametrize(("spec", "message"), [
    ("lognormal:median=1000", "--prompt-tokens lognormal: field 'sigma': Field required"),
    ("lognormal:median=-3,sigma=1", "field 'median': Input should be greater than 0"),
    ("uniform:min=9,max=3", "--prompt-tokens uniform: min 9 is above max 3"),
    ("gamma:k=2", "is neither a comma-separated list of lengths nor a distribution"),
    ("normal:mean=5,sd=1,min=100,max=200", "the bounds [100, 200] keep too little of the distribution"),
    ("empirical:max=3", "empirical needs file=HISTOGRAM.csv"),
])
def test_bad_distributions_are_refused_in_one_line(spec: str, message: str) -> None:
    with pytest.raises(HarnessError) as refused:
        draw(spec, count=10)
    assert message in str(refused.value) and "\n" not in str(refused.value)


def test_a_histogram_line_that_is_not_two_numbers_is_named(tmp_path: Path) -> None:
    histogram = tmp_path / "histogram.csv"
    histogram.write_text("length,count\n100,1\n200;3\n", encoding="utf-8")
    with pytest.raises(HarnessError, match=r"histogram\.csv line 3: '200;3' is not length,count"):
        parse_distribution(f"empirical:file={histogram}", "--prompt-tokens")


def test_a_list_beside_a_distribution_is_refused_and_a_single_length_is_fixed() -> None:
    with pytest.raises(HarnessError, match="--prompt-tokens: '100,200': with a distribution on the other side"):
        drawn_shapes("100,200", "uniform:min=1,max=9", 4, 0)
    lengths, caps, plan = drawn_shapes("100", "uniform:min=1,max=9", 4, 0)
    assert lengths == [100] * 4 and len(caps) == 4 and plan is not None
    assert drawn_shapes("100,200", "8", 2, 0) == ([100, 100, 200, 200], [8, 8, 8, 8], None)  # today's form


def harness(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([HARNESS, *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("spec", [
    "lognormal:median=60,sigma=0.8,min=16,max=400", "normal:mean=80,sd=20,min=10", "uniform:min=20,max=90",
    "empirical:file={histogram}", "fixed:33",
])
def test_each_distribution_rebuilds_byte_identically_from_its_manifest(spec: str, tmp_path: Path) -> None:
    histogram = tmp_path / "histogram.csv"
    histogram.write_text("40,5\n90,2\n", encoding="utf-8")
    out = tmp_path / "drawn"
    built = harness("prompts", "build", "token-ids", str(out), "--vocab-high", "500", "--count", "40",
                    "--prompt-tokens", spec.format(histogram=histogram),
                    "--output-cap-tokens", "lognormal:median=20,sigma=0.5,min=4,max=64", "--seed", "4")
    assert built.returncode == 0, built.stderr
    inventory = load_inventory(out)
    manifest = json.loads((out / MANIFEST_FILE).read_text())
    assert manifest["recipe"]["lengths"]["count"] == 40
    assert [p.prompt_tokens for p in inventory.prompts] == manifest["recipe"]["prompt_tokens"]
    assert all(len(p.token_ids or []) == p.prompt_tokens for p in inventory.prompts)  # every count exact
    again = write_inventory(rebuild(inventory.manifest), tmp_path / "again")
    for file in (PROMPTS_FILE, MANIFEST_FILE):
        assert (again / file).read_bytes() == (out / file).read_bytes()
    verified = harness("prompts", "verify", str(out), "--rebuild")
    assert verified.returncode == 0 and "intact, 40 prompts" in verified.stdout, verified.stderr


def test_a_manifest_whose_lengths_its_distribution_does_not_draw_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "drawn"
    built = harness("prompts", "build", "token-ids", str(out), "--vocab-high", "500", "--count", "20",
                    "--prompt-tokens", "lognormal:median=60,sigma=0.8", "--output-cap-tokens", "8")
    assert built.returncode == 0, built.stderr
    manifest = (out / MANIFEST_FILE).read_text()
    (out / MANIFEST_FILE).write_text(manifest.replace('"sigma": 0.8', '"sigma": 0.9'))
    refused = harness("prompts", "verify", str(out))
    assert refused.returncode == 2
    assert "are not the lengths that 'lengths' draws with seed 0" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1


def test_text_prompts_drawn_from_a_distribution_count_exactly(tiny_model_dir: Path, tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(" ".join(f"the cache holds {n} keys and values for every live sequence." for n in range(300)),
                      encoding="utf-8")
    lengths, caps, plan = drawn_shapes("lognormal:median=40,sigma=0.5,min=12,max=200", "16", 12, 3)
    recipe = text_recipe(corpus, tokenizer=str(tiny_model_dir), chat=True, prompt_tokens=lengths,
                         output_cap_tokens=caps, seed=3, lengths=plan)
    inventory = build_text_inventory("drawn-text", recipe)
    from tokenizers import Tokenizer

    raw = Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))
    for prompt, length in zip(inventory.prompts, lengths, strict=True):
        sent = f"<|im_start|>user\n{prompt.text}<|im_end|>\n<|im_start|>assistant\n"
        assert len(raw.encode(sent, add_special_tokens=False).ids) == length == prompt.prompt_tokens
    assert len(set(lengths)) > 6 and math.isclose(np.median(lengths), 40, rel_tol=0.5)
    again = rebuild(inventory.manifest)
    assert again.digest == inventory.digest
