"""An engine started from the project's polyaxonfiles answers only those holding its API key.

vLLM reads the key from `VLLM_API_KEY` (as it would `--api-key`), so the key is never on a command line
or in the start-up log. On a cluster the container's shell line refuses to start without it; a local start
applies the same rule here, before anything starts.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from harness.errors import HarnessError
from harness.server_auth import API_KEY_ENV


def refuse_unauthenticated(
    inputs: Mapping[str, Any], files: Sequence[Path], environ: Mapping[str, str] = os.environ
) -> None:
    """A file that starts an engine declares `allow_unauthenticated`; without a key it must be set."""
    if "allow_unauthenticated" not in inputs or inputs["allow_unauthenticated"] or environ.get(API_KEY_ENV):
        return
    raise HarnessError(f"{files[0]}: {API_KEY_ENV} is not set, so the engine would answer anyone; set it "
                       "(e.g. export VLLM_API_KEY=$(openssl rand -hex 16)) or pass -P allow_unauthenticated=true")
