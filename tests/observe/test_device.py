"""The device facts read from nvidia-smi, against what a real H200's nvidia-smi and CUDA printed.

The fake nvidia-smi put on PATH answers `--query-gpu` field by field from the fixture's captured row, as the
real one does, and refuses a field its driver does not know the way nvidia-smi does (exit 2, the whole query).
"""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path

import pytest

from harness.observe.device import MIB, device_facts, gpu_memory_used_bytes

H200 = json.loads((Path(__file__).parents[1] / "fixtures" / "nvidia_smi" / "h200-driver-580.json").read_text())

FAKE_NVIDIA_SMI = """#!{python}
import json, sys
fields, banner, gpus = json.loads({answers!r})
query = next((arg.split("=", 1)[1] for arg in sys.argv[1:] if arg.startswith("--query-gpu=")), None)
if query is None:
    print(banner)
    sys.exit(0)
asked = query.split(",")
unknown = [name for name in asked if name not in fields]
if unknown:
    print(f'Field "{{unknown[0]}}" is not a valid field to query.', file=sys.stderr)
    sys.exit(2)
for _ in range(gpus):
    print(", ".join(fields[name] for name in asked))
"""


def put_nvidia_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fields: dict[str, str], gpus: int = 1) -> None:
    script = tmp_path / "nvidia-smi"
    answers = json.dumps([fields, H200["banner"], gpus])
    script.write_text(FAKE_NVIDIA_SMI.format(python=sys.executable, answers=answers), encoding="utf-8")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", str(tmp_path))


def test_the_total_is_cudas_the_one_vllm_multiplies_by_the_utilisation(tmp_path, monkeypatch):
    put_nvidia_smi(tmp_path, monkeypatch, H200["query_fields"])
    facts = device_facts()
    # 143,771 MiB total − 616 MiB reserved = 143,155 MiB = 150,108,897,280 B; torch.cuda.mem_get_info() printed
    # 150,109,880,320 B = 143,155.94 MiB on that machine (the fixture's cuda_total_bytes, read by CUDA, not by
    # nvidia-smi): the same within nvidia-smi's whole MiB, where its total alone is 616 MiB over
    assert facts.gpu_memory_total_bytes == 143_155 * MIB
    assert 0 <= H200["cuda_total_bytes"] - facts.gpu_memory_total_bytes < MIB
    assert facts.gpu_memory_reserved_bytes == 616 * MIB
    assert (facts.gpu_name, facts.gpu_count, facts.gpu_driver_version) == ("NVIDIA H200", 1, "580.159.04")
    assert facts.cuda_version == "13.0"


def test_every_gpus_memory_is_summed(tmp_path, monkeypatch):
    put_nvidia_smi(tmp_path, monkeypatch, {**H200["query_fields"], "memory.used": "527"}, gpus=8)
    facts = device_facts()
    assert facts.gpu_count == 8
    assert facts.gpu_memory_total_bytes == 8 * 143_155 * MIB
    assert facts.gpu_memory_reserved_bytes == 8 * 616 * MIB
    assert gpu_memory_used_bytes() == 8 * 527 * MIB


def test_a_driver_without_the_reservation_field_leaves_nvidia_smis_total_and_says_it_is_unknown(tmp_path,
                                                                                                   monkeypatch):
    fields = {name: value for name, value in H200["query_fields"].items() if name != "memory.reserved"}
    put_nvidia_smi(tmp_path, monkeypatch, fields)
    facts = device_facts()
    assert facts.gpu_name == "NVIDIA H200"
    assert facts.gpu_memory_total_bytes == 143_771 * MIB
    assert facts.gpu_memory_reserved_bytes is None


def test_memory_nvidia_smi_does_not_report_is_left_unknown_not_raised(tmp_path, monkeypatch):
    # a GB10's unified memory: nvidia-smi prints [N/A] for the framebuffer figures
    put_nvidia_smi(tmp_path, monkeypatch, {**H200["query_fields"], "name": "NVIDIA GB10", "memory.total": "[N/A]",
                                           "memory.reserved": "[N/A]", "memory.used": "[N/A]"})
    facts = device_facts()
    assert facts.gpu_name == "NVIDIA GB10"
    assert facts.gpu_memory_total_bytes is None and facts.gpu_memory_reserved_bytes is None
    assert gpu_memory_used_bytes() is None


def test_no_nvidia_smi_means_the_cpu_is_reported(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    facts = device_facts()
    assert facts.gpu_name is None and facts.gpu_memory_total_bytes is None
    assert facts.cpu_model
