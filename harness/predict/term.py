"""One line of the before-launch memory waterfall."""

from __future__ import annotations

from pydantic import BaseModel


class Term(BaseModel):
    """What one term costs each GPU, whether vLLM subtracts it before sizing the cache, and where it comes from."""

    name: str
    bytes: int
    subtracted: bool
    source: str
