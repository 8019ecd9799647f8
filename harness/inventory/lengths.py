"""Where an inventory's lengths come from: a seeded draw from a length distribution, kept in the recipe beside
the lengths it drew, so the manifest says what traffic it stands for and a rebuild proves the draw.

Traffic is not one length: at many requests in flight the tail of the length distribution, not its mean,
decides whether the KV cache holds them. The distributions are the usual ones for request lengths (fixed,
uniform, normal, log-normal, or an empirical histogram of real lengths), each cut to bounds: a draw outside
[min, max] is drawn again (a truncated distribution, not one piled up at its bounds).
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Literal, TypeVar

import numpy as np
import pydantic
from pydantic import Field, model_validator

from harness.errors import HarnessError, describe_validation_error
from harness.inventory.fields import (
    MAX_PROMPT_TOKENS,
    MAX_PROMPTS,
    FrozenModel,
    OneLine,
    PositiveTokens,
    Sha256Hex,
    TokenizerIdentity,
)
from harness.paths import read_text

# The stream of the recipe's seed that draws lengths; the token ids use the seed itself, so adding a length
# distribution to a recipe never changes which ids a given seed draws.
LENGTH_STREAM = 1
# A draw keeps what falls inside the bounds; this many rounds of redrawing find enough unless the bounds
# keep almost nothing of the distribution, which is then refused rather than looped on.
MAX_REDRAW_ROUNDS = 64
MAX_HISTOGRAM_BINS = 2**16
PositiveFloat = Annotated[float, Field(gt=0, allow_inf_nan=False)]


class _Bounded(FrozenModel):
    min_tokens: PositiveTokens = 1
    max_tokens: PositiveTokens = MAX_PROMPT_TOKENS

    @model_validator(mode="after")
    def _ordered(self) -> _Bounded:
        if self.min_tokens > self.max_tokens:
            raise ValueError(f"min {self.min_tokens} is above max {self.max_tokens}")
        return self

    def _truncated(self, sample: Callable[[int], np.ndarray], count: int) -> np.ndarray:
        """`count` draws rounded to whole tokens, those outside [min, max] drawn again."""
        kept = np.empty(0, dtype=np.int64)
        for _ in range(MAX_REDRAW_ROUNDS):
            batch = np.rint(sample(max(2 * (count - kept.size), 64)))
            inside = batch[(batch >= self.min_tokens) & (batch <= self.max_tokens)].astype(np.int64)
            kept = np.concatenate([kept, inside])
            if kept.size >= count:
                return kept[:count]
        raise HarnessError(f"{self.describe()}: the bounds [{self.min_tokens}, {self.max_tokens}] keep too little "
                           f"of the distribution to draw {count} lengths")

    def describe(self) -> str:
        raise NotImplementedError


class FixedLengths(FrozenModel):
    kind: Literal["fixed"] = "fixed"
    tokens: PositiveTokens

    def draw(self, count: int, rng: np.random.Generator) -> np.ndarray:
        return np.full(count, self.tokens, dtype=np.int64)

    def describe(self) -> str:
        return f"fixed:{self.tokens}"


class UniformLengths(_Bounded):
    """Every whole length in [min, max] equally likely."""

    kind: Literal["uniform"] = "uniform"

    def draw(self, count: int, rng: np.random.Generator) -> np.ndarray:
        return rng.integers(self.min_tokens, self.max_tokens + 1, size=count, dtype=np.int64)

    def describe(self) -> str:
        return f"uniform:min={self.min_tokens},max={self.max_tokens}"


class NormalLengths(_Bounded):
    kind: Literal["normal"] = "normal"
    mean_tokens: PositiveFloat
    sd_tokens: PositiveFloat

    def draw(self, count: int, rng: np.random.Generator) -> np.ndarray:
        return self._truncated(lambda n: rng.normal(self.mean_tokens, self.sd_tokens, size=n), count)

    def describe(self) -> str:
        return f"normal:mean={self.mean_tokens:g},sd={self.sd_tokens:g}"


class LogNormalLengths(_Bounded):
    """ln(length) is normal with mean ln(median) and standard deviation sigma: the long right tail of real
    request lengths (p99 = median × e^(2.326 sigma))."""

    kind: Literal["lognormal"] = "lognormal"
    median_tokens: PositiveFloat
    sigma: PositiveFloat = Field(le=8)  # beyond 8 the tail spans more than 2^24 tokens: no real traffic

    def draw(self, count: int, rng: np.random.Generator) -> np.ndarray:
        return self._truncated(lambda n: rng.lognormal(math.log(self.median_tokens), self.sigma, size=n), count)

    def describe(self) -> str:
        return f"lognormal:median={self.median_tokens:g},sigma={self.sigma:g}"


class EmpiricalLengths(_Bounded):
    """Lengths drawn with the frequencies of a histogram of real ones (the histogram is kept here, so the
    recipe does not depend on the file it was read from; the file's hash says which it was)."""

    kind: Literal["empirical"] = "empirical"
    source: OneLine
    source_sha256: Sha256Hex
    lengths: list[PositiveTokens] = Field(min_length=1, max_length=MAX_HISTOGRAM_BINS)
    counts: list[Annotated[int, Field(ge=0, le=2**40)]] = Field(min_length=1, max_length=MAX_HISTOGRAM_BINS)

    @model_validator(mode="after")
    def _histogram(self) -> EmpiricalLengths:
        if len(self.lengths) != len(self.counts):
            raise ValueError(f"{len(self.lengths)} lengths but {len(self.counts)} counts")
        if self.lengths != sorted(set(self.lengths)):
            raise ValueError("histogram lengths must be sorted and unique")
        inside = zip(self.lengths, self.counts, strict=True)
        if not any(count and self.min_tokens <= length <= self.max_tokens for length, count in inside):
            raise ValueError(f"no counted histogram length inside [{self.min_tokens}, {self.max_tokens}]")
        return self

    def draw(self, count: int, rng: np.random.Generator) -> np.ndarray:
        lengths = np.asarray(self.lengths, dtype=np.int64)
        weights = np.asarray(self.counts, dtype=np.float64)
        weights[(lengths < self.min_tokens) | (lengths > self.max_tokens)] = 0.0
        return rng.choice(lengths, size=count, p=weights / weights.sum())

    def describe(self) -> str:
        return f"empirical:file={self.source}"


LengthDistribution = Annotated[
    FixedLengths | UniformLengths | NormalLengths | LogNormalLengths | EmpiricalLengths,
    Field(discriminator="kind"),
]

AnyDistribution = FixedLengths | UniformLengths | NormalLengths | LogNormalLengths | EmpiricalLengths
DistributionT = TypeVar("DistributionT", bound=FrozenModel)


class DrawnLengths(FrozenModel):
    """`count` prompt lengths and output caps drawn independently from two distributions with the recipe's
    seed (prompt lengths first, then output caps, from one generator)."""

    kind: Literal["drawn"] = "drawn"
    count: int = Field(gt=0, le=MAX_PROMPTS)
    prompt_tokens: LengthDistribution
    output_cap_tokens: LengthDistribution

    def draw(self, seed: int) -> tuple[list[int], list[int]]:
        rng = np.random.default_rng([seed, LENGTH_STREAM])
        prompts = self.prompt_tokens.draw(self.count, rng)
        caps = self.output_cap_tokens.draw(self.count, rng)
        return [int(n) for n in prompts], [int(n) for n in caps]


ImportFormat = Literal["openai", "sharegpt", "csv"]


class ImportedLengths(FrozenModel):
    """Lengths read from a user's own traffic (`harness prompts import ... --lengths-only`, or a CSV of
    counts): the records stay with the user, the manifest keeps which file (its name and sha256), how many
    records it held and skipped, the sample taken, and the tokenizer that counted any text."""

    kind: Literal["imported"] = "imported"
    format: ImportFormat
    source: OneLine
    source_sha256: Sha256Hex
    records: int = Field(ge=1)
    skipped_records: int = Field(ge=0)
    sample: int | None = Field(None, ge=1)
    tokenizer: TokenizerIdentity | None


# Where a recipe's lengths came from, when not listed by hand; a union so that other sources (conversations,
# shared-prefix groups) join it as kinds of their own.
LengthSource = Annotated[DrawnLengths | ImportedLengths, Field(discriminator="kind")]


# --- from the command line ---------------------------------------------------------------------------------

DISTRIBUTION = re.compile(r"^\s*(fixed|uniform|normal|lognormal|empirical)\s*:(.*)$")
KINDS: dict[str, type[FixedLengths | UniformLengths | NormalLengths | LogNormalLengths]] = {
    "fixed": FixedLengths, "uniform": UniformLengths, "normal": NormalLengths, "lognormal": LogNormalLengths,
}


def is_distribution(value: str) -> bool:
    return DISTRIBUTION.match(value) is not None


def parse_distribution(value: str, option: str) -> AnyDistribution:
    """'lognormal:median=1000,sigma=0.8,min=16,max=8192' → its model; 'fixed:512'; 'empirical:file=h.csv'.

    Parameters are the model's fields without their unit (`median` is `median_tokens`)."""
    matched = DISTRIBUTION.match(value)
    if matched is None:
        raise HarnessError(f"{option}: {value!r} is neither a comma-separated list of lengths nor a distribution "
                           "(fixed:N, uniform:min=,max=, normal:mean=,sd=, lognormal:median=,sigma=, "
                           "empirical:file=)")
    kind, parameters = matched.group(1), matched.group(2).strip()
    if kind == "fixed" and "=" not in parameters:
        parameters = f"tokens={parameters}"
    fields: dict[str, str] = {}
    for part in parameters.split(",") if parameters else []:
        key, equals, number = part.partition("=")
        if not equals or not key.strip():
            raise HarnessError(f"{option}: {part!r} in {value!r} is not name=value")
        fields[key.strip()] = number.strip()
    if kind == "empirical":
        return _empirical(fields, option)
    named = {key if key in ("sigma", "tokens") else f"{key}_tokens": number for key, number in fields.items()}
    return _validated(KINDS[kind], named, option, kind)


def _validated(model: type[DistributionT], fields: Mapping[str, object], option: str, kind: str) -> DistributionT:
    """The distribution's model, a refused parameter named as the user wrote it (`median`, not `median_tokens`)."""
    try:
        return model.model_validate(fields)
    except pydantic.ValidationError as error:
        message = describe_validation_error(error, f"{option} {kind}").replace("_tokens'", "'")
        raise HarnessError(message.replace("field '(root)': Value error, ", "")) from None


def _empirical(fields: dict[str, str], option: str) -> EmpiricalLengths:
    """A histogram file: CSV lines `length,count` (a header line allowed), one line per length."""
    if "file" not in fields:
        raise HarnessError(f"{option}: empirical needs file=HISTOGRAM.csv (lines of length,count)")
    file = Path(fields.pop("file"))
    text = read_text(file, option)
    histogram: dict[int, int] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        cells = [cell.strip() for cell in line.split(",")]
        if not line.strip() or (number == 1 and not cells[0].isdigit()):
            continue  # a blank line, or the header
        if len(cells) != 2 or not all(cell.isdigit() for cell in cells):
            raise HarnessError(f"{file} line {number}: {line.strip()!r} is not length,count (two whole numbers)")
        length, count = int(cells[0]), int(cells[1])
        if length in histogram:
            raise HarnessError(f"{file} line {number}: length {length} is listed twice")
        histogram[length] = count
    if not histogram:
        raise HarnessError(f"{file}: no length,count lines")
    named = {f"{key}_tokens": value for key, value in fields.items()}
    ordered = sorted(histogram)
    return _validated(EmpiricalLengths, {
        **named, "source": file.name, "source_sha256": hashlib.sha256(file.read_bytes()).hexdigest(),
        "lengths": ordered, "counts": [histogram[length] for length in ordered],
    }, option, "empirical")
