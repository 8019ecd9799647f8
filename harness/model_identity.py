"""What a model generated here is: its generator, its seed and a hash of its files.

A hub model is named by its repository and a pinned revision. A directory the harness generated (the tiny
model) has no revision: the engine ignores `--revision` for a directory, so a revision beside it would
name another model. The generator writes the identity into the directory instead, and the run record
takes it from there, checked against the files as they are when the run starts.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pydantic
from pydantic import BaseModel

from harness.errors import HarnessError, describe_validation_error

IDENTITY_FILE = "harness-model.json"


class ModelIdentity(BaseModel):
    """harness-model.json: who generated the directory's files, from which seed, and their hash."""

    generator: str  # the generating code and its version: same generator and seed, same bytes
    seed: int
    files_sha256: str  # see files_sha256

    def limits(self) -> dict[str, str | int]:
        """As engine limits, which a comparison holds fixed as it would a hub revision."""
        return {"model_generator": self.generator, "model_seed": self.seed, "model_files_sha256": self.files_sha256}


def files_sha256(directory: Path) -> str:
    """sha256 over the directory's files in path order, each as its path, its size and its bytes (so no two
    layouts hash alike); the identity file itself is left out."""
    digest = hashlib.sha256()
    for path in sorted(p for p in directory.rglob("*") if p.is_file() and p.name != IDENTITY_FILE):
        content = path.read_bytes()
        digest.update(f"{path.relative_to(directory).as_posix()}\0{len(content)}\0".encode())
        digest.update(content)
    return digest.hexdigest()


def write_identity(directory: Path, *, generator: str, seed: int) -> ModelIdentity:
    """Write the identity of the files already in `directory`; the last file a generator writes."""
    identity = ModelIdentity(generator=generator, seed=seed, files_sha256=files_sha256(directory))
    (directory / IDENTITY_FILE).write_text(json.dumps(identity.model_dump(), indent=2, sort_keys=True) + "\n",
                                           encoding="utf-8")
    return identity


def read_identity(directory: Path) -> ModelIdentity | None:
    """The identity a generator wrote into `directory`, refused when the files no longer hash to it; None
    for a directory no generator of the harness wrote."""
    path = directory / IDENTITY_FILE
    if not path.is_file():
        return None
    try:
        identity = ModelIdentity.model_validate_json(path.read_text(encoding="utf-8"))
    except pydantic.ValidationError as error:
        raise HarnessError(describe_validation_error(error, path)) from None
    found = files_sha256(directory)
    if found != identity.files_sha256:
        raise HarnessError(f"{path}: the model's files hash to {found}, not the {identity.files_sha256} it records; "
                           "they changed after they were generated: generate the model again")
    return identity
