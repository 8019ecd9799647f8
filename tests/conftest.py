"""Shared fixtures: the generated tiny model, and the real engine started from the project's polyaxonfiles."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from harness.tiny_model import ensure_tiny_model

os.environ.setdefault("POLYAXON_DISABLE_ERRORS_REPORTING", "true")


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    """The seed-0 tiny Qwen3 model, generated once into the harness cache and reused."""
    return ensure_tiny_model(seed=0)
