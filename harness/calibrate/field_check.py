"""Score the calculator on the field corpus: from the logged KV memory, and before launch.

From logged memory: the release's own arithmetic must land on the logged blocks, tokens and
concurrency for some KV figure inside the rounding of the printed GiB. Before launch: the memory
model of `harness/predict/memory_model.py` predicts every term from the GPU, the limits and the config; its
constants are fitted on every other source of the corpus (`harness/calibrate/field_split.py`: one
thread's or one repository's cases never sit on both sides) and scored on the others, so the held-back
figures were never seen by the fit.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import numpy as np
from packaging.version import Version
from pydantic import BaseModel

from harness.calibrate.error_band import kv_error_share
from harness.calibrate.field_corpus import FieldCase, architecture, load_corpus
from harness.calibrate.field_launch import (
    engine_launch,
    gpu_total,
    is_v0,
    known_sampler,
    profiling_run,
    sampler_fact,
    sampler_name,
)
from harness.calibrate.field_results import (
    CaseResult,
    FieldReport,
    FigureCheck,
    LaunchCheck,
    LoggedCheck,
    TermCheck,
)
from harness.calibrate.field_split import fit_case_ids, source_key
from harness.errors import HarnessError
from harness.observe.memory_profile import logged_term_bytes
from harness.observe.server_logs import StartupCapacity
from harness.predict.activation import activation_parts
from harness.predict.budget import CapacityPrediction
from harness.predict.cache_margin import cache_margin
from harness.predict.memory_model import (
    CONTEXT_COUNTED_BEFORE,
    LORA_NOT_SIZED,
    MemoryConstants,
    plan_waterfall,
    second_runner,
)
from harness.predict.model_shape import ModelShape, load_model_shape
from harness.predict.non_torch import (
    base_class,
    communicator_bytes,
    communicators_counted,
    nvls_bytes,
)
from harness.predict.parameter_count import model_size
from harness.predict.pipeline import predict_pipeline_capacity, stage_memory
from harness.predict.profile_batch import ProfileBatch
from harness.predict.releases import GRAPHS_RESERVED_SINCE, gpu_memory_utilization, runs_v0
from harness.predict.sampler_peak import SamplerPath, sampler_path
from harness.predict.warmup import check_warmup
from harness.units import GiB

HALF_STEP = GiB // 200  # a GiB figure printed with two decimals stands for ± 0.005 GiB
KV_TOKENS_TOLERANCE = 0.05
SAMPLER_GRID = np.arange(0.0, 100.0, 0.01)  # bytes per logit tried when fitting the PyTorch sampler's peak


def run_field_check(directory: Path) -> FieldReport:
    cases, configs = load_corpus(directory)
    shapes, refusals = model_shapes(directory, configs)
    modelled = {name: config for name, config in configs.items() if name in shapes}
    fit_ids = fit_case_ids(cases)
    constants = fit_constants([c for c in cases if c.id in fit_ids], modelled)
    results = []
    for case in cases:
        config, shape = modelled.get(case.facts.config or ""), shapes.get(case.facts.config or "")
        shape = shape.served_in(case.facts.dtype) if shape else None
        held_back, refusal = case.id not in fit_ids, refusals.get(case.facts.config or "")
        results.append(CaseResult(
            id=case.id, source=str(case.source), source_key=source_key(case), release=case.facts.vllm_version,
            family=case.family, gpu_family=case.gpu_family,
            architecture=architecture(configs.get(case.facts.config or "")),
            sampler=sampler_fact(case), started=case.facts.started,
            cache_fit=case.facts.started or case.facts.failed_after_cache_sized,
            logged=LoggedCheck(status=refusal) if refusal else check_logged(case, shape),
            launch=LaunchCheck(status=refusal, held_back=held_back) if refusal else check_launch(
                case, shape, config, constants, held_back=held_back),
        ))
    return FieldReport(constants=constants, cases=results)


def model_shapes(directory: Path, configs: dict[str, dict[str, Any]]) -> tuple[dict[str, ModelShape], dict[str, str]]:
    """Each config's shape, and for a config whose architecture the calculator refuses, why: its cases say so
    ("not modelled: ..."), and the rest of the corpus is scored."""
    shapes, refusals = {}, {}
    for name in configs:
        try:
            shapes[name] = load_model_shape(str(directory / "configs" / name))
        except HarnessError as error:
            refusals[name] = f"not modelled: {error}"
    return shapes, refusals


def predict_from_memory(case: FieldCase, shape: ModelShape, stage_bytes: list[int]) -> CapacityPrediction:
    """The release's arithmetic on each pipeline stage's memory; the stage with fewest blocks sets the cache."""
    facts = case.facts
    return predict_pipeline_capacity(
        shape, stage_bytes, block_size=facts.block_size, max_model_len=facts.max_model_len,
        kv_cache_dtype=facts.kv_cache_dtype, tensor_parallel_size=facts.tensor_parallel_size,
        max_num_batched_tokens=facts.max_num_batched_tokens, engine_version=facts.vllm_version,
        engine_generation=facts.engine, prefix_caching=facts.enable_prefix_caching,
        speculative=facts.speculative, decode_context_parallel_size=facts.decode_context_parallel_size)


def fits(prediction: CapacityPrediction) -> bool:
    """Whether one request of max_model_len tokens fits the cache, the check vLLM makes before serving."""
    return prediction.num_blocks >= prediction.blocks_per_request and prediction.num_blocks > 0


UNSTATED_CACHE = "not scored: the excerpt leaves out what the cache holds (its KV dtype or a drafter)"
LORA_UNMODELLED = f"not modelled: {LORA_NOT_SIZED}"
DEVELOPMENT_BUILD = "not scored before launch: an unreleased build's memory accounting, no release's"
BOUNDED = "bounded"  # the log gives fewer ranks' KV memory than ran: its figures are at most the quoted rank's
MEMORY_BOUND_FIGURES = ("num_blocks", "kv_cache_tokens", "max_concurrency")  # what a smaller rank's memory lowers


def check_logged(case: FieldCase, shape: ModelShape | None) -> LoggedCheck:
    if shape is None:
        return LoggedCheck(status="no config for this model")
    if not case.facts.cache_contents_stated:
        return LoggedCheck(status=UNSTATED_CACHE)
    log = case.parsed()
    stage_bytes = _stage_memory(case, log.available_kv_cache_bytes_by_rank, log.available_kv_cache_bytes)
    if stage_bytes is None:
        return LoggedCheck(status="no KV memory in the log")
    try:
        low = predict_from_memory(case, shape, [max(0, b - HALF_STEP) for b in stage_bytes])
        high = predict_from_memory(case, shape, [b + HALF_STEP for b in stage_bytes])
    except HarnessError as error:
        return LoggedCheck(status=f"not modelled: {error}")
    figures = _capacity_figures(log, low, high)
    if log.kv_cache_bytes_needed is not None:  # a refused V1 start states what one request needs
        needed = round(high.blocks_per_request * high.bytes_per_block / GiB, 2)
        logged_needed = round(log.kv_cache_bytes_needed / GiB, 2)
        figures.append(FigureCheck(name="kv_gib_needed_per_request", logged=logged_needed, predicted_low=needed,
                                   predicted_high=needed, within=needed == logged_needed))
    if not figures:
        return LoggedCheck(status="no capacity figure to compare", fits=fits(high))
    status = "exact" if all(figure.within for figure in figures) else "off"
    if status == "off" and _bounded_by_quoted_ranks(case, log.available_kv_cache_bytes_by_rank, figures):
        status = BOUNDED
    return LoggedCheck(status=status, figures=figures, fits=fits(high) if fits(low) == fits(high) else None)


def _capacity_figures(log: StartupCapacity, low: CapacityPrediction, high: CapacityPrediction) -> list[FigureCheck]:
    """Each capacity figure the log prints against what its memory holds at either end of the log's rounding."""
    logged = {"num_blocks": log.num_gpu_blocks, "kv_cache_tokens": log.kv_cache_tokens,
              "max_concurrency": log.max_concurrency}
    figures = []
    for name, value in logged.items():
        if value is None:
            continue
        lo, hi = getattr(low, name), getattr(high, name)
        if name == "max_concurrency":
            lo, hi = round(lo, 2), round(hi, 2)
        figures.append(FigureCheck(name=name, logged=value, predicted_low=lo, predicted_high=hi,
                                   within=lo <= value <= hi))
    return figures


def _bounded_by_quoted_ranks(case: FieldCase, by_rank: dict[int, int], figures: list[FigureCheck]) -> bool:
    """Whether a log that gives fewer ranks' KV memory than the start ran has its cache figures at most what the
    quoted memory holds. vLLM gives every rank the smallest rank's blocks (V0 executor_base.py
    `determine_num_available_blocks`, read in 0.8.3; V1 kv_cache_utils.py `get_kv_cache_configs`, read in 0.12.0),
    and a rank the log does not quote may have had less: in 0.12.0 each node's first worker alone prints "Available
    KV cache memory" (`info_once(..., scope="local")`), and an excerpt may quote one worker's line of several. Such a
    start is no check of exactness, only of that bound."""
    ranks = case.facts.tensor_parallel_size * case.facts.pipeline_parallel_size
    if ranks == 1 or set(by_rank) == set(range(ranks)):
        return False
    return all(figure.within or (figure.name in MEMORY_BOUND_FIGURES and figure.logged < figure.predicted_low)
               for figure in figures)


def _stage_memory(case: FieldCase, by_rank: dict[int, int], headline: int | None) -> list[int] | None:
    return stage_memory(by_rank, headline, tensor_parallel_size=case.facts.tensor_parallel_size,
                        pipeline_parallel_size=case.facts.pipeline_parallel_size)


def check_launch(case: FieldCase, shape: ModelShape | None, config: dict[str, Any] | None,
                 constants: MemoryConstants, *, held_back: bool) -> LaunchCheck:
    total = gpu_total(case)
    if shape is None or config is None:
        return LaunchCheck(status="no config for this model", held_back=held_back)
    if not case.facts.cache_contents_stated:
        return LaunchCheck(status=UNSTATED_CACHE, held_back=held_back)
    if case.facts.enable_lora:
        return LaunchCheck(status=LORA_UNMODELLED, held_back=held_back)
    if case.facts.development_build:
        return LaunchCheck(status=f"{DEVELOPMENT_BUILD} ({case.facts.development_build})", held_back=held_back)
    if total is None:
        return LaunchCheck(status=f"GPU memory not established ({case.facts.gpu or 'GPU not named'})",
                           held_back=held_back)
    facts, log = case.facts, case.parsed()
    try:  # a checkpoint format the weights are not priced for leaves the case unscored, not the corpus
        waterfall = plan_waterfall(config, constants, engine_launch(case), total_bytes=total[0], total_source=total[1],
                                   gpu_name=facts.gpu)
    except HarnessError as error:
        return LaunchCheck(status=f"not modelled: {error}", held_back=held_back)
    logged_terms = logged_term_bytes(log)
    terms = [TermCheck(name=t.name, predicted_bytes=t.bytes, logged_bytes=logged_terms.get(t.name),
                       subtracted=t.subtracted) for t in waterfall.terms]
    try:
        prediction = predict_from_memory(case, shape, waterfall.stage_kv_bytes)
    except HarnessError as error:
        return LaunchCheck(status=f"not modelled: {error}", held_back=held_back, terms=terms)
    logged_tokens = (log.kv_cache_tokens or log.kv_cache_tokens_at_failure
                     or (log.num_gpu_blocks * facts.block_size if log.num_gpu_blocks else None))
    logged_concurrency = log.max_concurrency if log.max_concurrency_model_len == facts.max_model_len else None
    stage_bytes = _stage_memory(case, log.available_kv_cache_bytes_by_rank, log.available_kv_cache_bytes)
    if stage_bytes is not None and (logged_tokens is None or logged_concurrency is None):
        from_memory = predict_from_memory(case, shape, stage_bytes)  # the release's arithmetic on the logged memory
        logged_tokens = from_memory.kv_cache_tokens if logged_tokens is None else logged_tokens
        logged_concurrency = from_memory.max_concurrency if logged_concurrency is None else logged_concurrency
    residual = None
    if logged_tokens:
        residual = (prediction.kv_cache_tokens - logged_tokens) / logged_tokens
    warmup = check_warmup(waterfall, model_size(config), v0=runs_v0(Version(facts.vllm_version), facts.engine),
                          logged_graph_bytes=logged_terms.get("cuda_graphs"))
    return LaunchCheck(
        status="scored", held_back=held_back, terms=terms, kv_bytes_predicted=waterfall.kv_bytes,
        kv_bytes_logged=log.available_kv_cache_bytes, kv_tokens_predicted=prediction.kv_cache_tokens,
        kv_tokens_logged=logged_tokens, kv_tokens_residual=residual,
        concurrency_predicted=prediction.max_concurrency, concurrency_logged=logged_concurrency,
        fits_predicted=fits(prediction) and (warmup is None or warmup.verdict != "does not fit"),
        cache_margin=cache_margin(prediction, waterfall.usable_bytes, constants.kv_error_share),
        sampler_path=waterfall.sampler, warmup=warmup,
    )


class NonTorchFit(BaseModel, frozen=True):
    """The fitted non-torch figures, GiB per GPU (see `MemoryConstants`)."""

    base_gib: float
    hopper_gib: float
    host_memory_gib: float
    nccl_gib: float


def fit_constants(cases: list[FieldCase], configs: dict[str, dict[str, Any]]) -> MemoryConstants:
    """Least squares for the sorting sampler's bytes per logit; medians for non-torch and graph memory.

    The activation peak is the larger of the forward pass and the sampler (both from vLLM's code, see
    `harness/predict/activation.py` and `sampler_peak.py`); only the sort's bytes per logit are fitted, on
    the logs that print their activation and sorted (V0, or V1 before 0.17 whose native path is known from
    its log, its facts or its release). Non-torch and graph memory are read from the profile where a release
    prints them (with or without a config: the figure needs none); where a log gives only the GPU total, the
    weights and the KV memory, the remainder less the predicted activation is what the profile held outside
    torch, counted only where the sampler behind that activation is known.
    """
    # LoRA's terms hold what is not modelled; a development build's accounting is no release's
    cases = [case for case in cases if not case.facts.enable_lora and not case.facts.development_build]
    rows, targets, graphs, used = [], [], [], set()
    non_torch: list[tuple[FieldCase, float]] = []  # GiB outside torch, as logged or implied
    implied: list[tuple[FieldCase, dict[str, Any], int]] = []
    for case in cases:  # a logged non-torch or graph figure needs no config; what is implied or fitted does
        config = configs.get(case.facts.config or "")
        total = gpu_total(case)
        logged = logged_term_bytes(case.parsed())
        beside_context = _context_counted(case)  # its non-torch figure holds the measured CUDA context: not fitted
        if "non_torch" in logged and not beside_context:
            non_torch.append((case, logged["non_torch"] / GiB))
            used.add(case.id)
        elif total is not None and config is not None and known_sampler(case) and not beside_context:
            implied.append((case, config, total[0]))  # nothing in the remainder may rest on an assumed sampler
        if "cuda_graphs" in logged and not case.parsed().enforce_eager:  # an eager start's zero is no estimate
            graphs.append(logged["cuda_graphs"] / GiB)
            used.add(case.id)
        if config is None or "activation_peak" not in logged or total is None or not known_sampler(case):
            continue
        batch = profiling_run(case, config, total[0])
        if (path := _path(case, config, batch)).bytes_per_logit is None:  # the sort, whose figure is fitted
            peak, beside, count = _activation_parts(case, config, batch)
            rows.append((peak, beside + count * path.sort_extra_bytes_per_logit, count))
            targets.append(logged["activation_peak"])
            used.add(case.id)
    if not rows:
        raise HarnessError("no fit case states its activation peak: the sampler's peak cannot be fitted")
    forward, base, logits = (np.array(column, dtype=float) for column in zip(*rows, strict=True))
    errors = [np.sum((np.maximum(forward, base + b * logits) - targets) ** 2) for b in SAMPLER_GRID]
    per_logit = round(float(SAMPLER_GRID[int(np.argmin(errors))]), 2)
    for case, config, total_bytes in implied:
        rest = implied_overhead_bytes(case, total_bytes)
        activation = _activation(case, config, total_bytes, per_logit)
        if rest is not None and activation is not None:
            non_torch.append((case, (rest - activation) / GiB))
            used.add(case.id)
    fit = _fit_non_torch(non_torch)
    constants = MemoryConstants(
        sampler_bytes_per_logit=per_logit, non_torch_gib=fit.base_gib, hopper_non_torch_gib=fit.hopper_gib,
        host_memory_non_torch_gib=fit.host_memory_gib, nccl_gib=fit.nccl_gib,
        cuda_graph_gib=round(statistics.median(graphs), 4) if graphs else 0.0,
        fitted_on=sorted(used),
    )
    share, measured_on = kv_error_share(cases, configs, constants)
    return constants.model_copy(update={"kv_error_share": share, "fitted_on": sorted(used | set(measured_on))})


def _fit_non_torch(samples: list[tuple[FieldCase, float]]) -> NonTorchFit:
    """The base (apart for Hopper parts and for GPUs sharing their host's memory) and NCCL GiB: medians of the
    figures that hold only the base, then of what the communicators add where the release counts them (less the
    custom all-reduce's and the NVLS buffers, which the code and NCCL's log size); none of them holds the CUDA
    context."""
    def communicators(case: FieldCase) -> bool:
        return communicators_counted(Version(case.facts.vllm_version), is_v0(case),
                                     case.facts.tensor_parallel_size, case.facts.pipeline_parallel_size)

    samples = [(case, gib - nvls_bytes(case.facts.gpu, case.facts.tensor_parallel_size) / GiB)
               for case, gib in samples]  # NCCL prints its NVLS size; nothing of it is fitted
    plain: dict[str, list[float]] = {}
    for case, gib in samples:
        if not communicators(case):
            plain.setdefault(base_class(case.facts.gpu), []).append(gib)
    bases = {gpu_class: _median(plain.get(gpu_class, [])) for gpu_class in ("other", "hopper", "host memory")}
    nccl_gib = max(0.0, _median([gib - bases[base_class(case.facts.gpu)]
                                 - communicator_bytes(0.0, case.facts.tensor_parallel_size) / GiB
                                 for case, gib in samples if communicators(case)]))
    return NonTorchFit(base_gib=bases["other"], hopper_gib=bases["hopper"], host_memory_gib=bases["host memory"],
                       nccl_gib=nccl_gib)


def _median(figures: list[float]) -> float:
    return round(statistics.median(figures), 3) if figures else 0.0


def _context_counted(case: FieldCase) -> bool:
    return Version(case.facts.vllm_version) < CONTEXT_COUNTED_BEFORE["V0" if is_v0(case) else "V1"]


def _activation_parts(case: FieldCase, config: dict[str, Any], batch: ProfileBatch) -> tuple[int, int, int]:
    """(the peak apart from the sampler, the sampler's bytes besides its logits with what the batch's inputs hold
    beside them, sampler logits) of the case's profiling run, from the parts the waterfall prices it by."""
    version = Version(case.facts.vllm_version)
    parts = activation_parts(config, model_size(config), version, is_v0(case), engine_launch(case), batch)
    return parts.unsampled_bytes(), parts.held_bytes + parts.hidden_states_bytes, parts.logits


def _path(case: FieldCase, config: dict[str, Any], batch: ProfileBatch) -> SamplerPath:
    version = Version(case.facts.vllm_version)
    return sampler_path(version, case.facts.engine, sampler_name(case), batch.rows,
                        second_runner(config, model_size(config), version, engine_launch(case)))


def _activation(case: FieldCase, config: dict[str, Any], total_bytes: int, per_logit: float) -> int | None:
    """The waterfall's activation term at this sampler figure (a V1 vision model's encoder profile included);
    None where the waterfall does not price the case's checkpoint."""
    constants = MemoryConstants(sampler_bytes_per_logit=per_logit, non_torch_gib=0.0, cuda_graph_gib=0.0, fitted_on=[])
    try:
        waterfall = plan_waterfall(config, constants, engine_launch(case), total_bytes=total_bytes,
                                   total_source="the case's GPU", gpu_name=case.facts.gpu)
    except HarnessError:
        return None
    return next(term.bytes for term in waterfall.terms if term.name == "activation_peak")


def implied_overhead_bytes(case: FieldCase, total_bytes: int) -> int | None:
    """total × utilisation − logged weights − logged KV: activation and non-torch together, on one rank.

    Only where nothing else is subtracted before the cache (graphs are, from 0.21) and the log
    states both figures for a single stage.
    """
    facts, log = case.facts, case.parsed()
    if Version(facts.vllm_version) >= GRAPHS_RESERVED_SINCE or facts.pipeline_parallel_size > 1:
        return None
    kv = _stage_memory(case, log.available_kv_cache_bytes_by_rank, log.available_kv_cache_bytes)
    if kv is None or not log.model_weights_bytes:
        return None
    utilization = gpu_memory_utilization(facts.gpu_memory_utilization, Version(facts.vllm_version))
    return int(total_bytes * utilization) - log.model_weights_bytes - kv[0]
