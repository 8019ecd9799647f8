"""vLLM's own benchmark client, driven the way the benchmarks compare it with the harness's.

Runs under the engine's interpreter (its virtual environment holds vllm), never the harness's:
`ENGINE_PYTHON benchmarks/vllm_drivers.py NAME SPEC [RESULT]`; the harness side never imports it.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from transformers import AutoTokenizer
from vllm.benchmarks.datasets import SampleRequest
from vllm.benchmarks.serve import TaskType, benchmark


def _requests(spec: dict[str, Any]) -> list[SampleRequest]:
    return [SampleRequest(prompt=ids, prompt_len=len(ids), expected_output_len=spec["output_tokens"])
            for ids in spec["prompts"]]


def agreement(spec_path: str, result_path: str) -> None:
    """benchmarks/agreement.py's vLLM side: its figures, and the served requests' gaps and token counts."""
    spec = json.loads(Path(spec_path).read_text())
    result = asyncio.run(benchmark(
        task_type=TaskType.GENERATION, endpoint_type="openai", api_url=spec["base_url"] + "/v1/completions",
        base_url=spec["base_url"], model_id=spec["model"], model_name=spec["model"],
        tokenizer=AutoTokenizer.from_pretrained(spec["tokenizer"]),
        input_requests=_requests(spec), logprobs=None, request_rate=float("inf"), burstiness=1.0,
        disable_tqdm=True, num_warmups=spec["warmup"], profile=False,
        selected_percentile_metrics=["ttft", "tpot", "itl", "e2el"],
        selected_percentiles=[50.0, 99.0], ignore_eos=True, goodput_config_dict={},
        max_concurrency=spec["concurrency"], lora_modules=None,
        extra_headers={"Authorization": "Bearer " + os.environ["VLLM_API_KEY"]}
        if os.environ.get("VLLM_API_KEY") else None,
        extra_body={"temperature": 0.0, "stream_options": spec["stream_options"]}, ready_check_timeout_sec=0,
    ))
    figures = {key: value for key, value in result.items() if isinstance(value, (int, float))}
    ok = [not error for error in result["errors"]]
    Path(result_path).write_text(json.dumps({
        "figures": figures, "itls_s": [gaps for gaps, good in zip(result["itls"], ok, strict=False) if good],
        "output_tokens": [n for n, good in zip(result["output_lens"], ok, strict=False) if good]}))


def client_overhead(spec_path: str) -> None:
    """benchmarks/client_overhead.py's vLLM side: its CPU and wall time, and its errors against the emulator."""
    spec = json.loads(Path(spec_path).read_text())
    requests = _requests(spec)
    cpu, wall = time.process_time(), time.perf_counter()
    result = asyncio.run(benchmark(
        task_type=TaskType.GENERATION, endpoint_type="openai", api_url=spec["base_url"] + "/v1/completions",
        base_url=spec["base_url"], model_id="emulated", model_name="emulated", tokenizer=None,
        input_requests=requests, logprobs=None, request_rate=float("inf"), burstiness=1.0, disable_tqdm=True,
        num_warmups=0, profile=False, selected_percentile_metrics=["ttft", "itl"], selected_percentiles=[50.0, 99.0],
        ignore_eos=True, goodput_config_dict={}, max_concurrency=spec["streams"], lora_modules=None,
        extra_headers=None, extra_body=None, ready_check_timeout_sec=0,
    ))
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    served = [(ttft, itl) for ttft, itl in zip(result["ttfts"], result["itls"], strict=False) if ttft]
    first_wave = sorted(
        (start, ttft) for start, ttft in zip(result["start_times"], result["ttfts"], strict=False) if ttft
    )[:spec["streams"]]
    print(json.dumps({
        "cpu_s": cpu, "wall_s": wall, "chunks": sum(len(itl) + 1 for _, itl in served),
        # on the machine's monotonic clock, per prompt in input order (None: failed)
        "first_token_read_s": [
            start + ttft if ttft else None
            for start, ttft in zip(result["start_times"], result["ttfts"], strict=False)
        ],
        "ttft_error_ms": [ttft * 1000 - spec["ttft_ms"] for ttft, _ in served],
        "first_wave_ttft_error_ms": [ttft * 1000 - spec["ttft_ms"] for _, ttft in first_wave],
        "itl_error_ms": [gap * 1000 - spec["itl_ms"] for _, itl in served for gap in itl],
    }))


DRIVERS: dict[str, Callable[..., None]] = {"agreement": agreement, "client-overhead": client_overhead}

if __name__ == "__main__":
    DRIVERS[sys.argv[1]](*sys.argv[2:])
