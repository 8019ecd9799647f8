"""What a field-corpus case's start ran with, as the calculator reads it: the GPU's total, the engine, the
sampler, the launch flags and the profiling run they give."""

from __future__ import annotations

from typing import Any

from packaging.version import Version

from harness.calibrate.field_corpus import FieldCase
from harness.calibrate.field_results import SamplerFact
from harness.errors import HarnessError
from harness.predict.encoder_launch import EncoderLaunch
from harness.predict.engine_launch import EngineLaunch
from harness.predict.gpu_catalog import gpu_memory
from harness.predict.kv_bytes import resolve_kv_dtype
from harness.predict.memory_model import DEFAULT_V1_SAMPLER
from harness.predict.parameter_count import model_size
from harness.predict.profile_batch import ProfileBatch, profile_batch
from harness.predict.releases import runs_v0
from harness.predict.sampler_peak import release_default_sampler, sampler_of_start
from harness.units import GiB


def gpu_total(case: FieldCase) -> tuple[int, str] | None:
    """The GPU's total memory and where it comes from: as the log states it, else the catalogue's for its name."""
    facts = case.facts
    if facts.gpu_total_gib is not None:
        return int(facts.gpu_total_gib * GiB), f"{facts.gpu_total_gib} GiB as the log states it"
    if facts.gpu is None:
        return None
    try:
        gpu = gpu_memory(facts.gpu)
    except HarnessError:
        return None
    return int(gpu.total_gib * GiB), gpu.source


def is_v0(case: FieldCase) -> bool:
    """Whether the start ran the V0 engine: as the case states it, else its release's default."""
    version = Version(case.facts.vllm_version)
    return runs_v0(version, case.facts.engine)


def sampler_fact(case: FieldCase) -> SamplerFact:
    """The sampler as the log names it, else as the facts state it, else as the log implies it (FlashInfer loaded for
    attention, in a release that then samples with it), else the release's default, else the assumed one."""
    if is_v0(case):
        return SamplerFact(name="pytorch", source="V0")
    logged, stated = case.logged_sampler(), case.facts.sampler
    if logged and stated and logged[0] != stated:
        raise HarnessError(f"case {case.id}: the log says {logged[0]} sampled, the facts say {stated}")
    if logged:
        return SamplerFact(name=logged[0], source="log", evidence=logged[1])
    if stated:
        return SamplerFact(name=stated, source="stated")
    version, loaded = Version(case.facts.vllm_version), case.parsed().flashinfer_loaded_line
    if loaded is not None and sampler_of_start(version, None, flashinfer_loaded=True):
        return SamplerFact(name="flashinfer", source="log", evidence=loaded)
    default = release_default_sampler(version)
    if default:
        return SamplerFact(name=default, source="default")
    return SamplerFact(name=DEFAULT_V1_SAMPLER, source="assumed")


def sampler_name(case: FieldCase) -> str:
    return sampler_fact(case).name


def known_sampler(case: FieldCase) -> str | None:
    """The sampler when the log or the facts establish it (V0 always sorts), None when it is assumed."""
    fact = sampler_fact(case)
    return None if fact.source == "assumed" else fact.name


def engine_launch(case: FieldCase) -> EngineLaunch:
    """The flags the case's start ran with, as the waterfall reads them."""
    facts, log = case.facts, case.parsed()
    return EngineLaunch(
        engine_version=facts.vllm_version, engine_generation=facts.engine, max_model_len=facts.max_model_len,
        gpu_memory_utilization=facts.gpu_memory_utilization, dtype_bytes=resolve_kv_dtype("auto", facts.dtype)[1],
        quantization=facts.quantization, tensor_parallel_size=facts.tensor_parallel_size,
        pipeline_parallel_size=facts.pipeline_parallel_size,
        max_num_batched_tokens=facts.max_num_batched_tokens, max_num_seqs=facts.max_num_seqs,
        sampler=known_sampler(case), speculative=facts.speculative,
        encoder=_encoder_launch(case), enforce_eager=bool(log.enforce_eager))


def _encoder_launch(case: FieldCase) -> EncoderLaunch:
    """The encoder's profile flags: the log's arguments, the limits the thread's command states over them."""
    arguments = dict(case.parsed().non_default_args or {})
    if case.facts.limit_mm_per_prompt is not None:
        arguments["limit_mm_per_prompt"] = case.facts.limit_mm_per_prompt
    return EncoderLaunch.from_arguments(arguments)


def profiling_run(case: FieldCase, config: dict[str, Any], total_bytes: int) -> ProfileBatch:
    """The case's profiling run, as the waterfall takes it."""
    size, version = model_size(config), Version(case.facts.vllm_version)
    return profile_batch(config, size, version, is_v0(case), engine_launch(case), total_bytes, case.facts.gpu)
