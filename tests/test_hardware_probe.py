"""`truthput hardware probe`: this machine measured as a CPU host, written as a hardware profile that
every command reads like a catalog GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from truthput.errors import InputError
from truthput.hardware.gpus import get_gpu
from truthput.hardware.models import get_model

TRUTHPUT = [sys.executable, "-m", "truthput"]


@pytest.fixture(scope="module")
def host_profile(tmp_path_factory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("probe") / "host.toml"
    proc = subprocess.run([*TRUTHPUT, "hardware", "probe", "--out", str(out), "--no-torch"], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return out, proc.stdout


def _meminfo_bytes() -> float:
    with open("/proc/meminfo") as fh:
        return next(float(line.split()[1]) * 1024 for line in fh if line.startswith("MemTotal:"))


def test_probe_measures_this_host_and_says_how(host_profile):
    path, stdout = host_profile
    host = get_gpu(str(path))
    assert host.kind == "cpu" and host.interconnect.kind == "none"
    assert host.cores == len(os.sched_getaffinity(0))
    assert host.memory_bytes == pytest.approx(_meminfo_bytes(), rel=1e-6)
    # physical sanity, not a benchmark: any host streams 0.5-2000 GB/s and multiplies 0.5 GFLOP/s+
    assert 5e8 < host.mem_bw_Bps < 2e12 and host.bf16_flops > 5e8
    # the rows a decode step adds, measured at decode shapes (a step's rows on a CPU are not free)
    assert host.decode_flops is not None and host.decode_flops > 5e8
    assert "[measured" in stdout and "triad" in stdout and "decode rows" in stdout
    assert "float32 numpy" in stdout  # --no-torch: the matmul says it is not bf16
    assert any("measured by `truthput hardware probe`" in s for s in host.sources)


def test_the_roofline_reads_a_probed_host_like_a_gpu(host_profile, tmp_path):
    path, _ = host_profile
    host = get_gpu(str(path))
    proc = subprocess.run([*TRUTHPUT, "roofline", "--gpu", str(path), "--model", "llama-3.1-8b", "--json"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    weights = data[0]["roofline"]["bounds"]["weights"]["value"]
    assert weights == pytest.approx(get_model("llama-3.1-8b").weight_bytes / host.mem_bw_Bps, rel=1e-9)
    # one host has no tensor-parallel link: TP 2 is refused in one line, not divided by zero
    proc = subprocess.run([*TRUTHPUT, "roofline", "--gpu", str(path), "--model", "llama-3.1-8b", "--tp", "2"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "no tensor-parallel link" in (proc.stderr + proc.stdout)
    assert "Traceback" not in proc.stderr


def test_a_file_that_is_not_a_profile_is_one_clear_error(tmp_path):
    bad = tmp_path / "host.toml"
    bad.write_text("[[gpu]]\nname = 'x'\n")
    with pytest.raises(InputError) as exc:
        get_gpu(str(bad))
    assert str(bad) in str(exc.value) and "not a hardware profile" in str(exc.value)


def test_the_catalog_has_a_cpu_host():
    host = get_gpu("Xeon Platinum 8480+ (1 socket)")
    assert host.kind == "cpu" and host.cores == 56
    assert host.mem_bw_Bps == pytest.approx(8 * 4800e6 * 8)  # 8 channels of DDR5-4800
