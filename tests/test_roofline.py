"""Roofline bounds against hand-computed examples, and placement of the seed's measurements."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from truthput.analyze.roofline import place, roofline
from truthput.errors import InputError
from truthput.hardware.gpus import GPU, Interconnect, get_gpu
from truthput.hardware.models import ModelProfile, get_model
from truthput.hardware.physics import GiB

TOY_GPU = GPU(name="toy", memory_bytes=10 * GiB, mem_bw_Bps=1e12, bf16_flops=100e12, fp8_flops=None,
              int8_ops=None, interconnect=Interconnect("pcie", 10e9, 20e-6, "test"), sources=("test",))
TOY_MODEL = ModelProfile(name="toy", params=1e9, active_params=1e9, layers=10, attn_layers=10,
                         hidden=1000, intermediate=4000, heads=8, kv_heads=2, head_dim=100, vocab=1000,
                         bits_per_weight=16, weight_bytes=2e9, mtp_params=0.0,
                         max_position_embeddings=4096, source="test")


def test_each_bound_by_hand() -> None:
    r = roofline(TOY_GPU, TOY_MODEL, tp=2, kv_dtype_bytes=2, context_len=1000, concurrency=4, spec_k=2)
    b = {k: v.seconds_per_step for k, v in r.bounds.items()}
    assert b["weights"] == pytest.approx(1e9 / 1e12)                       # 1 ms
    assert b["kv"] == pytest.approx(4 * 1000 * 4000 / 1e12)               # 16 us
    flops1 = 2 * 1e9 * 4 / 2 + 4 * 10 * 8 * 100 * 4 * 1000 / 2
    assert b["compute"] == pytest.approx(flops1 / 100e12)
    assert b["compute_verify"] == pytest.approx(3 * flops1 / 100e12)
    assert b["allreduce_bandwidth"] == pytest.approx(20 * 1 * 4 * 1000 * 2 / 10e9)
    assert b["allreduce_bandwidth_verify"] == pytest.approx(3 * b["allreduce_bandwidth"])
    assert b["allreduce_latency"] == pytest.approx(20 * 20e-6)
    assert r.weight_passes_per_s == pytest.approx(1000)
    c = r.ceilings
    assert c["weight_streaming"].aggregate_tokps == pytest.approx(4000)
    assert c["no_spec"].aggregate_tokps == pytest.approx(4 / (1e-3 + 16e-6))
    assert c["spec"].tokens_per_step_per_stream == 3  # hard bound k+1 without a measured acceptance
    assert c["spec"].aggregate_tokps == pytest.approx(12 / (1e-3 + 16e-6))
    assert c["spec"].per_stream_tokps == pytest.approx(3 / (1e-3 + 16e-6))
    assert c["spec_with_allreduce"].step_floor_s == pytest.approx(1.016e-3 + 400e-6 + b["allreduce_bandwidth_verify"])
    assert r.tightest == "spec"


def test_compute_bound_case_uses_compute_floor() -> None:
    r = roofline(TOY_GPU, TOY_MODEL, tp=1, kv_dtype_bytes=2, context_len=0, concurrency=2000)
    assert r.bounds["compute"].seconds_per_step == pytest.approx(2 * 1e9 * 2000 / 100e12)  # 40 ms
    assert r.ceilings["no_spec"].step_floor_s == pytest.approx(0.04)
    p = place(r, 0.9 * r.ceilings["no_spec"].aggregate_tokps, model_bits=16)
    assert p.binding == "compute" and p.sentence.startswith("compute binds: 90%")


def test_seed_case() -> None:
    gpu, model = get_gpu("RTX 3090"), get_model("qwen3.6-27b-5.5bit")
    r8 = roofline(gpu, model, 2, 1.0, 2048, 8, spec_k=1, acceptance_length=1.95)
    assert r8.weight_passes_per_s == pytest.approx(936e9 / 9.3e9)            # ~100.6 per second
    assert r8.ceilings["weight_streaming"].aggregate_tokps == pytest.approx(8 * 936e9 / 9.3e9)  # ~805
    assert 770 < r8.ceilings["no_spec"].aggregate_tokps < 805
    p8 = place(r8, 339.9, model_bits=model.bits_per_weight)
    ceiling = 8 * 1.95 / (9.3e9 / 936e9 + 8 * 2048 * 2 * 16 * 2 * 256 / 936e9)
    assert p8.ceiling_tokps == pytest.approx(ceiling)
    assert p8.fraction_of_ceiling == pytest.approx(339.9 / ceiling)          # ~22%
    assert p8.measured_step_s == pytest.approx(8 * 1.95 / 339.9)             # ~45.9 ms
    assert p8.unexplained_step_s * 1e3 == pytest.approx(8 * 1.95 / 339.9 * 1e3 - 1e3 * 8 * 1.95 / ceiling)
    assert p8.fraction_of_weight_streaming == pytest.approx(339.9 / (8 * 936e9 / 9.3e9))  # ~42%
    assert p8.binding is None
    assert p8.sentence.startswith("no modelled resource binds: 22% of the tightest ceiling")
    assert "36 ms/step unexplained" in p8.sentence and "TP all-reduce latency" in p8.sentence
    p1 = place(roofline(gpu, model, 2, 1.0, 2048, 1, spec_k=1), 66.9, acceptance_length=1.95)
    assert p1.measured_step_s == pytest.approx(1.95 / 66.9)                   # ~29 ms
    assert p1.bound_shares["weights"] == pytest.approx((9.3e9 / 936e9) / (1.95 / 66.9))


def test_placement_without_acceptance_uses_k_plus_one() -> None:
    r = roofline(TOY_GPU, TOY_MODEL, 1, 2, 0, 1, spec_k=3)
    p = place(r, 100.0)
    assert p.tokens_per_step_per_stream == 4 and p.measured_step_s == pytest.approx(0.04)
    assert "k+1" in p.tokens_per_step_basis


def test_to_dict_is_json_and_labelled() -> None:
    r = roofline(get_gpu("H100 SXM"), get_model("llama-3.1-8b"), 1, 2.0, 1024, 16)
    d = json.loads(json.dumps({"r": r.to_dict(), "p": place(r, 1000.0).to_dict()}))
    assert d["r"]["bounds"]["weights"]["source"] == "model"
    assert d["r"]["ceilings"]["no_spec"]["aggregate"]["source"] == "model"
    assert d["p"]["measured"]["source"] == "server_counter"
    assert d["p"]["unexplained_step"]["source"] == "model"


def test_bad_inputs() -> None:
    with pytest.raises(InputError):
        roofline(TOY_GPU, TOY_MODEL, 1, 2, 100, 0)
    with pytest.raises(InputError, match="acceptance length"):
        roofline(TOY_GPU, TOY_MODEL, 1, 2, 100, 1, spec_k=1, acceptance_length=2.5)


def test_cli_seed_case() -> None:
    from truthput.cli import app

    args = ["roofline", "--gpu", "RTX 3090", "--gpus", "2", "--model", "qwen3.6-27b-5.5bit", "--tp", "2",
            "--kv-dtype", "fp8", "--context", "2048", "--concurrency", "1,8", "--spec-tokens", "1",
            "--acceptance-length", "1.95", "--measured", "66.9,339.9"]
    out = CliRunner().invoke(app, args + ["--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    assert data[1]["roofline"]["ceilings"]["weight_streaming"]["aggregate"]["value"] == pytest.approx(805.16, abs=0.1)
    assert data[1]["placement"]["fraction_of_ceiling"]["value"] == pytest.approx(0.2227, abs=0.001)
    table = CliRunner().invoke(app, args)
    assert table.exit_code == 0 and "22%" in table.output and "805.2" in table.output
    bad = CliRunner().invoke(app, ["roofline", "--gpu", "GTX 480", "--model", "llama-3.1-8b"])
    assert bad.exit_code != 0 and "GTX 480" in str(bad.exception)
