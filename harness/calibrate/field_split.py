"""Which field cases set the fitted constants and which score them: split by source, never within one.

One thread or one repository's log folder is usually one person's sweep (the same GPU, model and
release at a few settings); if its cases sat on both sides, the held-back half would be scored on
cases the fit has all but seen. So a case's source is the thread (`owner/repo/issues/N`,
`…/pull/N`, `…/discussions/N`) or, for a file in a repository, the repository (`owner/repo`); the
sources are sorted by that key and alternately assigned, the first to the fit half.
"""

from __future__ import annotations

import re

from harness.calibrate.field_corpus import FieldCase

THREAD = re.compile(r"^/([^/]+/[^/]+/(?:issues|pull|discussions)/\d+)")
REPOSITORY = re.compile(r"^/([^/]+/[^/]+)")


def source_key(case: FieldCase) -> str:
    """`vllm-project/vllm/issues/6124` for a thread, `owner/repo` for a file in a repository."""
    path = case.source.path or "/"
    match = THREAD.match(path) or REPOSITORY.match(path)
    return f"{case.source.host}/{match.group(1) if match else path.strip('/')}".lower()


def fit_case_ids(cases: list[FieldCase]) -> set[str]:
    """The cases of every other source (sorted by `source_key`, from the first): the fit half."""
    sources = sorted({source_key(case) for case in cases})
    fit_sources = set(sources[::2])
    return {case.id for case in cases if source_key(case) in fit_sources}

