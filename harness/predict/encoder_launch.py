"""What a launch says of a vision-language model's encoder: whether vLLM builds the tower and profiles it, and
with how many images and videos a prompt."""

from __future__ import annotations

from typing import Any

from packaging.version import Version
from pydantic import BaseModel

TOWER_LEFT_OUT_SINCE = Version("0.10.2")  # the oldest release read that skips a tower with no modality to serve


class EncoderLaunch(BaseModel, frozen=True):
    """What the launch says of the encoder's profile: skipped (`--skip-mm-profiling`, `--language-model-only`),
    and each modality's items per prompt (`--limit-mm-per-prompt`; None is the release's default, 0 leaves the
    modality out of the profile)."""

    skipped: bool = False  # --skip-mm-profiling
    language_model_only: bool = False  # --language-model-only: every modality's limit is 0, nothing is profiled
    image_limit: int | None = None
    video_limit: int | None = None

    @property
    def profiles_encoder(self) -> bool:
        return not (self.skipped or self.language_model_only)

    def builds_tower(self, engine_version: Version) -> bool:
        """Whether vLLM builds the vision tower: from 0.10.2 (read in 0.10.2, 0.11.0, 0.12.0, 0.15.1, 0.19.1 and
        0.25.1) a Qwen VL model leaves it out where image and video both have a limit of 0 (qwen2_5_vl.py
        `self.visual = None`, later interfaces.py `_mark_tower_model`), as --language-model-only sets them."""
        if engine_version < TOWER_LEFT_OUT_SINCE:
            return True
        return not (self.language_model_only or (self.image_limit == 0 and self.video_limit == 0))

    @classmethod
    def from_arguments(cls, args: dict[str, Any]) -> EncoderLaunch:
        """From a log's non-default arguments, as vLLM prints them (`{'limit_mm_per_prompt': {'image': 0}}`, a
        modality's limit also as `{'count': 0, ...}`)."""
        limits = args.get("limit_mm_per_prompt")
        limits = limits if isinstance(limits, dict) else {}
        return cls(skipped=args.get("skip_mm_profiling") is True,
                   language_model_only=args.get("language_model_only") is True,
                   image_limit=_count(limits.get("image")), video_limit=_count(limits.get("video")))


def _count(limit: Any) -> int | None:
    if isinstance(limit, dict):
        limit = limit.get("count")
    return limit if isinstance(limit, int) and not isinstance(limit, bool) and limit >= 0 else None
