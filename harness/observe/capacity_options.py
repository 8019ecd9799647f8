"""`harness capacity`'s own inputs checked before any source is read: what the user states about the engine,
and the options that name a source, a model or a GPU."""

from __future__ import annotations

import pydantic

from harness.errors import HarnessError, validate_options
from harness.observe.server_logs import StartupCapacity
from harness.predict.budget import MAX_TENSOR_PARALLEL_SIZE
from harness.predict.fit_answer import gpu_total
from harness.predict.kv_bytes import resolve_kv_dtype
from harness.predict.releases import engine_release
from harness.predict.weight_formats import check_quantization


class LogOverrides(pydantic.BaseModel):
    """Facts a log does not state (no engine config line), given by the user; they win over the log."""

    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)

    engine_version: str | None = pydantic.Field(None, min_length=1)
    tensor_parallel_size: int | None = pydantic.Field(None, ge=1, le=MAX_TENSOR_PARALLEL_SIZE)
    pipeline_parallel_size: int | None = pydantic.Field(None, ge=1, le=MAX_TENSOR_PARALLEL_SIZE)
    kv_cache_dtype: str | None = pydantic.Field(None, min_length=1)
    quantization: str | None = pydantic.Field(None, min_length=1)  # the weights' format, for the waterfall

    @classmethod
    def from_command_line(cls, **values: object) -> LogOverrides:
        """The stated facts, each checked as the calculator will read it; a refused one names its option."""
        stated = validate_options(cls, values)
        if stated.engine_version is not None:
            engine_release(stated.engine_version)
        if stated.kv_cache_dtype is not None:
            resolve_kv_dtype(stated.kv_cache_dtype, "auto")
        if stated.quantization is not None:
            check_quantization(stated.quantization)
        return stated

    def apply(self, log: StartupCapacity) -> StartupCapacity:
        stated = {k: v for k, v in self.model_dump().items() if v is not None}
        if self.tensor_parallel_size is not None:
            stated["tensor_parallel_size_from_ranks"] = False  # stated, no longer counted from the workers
        return log.model_copy(update=stated)


def check_given(*, project: str | None, polyaxon_run: str | None, gpu: str | None, **named: str | None) -> None:
    """Refuse an empty option (it would silently mean 'not given'), a project without its run, and a GPU
    the waterfall could not size, before any log is read."""
    for name, value in {"project": project, "polyaxon_run": polyaxon_run, "gpu": gpu, **named}.items():
        if value is not None and not value.strip():
            raise HarnessError(f"--{name.replace('_', '-')}: empty; give a value or leave the option out")
    if polyaxon_run and not project:
        raise HarnessError("--polyaxon-run needs --project OWNER/NAME")
    if project is not None and polyaxon_run is None:
        raise HarnessError(f"--project {project}: names the project of --polyaxon-run; give that run too")
    if gpu is not None:
        gpu_total(gpu)
