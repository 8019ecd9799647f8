"""Which field cases set the fitted constants and which score them: split by source, never within one.

One thread or one repository's log folder is usually one person's sweep (the same GPU, model and
release at a few settings); if its cases sat on both sides, the held-back half would be scored on
cases the fit has all but seen. So a case's source is the thread (`owner/repo/issues/N`,
`…/pull/N`, `…/discussions/N`) or, for a file in a repository, the repository (`owner/repo`). A source's
side is the parity of its key's SHA-256: a new source takes a side without moving any other, so the corpus can
grow without re-splitting the cases already scored (sorting the keys and alternating moves every
source after a new one: one added repository turned a 2.0% held-back median into 3.8%).
"""

from __future__ import annotations

import hashlib
import re

from harness.calibrate.field_corpus import FieldCase

THREAD = re.compile(r"^/([^/]+/[^/]+/(?:issues|pull|discussions)/\d+)")
REPOSITORY = re.compile(r"^/([^/]+/[^/]+)")


def source_key(case: FieldCase) -> str:
    """`vllm-project/vllm/issues/6124` for a thread, `owner/repo` for a file in a repository."""
    path = case.source.path or "/"
    match = THREAD.match(path) or REPOSITORY.match(path)
    return f"{case.source.host}/{match.group(1) if match else path.strip('/')}".lower()


def fits_constants(key: str) -> bool:
    """Whether the source with this key is in the fit half: its key's SHA-256 is even."""
    return hashlib.sha256(key.encode()).digest()[-1] % 2 == 0


def fit_case_ids(cases: list[FieldCase]) -> set[str]:
    """The cases of the sources in the fit half."""
    return {case.id for case in cases if fits_constants(source_key(case))}

