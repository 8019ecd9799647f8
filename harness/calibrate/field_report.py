"""The field check as a person reads it: one row per case, each term's error, and the scored summary."""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from collections.abc import Callable

from pydantic import BaseModel
from rich.console import Group
from rich.table import Table
from rich.text import Text

from harness.calibrate.field_check import BOUNDED, KV_TOKENS_TOLERANCE
from harness.calibrate.field_results import CaseResult, FieldReport, LaunchCheck
from harness.units import GiB

TERMS = ("weights", "activation_peak", "non_torch", "cuda_graphs")
# The target for maximum concurrency at max_model_len: within one sequence or 2%, whichever is larger.
CONCURRENCY_TOLERANCE_SEQUENCES, CONCURRENCY_TOLERANCE = 1.0, 0.02


def concurrency_within(launch: LaunchCheck) -> bool | None:
    """Whether the predicted concurrency at max_model_len is within max(1 sequence, 2%) of the logged one."""
    if launch.concurrency_predicted is None or launch.concurrency_logged is None:
        return None
    allowed = max(CONCURRENCY_TOLERANCE_SEQUENCES, CONCURRENCY_TOLERANCE * launch.concurrency_logged)
    return abs(launch.concurrency_predicted - launch.concurrency_logged) <= allowed


class Score(BaseModel):
    """Counts behind one summary row; `None` shares mean nothing was scored."""

    cases: int
    logged_exact: int
    logged_scored: int
    logged_bounded: int  # fewer ranks' memory logged than ran, the figures below what it holds: no exactness check
    launch_within: int
    launch_scored: int
    fit_calls_right: int
    fit_calls: int
    launch_median_abs_residual: float | None  # median |predicted − logged| / logged KV tokens
    concurrency_within: int  # predicted max_model_len concurrency within max(1 sequence, 2%) of the logged
    concurrency_scored: int


def score(cases: list[CaseResult], held_back_only: bool = True) -> Score:
    residuals = [c.launch.kv_tokens_residual for c in cases if c.launch.kv_tokens_residual is not None
                 and (c.launch.held_back or not held_back_only)]
    calls = [c for c in cases if c.launch.fits_predicted is not None and (c.launch.held_back or not held_back_only)]
    logged = [c for c in cases if c.logged.status in ("exact", "off")]
    concurrency = [within for c in cases if (c.launch.held_back or not held_back_only)
                   and (within := concurrency_within(c.launch)) is not None]
    return Score(
        cases=len(cases),
        logged_exact=sum(c.logged.status == "exact" for c in logged), logged_scored=len(logged),
        logged_bounded=sum(c.logged.status == BOUNDED for c in cases),
        launch_within=sum(abs(residual) <= KV_TOKENS_TOLERANCE for residual in residuals),
        launch_scored=len(residuals),
        fit_calls_right=sum(c.launch.fits_predicted == c.cache_fit for c in calls), fit_calls=len(calls),
        launch_median_abs_residual=statistics.median(abs(r) for r in residuals) if residuals else None,
        concurrency_within=sum(concurrency), concurrency_scored=len(concurrency),
    )


def summary_lines(report: FieldReport) -> list[str]:
    """The headline figures, in words, with the counts they come from."""
    held, every = score(report.cases), score(report.cases, held_back_only=False)
    logged_calls = [c for c in report.cases if c.logged.fits is not None]
    per_source = Counter(c.source_key for c in report.cases)
    largest_cases = max(per_source.values())
    largest = ", ".join(sorted(key for key, count in per_source.items() if count == largest_cases))
    return [
        f"field corpus: {len(report.cases)} start-up logs",
        f"from logged KV memory: {held.logged_exact} of {held.logged_scored} scored cases exact within the "
        "log's rounding (blocks, tokens and concurrency); "
        f"{held.logged_bounded} more log fewer ranks' memory than ran and a cache below what it holds (vLLM sizes "
        "it by the smallest rank): bounded, not checked for exactness",
        f"before launch, held-back cases: {held.launch_within} of {held.launch_scored} within ±5% KV tokens "
        f"({_share(held.launch_within, held.launch_scored)}); all scored cases: {every.launch_within} of "
        f"{every.launch_scored}",
        f"before launch, median absolute KV-token error: held-back {_percent(held.launch_median_abs_residual)}, "
        f"all scored {_percent(every.launch_median_abs_residual)}",
        f"before launch, maximum concurrency at max_model_len within ±1 sequence or ±2% (the larger): held-back "
        f"{held.concurrency_within} of {held.concurrency_scored} "
        f"({_share(held.concurrency_within, held.concurrency_scored)}), all scored {every.concurrency_within} of "
        f"{every.concurrency_scored}",
        f"fit / no-fit before launch: {every.fit_calls_right} of {every.fit_calls} right "
        f"(held-back: {held.fit_calls_right} of {held.fit_calls}); {_at_risk_calls(report.cases)}",
        f"fit / no-fit from logged memory: {sum(c.logged.fits == c.cache_fit for c in logged_calls)} of "
        f"{len(logged_calls)} right",
        f"split by source: {len(per_source)} sources, each on the side its key's hash gives; the largest source holds "
        f"{largest_cases} of {len(report.cases)} cases ({_share(largest_cases, len(report.cases))}): {largest}",
    ]


def field_renderable(report: FieldReport) -> Group:
    return Group(_logged_table(report), _launch_table(report), _terms_table(report),
                 _group_table(report, "release", lambda c: c.release),
                 _group_table(report, "GPU family", lambda c: c.gpu_family),
                 _group_table(report, "architecture", lambda c: c.architecture),
                 _group_table(report, "model family", lambda c: c.family),
                 _constants_text(report), *[Text(line) for line in summary_lines(report)])


def _table(*headers: str, title: str) -> Table:
    """Cells fold rather than end in "…": a case id or a sampler path cut short cannot be traced."""
    table = Table(*headers, title=title)
    for column in table.columns:
        column.overflow = "fold"
    return table


def _logged_table(report: FieldReport) -> Table:
    table = _table("case", "release", "figure", "logged", "predicted (log rounding)", "result",
                  title="From the logged KV memory")
    for case in report.cases:
        if not case.logged.figures:
            table.add_row(case.id, case.release, "", "", "", case.logged.status)
        for figure in case.logged.figures:
            span = _number(figure.predicted_low) if figure.predicted_low == figure.predicted_high else \
                f"{_number(figure.predicted_low)} … {_number(figure.predicted_high)}"
            table.add_row(case.id, case.release, figure.name, _number(figure.logged), span,
                          "exact" if figure.within else
                          "below: a rank not logged" if case.logged.status == BOUNDED else "OFF")
    return table


def _number(value: float) -> str:
    """As the log writes it, for a person: 1,590,740 tokens, 48.55 requests; never 1.59074e+06."""
    return f"{int(value):,}" if float(value).is_integer() else f"{value:,.2f}".rstrip("0").rstrip(".")


def _launch_table(report: FieldReport) -> Table:
    table = _table("case", "set", "sampler (from): formula, origin", *[f"{t}_gib pred/logged" for t in TERMS],
                  "kv_gib pred/logged",
                  "kv_tokens pred/logged", "residual_pct", "max_concurrency pred/logged", "fits pred/real",
                  title="Before launch")
    for case in report.cases:
        launch = case.launch
        sampler = f"{case.sampler.name} ({case.sampler.source})"
        if launch.sampler_path is not None:
            path = launch.sampler_path
            per_logit = path.priced(report.constants.sampler_bytes_per_logit)
            sampler += f": {path.path} {per_logit:.4g} B/logit, {path.origin}"
        if launch.status != "scored":
            table.add_row(case.id, _set(case), sampler, *[""] * (len(TERMS) + 4), launch.status)
            continue
        terms = {t.name: t for t in launch.terms}
        table.add_row(
            case.id, _set(case), sampler,
            *[_pair(terms[t].predicted_bytes, terms[t].logged_bytes) + ("" if terms[t].subtracted else " (after)")
              for t in TERMS],
            _pair(launch.kv_bytes_predicted, launch.kv_bytes_logged),
            f"{launch.kv_tokens_predicted:,} / "
            + (f"{launch.kv_tokens_logged:,}" if launch.kv_tokens_logged else "—"),
            "—" if launch.kv_tokens_residual is None else f"{100 * launch.kv_tokens_residual:+.1f}",
            " / ".join("—" if value is None else f"{value:,.2f}"
                       for value in (launch.concurrency_predicted, launch.concurrency_logged)),
            f"{_yes(launch.fits_predicted)}{_warmup_risk(launch)} / {_yes(case.cache_fit)}",
        )
    return table


def _at_risk_calls(cases: list[CaseResult]) -> str:
    """The "fits" calls answered at risk, the cache's margin inside the error band, and how those starts went:
    an at-risk call still counts as "fits" above."""
    risky = [c for c in cases if c.launch.cache_margin is not None and c.launch.cache_margin.at_risk]
    failed = [c.id for c in risky if not c.cache_fit]
    return (f"{len(risky)} \"fits\" answered at risk, the cache's room for one request inside the error band, "
            f"{len(failed)} of them failed" + (f" ({', '.join(failed)})" if failed else ""))


def _warmup_risk(launch: LaunchCheck) -> str:
    """The cache's room for one request where it is inside the error band, and the sampler warm-up's need against
    what the cache left, GiB, where it does not comfortably fit."""
    risk = ""
    if (margin := launch.cache_margin) is not None and margin.at_risk:
        risk = f" (at risk: {margin.margin_bytes / GiB:.2f} GiB to spare, band {margin.band_bytes / GiB:.2f})"
    warmup = launch.warmup
    if warmup is None or warmup.verdict == "fits":
        return risk
    return risk + f" (warm-up {warmup.verdict}: {warmup.needed_bytes / GiB:.2f} of {warmup.left_bytes / GiB:.2f} GiB)"


def _terms_table(report: FieldReport) -> Table:
    """Each term's own error, fit and held-back cases apart, so one term's miss cannot hide in the total."""
    table = _table("term", "set", "cases", "mean_abs_error_gib", "max_abs_error_gib", title="Error of each term")
    for term in TERMS:
        for held in (False, True):
            errors = [abs(t.predicted_bytes - t.logged_bytes) / GiB for c in report.cases
                      if c.launch.held_back == held for t in c.launch.terms
                      if t.name == term and t.logged_bytes is not None]
            if errors:
                table.add_row(term, "held-back" if held else "fit", str(len(errors)),
                              f"{sum(errors) / len(errors):.2f}", f"{max(errors):.2f}")
    return table


def _group_table(report: FieldReport, title: str, key: Callable[[CaseResult], str]) -> Table:
    groups: dict[str, list[CaseResult]] = defaultdict(list)
    for case in report.cases:
        groups[key(case)].append(case)
    table = _table(title, "cases", "logged_exact", "launch_within_5pct (held-back)", "fit_calls_right (held-back)",
                  title=f"Summary per {title}")
    for name in sorted(groups):
        s = score(groups[name])
        table.add_row(name, str(s.cases), f"{s.logged_exact}/{s.logged_scored}",
                      f"{s.launch_within}/{s.launch_scored}", f"{s.fit_calls_right}/{s.fit_calls}")
    return table


def _constants_text(report: FieldReport) -> Text:
    c = report.constants
    return Text(f"constants fitted on {', '.join(c.fitted_on)}: sorting sampler {c.sampler_bytes_per_logit:.4g} B "
                "per logit (the Triton and FlashInfer paths are priced from the code); non-torch "
                f"{c.non_torch_gib:.3g} GiB (Hopper parts {c.hopper_non_torch_gib:.3g}, GPUs sharing their host's "
                f"memory {c.host_memory_non_torch_gib:.3g}) + {c.nccl_gib:.3g} GiB of "
                "NCCL buffers with TP or PP where the release counts them (the CUDA context where it counts that, "
                "and NCCL's NVLS buffers on NVSwitch boards, 288 MiB per rank past two, are measured or NCCL's own "
                f"figures); CUDA graphs {c.cuda_graph_gib} GiB")


def _pair(predicted: int | None, logged: int | None) -> str:
    shown = "—" if predicted is None else f"{predicted / GiB:.2f}"
    return shown + " / " + ("—" if logged is None else f"{logged / GiB:.2f}")


def _set(case: CaseResult) -> str:
    return "held-back" if case.launch.held_back else "fit"


def _yes(value: bool | None) -> str:
    return "—" if value is None else ("fits" if value else "no")


def _percent(share: float | None) -> str:
    return "n/a" if share is None else f"{100 * share:.1f}%"


def _share(part: int, whole: int) -> str:
    return "n/a" if not whole else f"{100 * part / whole:.0f}%"
