"""Request records with chosen latencies, as the client writes them: the search's tests script their servers."""

from __future__ import annotations

from harness.measure.client import ErrorClass, RequestRecord


def request(index: int, ttft_ms: float, *, tokens: int = 11, tpot_ms: float = 10.0, warmup: bool = False,
            error: ErrorClass | None = None) -> RequestRecord:
    """Scheduled at 0 s, its first token after `ttft_ms`, then one token every `tpot_ms`."""
    first = ttft_ms / 1000
    times = [first + i * tpot_ms / 1000 for i in range(tokens)]
    return RequestRecord(index=index, prompt_id=f"p{index}", warmup=warmup, max_tokens=tokens, scheduled_s=0.0,
                         dispatch_s=0.0, sent_s=0.0, first_token_s=None if error else first, end_s=times[-1],
                         chunk_times_s=[] if error else times, chunk_tokens=[] if error else [1] * tokens,
                         error_class=error)
