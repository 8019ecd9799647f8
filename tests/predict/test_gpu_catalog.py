"""The GPU catalogue: the names the field corpus uses resolve, and each figure agrees with what printed it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from harness.errors import HarnessError
from harness.observe.server_logs import parse_startup_log
from harness.predict.gpu_catalog import GPUS, gpu_memory, known_gpu, on_nvswitch
from harness.units import GiB

CASES = Path(__file__).parents[1] / "fixtures" / "field" / "cases"
# Named by a field case without a total the catalogue can give: "A100" is a case whose comment gives no memory
# size, so it could be either A100; the one RX 9070 XT figure found was printed on Windows, and the Linux case
# logs more KV memory than 0.75 of it leaves after the weights, so it is not taken.
UNSOURCED = {"A100", "RX-9070-XT"}


def test_every_gpu_a_field_case_names_resolves_unless_no_figure_was_found() -> None:
    named = {match.group(1) for path in CASES.glob("*.yaml")
             for match in re.finditer(r"^\s+gpu: (\S+)", path.read_text(), re.MULTILINE)}
    assert {"GB10", "A10G", "H100-96GB", "A100-40GB", "L4", "GH200", "MI300X", "RTX-PRO-6000-Blackwell"} <= named
    for name in named - UNSOURCED:
        assert gpu_memory(name).name == name
    for name in UNSOURCED & named:
        with pytest.raises(HarnessError, match=f"GPU '{name}' has no sourced memory figure"):
            gpu_memory(name)


@pytest.mark.parametrize(("asked", "total_gib"), [("gb10", 121.69), ("A10g", 22.49), ("h100-96gb", 94.50),
                                                  ("a100-40GB", 39.38), ("l4", 22.03), ("L40", 44.40),
                                                  ("gh200", 94.88), ("mi300x", 191.98),
                                                  ("rtx-pro-6000-blackwell", 94.97)])
def test_a_name_is_matched_without_regard_to_case(asked, total_gib) -> None:
    assert gpu_memory(asked).total_gib == total_gib


@pytest.mark.parametrize(("asked", "name"), [("RTX 4090", "RTX-4090"), ("rtx4090", "RTX-4090"),
                                             ("H100 80GB", "H100-80GB"), ("a100_40gb", "A100-40GB"),
                                             ("DGX Spark", "GB10"), ("dgx-spark", "GB10")])
def test_a_name_is_matched_as_people_write_it(asked, name) -> None:
    assert gpu_memory(asked).name == name


@pytest.mark.parametrize(("asked", "meant"), [("H100", "H100-80GB or H100-96GB or H100-NVL"),
                                              ("a100", "A100-80GB or A100-40GB"),
                                              ("NVIDIA GeForce RTX 3060", "RTX-3060-12GB")])
def test_a_name_that_begins_several_entries_is_refused_with_them(asked, meant) -> None:
    refused = rf"GPU '{asked}' has no sourced memory figure here \(did you mean {meant}\?"
    with pytest.raises(HarnessError, match=refused):
        gpu_memory(asked)


def test_the_gb10_total_is_the_one_vllm_multiplies() -> None:
    # The same start-up check prints "Desired GPU memory utilization is (0.87, 105.87 GiB)":
    # 0.87 × 121.69 = 105.87 GiB, so 121.69 GiB is the total vLLM scales, the whole unified memory.
    gb10 = gpu_memory("GB10")
    assert round(0.87 * gb10.total_gib, 2) == 105.87 and "DGX Spark" in gb10.source


def test_the_a100_40gb_total_agrees_with_cudas_byte_count() -> None:
    # deviceQuery's 42,298,834,944 bytes / 1,073,741,824 = 39.394 GiB; vLLM printed 39.38 GiB for the card,
    # 0.014 GiB (15 MiB) less, the driver's share at start-up.
    a100 = gpu_memory("A100-40GB")
    assert "42,298,834,944 bytes" in a100.source
    assert 0 < 42_298_834_944 / 2**30 - a100.total_gib < 0.02


def test_each_total_names_one_entry_so_a_log_stating_only_its_total_finds_it() -> None:
    totals = [gpu.total_gib for gpu in GPUS.values()]
    assert len(set(totals)) == len(totals)
    assert known_gpu(None, int(44.53 * GiB)) == gpu_memory("L20")


def test_catalogue_names_are_unique_without_regard_to_case() -> None:
    assert len({name.lower() for name in GPUS}) == len(GPUS)


@pytest.mark.parametrize(("name", "switched"), [
    ("H100-80GB", True), ("NVIDIA H100 80GB HBM3", True), ("H200", True), ("NVIDIA B200", True), ("H20", True),
    ("NVIDIA H100 PCIe", False), ("NVIDIA H100 NVL", False), ("H100-96GB", False), ("NVIDIA H200 NVL", False),
    ("GH200", False), ("A100-80GB", False), ("L40S", False), (None, False),
])
def test_only_hopper_and_later_sxm_parts_sit_on_an_nvswitch(name: str | None, switched: bool) -> None:
    assert on_nvswitch(name) is switched


def test_a_start_s_gpu_is_known_by_its_name_else_by_a_total_one_entry_alone_prints() -> None:
    assert known_gpu("rtx 3090") == gpu_memory("RTX-3090")
    assert known_gpu(None, int(44.42 * GiB)) == gpu_memory("L40S")  # the L40 prints 44.40
    assert known_gpu("A100", int(39.38 * GiB)) == gpu_memory("A100-40GB")  # a name no entry has leaves the total
    assert known_gpu(None, int(47.5 * GiB)) is None and known_gpu(None) is None


def test_resident_threads_are_multiprocessors_times_the_capabilitys_threads() -> None:
    # An H200: 132 multiprocessors × 2,048 threads (capability 9.0) = 270,336; an RTX 3090: 82 × 1,536 (8.6) =
    # 125,952; a T4: 40 × 1,024 (7.5) = 40,960. Every CUDA entry has both figures; the MI300X is not CUDA's.
    assert gpu_memory("H200").resident_threads == 270_336
    assert gpu_memory("RTX-3090").resident_threads == 125_952
    assert gpu_memory("T4").resident_threads == 40_960
    assert [name for name, gpu in GPUS.items() if gpu.resident_threads is None] == ["MI300X"]


@pytest.mark.parametrize(("device", "name"), [("NVIDIA H100 80GB HBM3", "H100-80GB"),
                                              ("NVIDIA A100-SXM4-40GB", "A100-40GB"),
                                              ("NVIDIA A100 80GB PCIe", "A100-80GB"), ("Tesla T4", "T4"),
                                              ("NVIDIA GeForce RTX 4090 D", "RTX-4090-D"),
                                              ("NVIDIA RTX PRO 6000 Blackwell Server Edition",
                                               "RTX-PRO-6000-Blackwell"),
                                              ("NVIDIA H100 NVL", "H100-NVL"), ("NVIDIA H20", "H20"),
                                              ("NVIDIA A800-SXM4-80GB", "A800-80GB"), ("NVIDIA L20", "L20"),
                                              ("NVIDIA A30", "A30"),
                                              ("NVIDIA RTX A5000", "RTX-A5000"), ("NVIDIA RTX A4000", "RTX-A4000"),
                                              ("Tesla V100-SXM2-16GB", "V100-16GB"),
                                              ("NVIDIA GeForce RTX 2080 Ti", "RTX-2080-Ti")])
def test_a_device_name_as_cuda_prints_it_finds_its_entry(device, name) -> None:
    assert gpu_memory(device).name == name


def test_a_device_name_the_catalogue_cannot_tell_apart_is_refused_with_its_entries() -> None:
    # "NVIDIA H100 PCIe" names no memory size: every H100 entry begins with what is left, "h100".
    with pytest.raises(HarnessError, match=r"did you mean H100-80GB or H100-96GB or H100-NVL\?"):
        gpu_memory("NVIDIA H100 PCIe")


def test_every_gpu_a_field_log_names_is_the_one_its_case_states() -> None:
    # The log's own device name (a fused-MoE config, a dtype warning, nvidia-smi) checks each case's stated GPU.
    checked = 0
    for path in CASES.glob("*.yaml"):
        case = yaml.safe_load(path.read_text())
        named = parse_startup_log(case["log"], case.get("start")).gpu_name
        if named is not None:
            assert gpu_memory(named).name == case["facts"]["gpu"], path.name
            checked += 1
    assert checked >= 10
