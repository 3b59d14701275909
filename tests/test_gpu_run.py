"""scripts/gpu-run.sh's parts that need no server: its steps each have a budget, the random GGUF it
serves is the shape its config.json tells the roofline, and a probed GPU profile reads back.

The script end to end (its CPU path: real llama-server, real A/B) runs in .ci/run."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "gpu-run.sh"
GGUF_PY = Path(os.environ.get("TRUTHPUT_CACHE", Path.home() / ".cache" / "truthput")) / "llama.cpp-b11434" / "src" / "gguf-py"


def test_the_script_parses_and_every_step_has_a_budget():
    assert subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True).returncode == 0
    steps = set(re.findall(r"^\s+step (\w+) ", SCRIPT.read_text(), re.M))
    budget = {}
    for line in (REPO / "scripts" / "gpu-run.budget").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, cpu, gpu = line.split()
            budget[name] = (float(cpu), float(gpu))
    assert steps == set(budget), (steps, budget)
    assert {"build", "model", "probe", "ab", "report"} <= steps
    # the GPU machine's calls: prepare (build + model) and measure each within a 10-minute call
    assert budget["build"][1] + budget["model"][1] <= 10
    assert sum(budget[s][1] for s in ("probe", "plan", "ab", "report")) <= 10


def test_an_unknown_argument_is_refused_in_one_line():
    out = subprocess.run(["bash", str(SCRIPT), "--gpus"], capture_output=True, text=True)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "--gpus" in out.stderr


@pytest.mark.skipif(not (GGUF_PY / "gguf").is_dir(), reason="llama.cpp's gguf-py not here: run scripts/install-llama-cpp.sh")
def test_the_random_model_is_the_shape_its_config_tells_the_roofline(tmp_path):
    out = tmp_path / "m" / "model.gguf"
    made = subprocess.run([sys.executable, str(REPO / "scripts" / "make_gguf.py"), "--random", "tiny", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr
    sys.path.insert(0, str(GGUF_PY))
    try:
        from gguf import GGUFReader
    finally:
        sys.path.remove(str(GGUF_PY))
    reader = GGUFReader(str(out))
    elements = sum(int(t.n_elements) for t in reader.tensors)
    layers = json.loads((out.parent / "config.json").read_text())["num_hidden_layers"]
    assert len(reader.tensors) == 3 + 9 * layers
    from truthput.hardware.models import get_model

    model = get_model(str(out.parent))
    # the roofline's weights are the file's: every element counted, 2 bytes each (f16 matrices; the
    # norms, stored f32, are 0.1% of it)
    assert model.params == elements
    assert model.weight_bytes == pytest.approx(out.stat().st_size, rel=0.01)
    assert f"{elements / 1e6:.1f}M parameters" in made.stdout


def test_a_probed_gpu_profile_reads_back_as_the_roofline_s_device(tmp_path):
    from truthput.hardware.gpus import get_gpu
    from truthput.hardware.probe import gpu_profile_toml

    facts = {"name": "NVIDIA H100 80GB HBM3", "memory_bytes": 85.0e9, "board_power_w": 700.0, "at": "now",
             "copy": {"bytes_per_s": 2.9e12, "method": "copy"}, "matmul": {"flops": 7.0e14, "method": "mm"}}
    path = tmp_path / "gpu.toml"
    path.write_text(gpu_profile_toml(facts))
    gpu = get_gpu(str(path))
    assert gpu.name == "NVIDIA H100 80GB HBM3 (probed)" and gpu.kind == "gpu"
    assert (gpu.mem_bw_Bps, gpu.bf16_flops, gpu.board_power_w) == (2.9e12, 7.0e14, 700.0)
    assert gpu.memory_bytes == pytest.approx(85.0e9, rel=1e-3)
    assert "measured by `truthput hardware probe --gpu`" in gpu.sources[0]
