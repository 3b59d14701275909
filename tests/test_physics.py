"""The first-order decode model against hand-computed examples."""

from __future__ import annotations

import pytest

from truthput.errors import InputError
from truthput.hardware.gpus import GPU, Interconnect, get_gpu
from truthput.hardware.models import ModelProfile, get_model
from truthput.hardware.physics import (
    GiB, Efficiency, decode_step, kv_bytes_per_token_per_gpu, memory_plan,
)

TOY_GPU = GPU(name="toy", memory_bytes=10 * GiB, mem_bw_Bps=1e12, bf16_flops=100e12, fp8_flops=None,
              int8_ops=None, interconnect=Interconnect("pcie", 10e9, 20e-6, "test"), sources=("test",))
TOY_MODEL = ModelProfile(name="toy", params=1e9, active_params=1e9, layers=10, attn_layers=10,
                         hidden=1000, intermediate=4000, heads=8, kv_heads=2, head_dim=100, vocab=1000,
                         bits_per_weight=16, weight_bytes=2e9, mtp_params=0.0,
                         max_position_embeddings=4096, source="test")
EFF = Efficiency(bw_frac=0.5, flops_frac=0.5, step_overhead_s=0.001)


def test_kv_bytes_per_token() -> None:
    assert kv_bytes_per_token_per_gpu(TOY_MODEL, 2, tp=1) == 2 * 10 * 2 * 100 * 2 == 8000
    assert kv_bytes_per_token_per_gpu(TOY_MODEL, 2, tp=2) == 4000
    # 2 KV heads over TP=4: replicated, one head per GPU, not half a head
    assert kv_bytes_per_token_per_gpu(TOY_MODEL, 2, tp=4) == 4000
    seed = get_model("qwen3.6-27b-5.5bit")  # only the 16 full-attention layers hold KV
    assert kv_bytes_per_token_per_gpu(seed, 1.0, tp=1) == 2 * 16 * 4 * 256 * 1


def test_decode_step_by_hand() -> None:
    s = decode_step(TOY_GPU, TOY_MODEL, tp=2, batch=4, context_tokens_total=4000, eff=EFF)
    assert s.t_weights == pytest.approx(1e9 / 0.5e12)             # 2 ms
    assert s.t_kv == pytest.approx(4000 * 4000 / 0.5e12)           # 32 us
    assert s.t_mem == pytest.approx(2.032e-3)
    flops = 2 * 1e9 * 4 / 2 + 4 * 10 * 8 * 100 / 2 * 4000          # matmuls + attention
    assert s.t_compute == pytest.approx(flops / 50e12)
    per_collective = 2 * 1 / 2 * (4 * 1000 * 2) / 10e9 + 20e-6    # ring + alpha
    assert s.t_allreduce == pytest.approx(20 * per_collective)
    assert s.t_draft == 0 and s.t_overhead == 0.001 and s.bound == "memory"
    assert s.total == pytest.approx(2.032e-3 + 20 * per_collective + 1e-3)


def test_tp_latency_override_and_no_tp() -> None:
    s = decode_step(TOY_GPU, TOY_MODEL, 2, 1, 0, eff=Efficiency(tp_latency_s=100e-6))
    assert s.t_allreduce == pytest.approx(20 * (1000 * 2 / 10e9 + 100e-6))
    assert decode_step(TOY_GPU, TOY_MODEL, 1, 1, 0).t_allreduce == 0


def test_compute_bound_at_large_batch() -> None:
    s = decode_step(TOY_GPU, TOY_MODEL, 1, 1000, 0, eff=EFF)
    assert s.bound == "compute"
    assert s.t_compute == pytest.approx(2 * 1e9 * 1000 / 50e12)  # 40 ms > 4 ms weights
    assert s.total == pytest.approx(s.t_compute + 1e-3)


def test_speculation_multiplies_flops_not_weights() -> None:
    plain = decode_step(TOY_GPU, TOY_MODEL, 1, 8, 800, eff=EFF)
    spec = decode_step(TOY_GPU, TOY_MODEL, 1, 8, 800, spec_k=3, spec_method="ngram", eff=EFF)
    assert spec.t_weights == plain.t_weights and spec.t_kv == plain.t_kv
    assert spec.flops_per_gpu == pytest.approx(4 * plain.flops_per_gpu)
    assert spec.t_draft == pytest.approx(8 * 20e-6)


def test_mtp_draft_cost_is_k_small_passes() -> None:
    seed, gpu = get_model("qwen3.6-27b-5.5bit"), get_gpu("RTX 3090")
    one = decode_step(gpu, seed, 2, 1, 2048, spec_k=1, spec_method="qwen3_5_mtp", kv_dtype_bytes=1)
    three = decode_step(gpu, seed, 2, 1, 2048, spec_k=3, spec_method="qwen3_5_mtp", kv_dtype_bytes=1)
    assert three.t_draft == pytest.approx(3 * one.t_draft)
    # a draft pass reads ~one layer + LM head: far less than a full weight pass
    assert 0 < one.t_draft < 0.15 * one.t_weights


def test_draft_model_needs_profile() -> None:
    with pytest.raises(InputError, match="draft_model"):
        decode_step(TOY_GPU, TOY_MODEL, 1, 1, 0, spec_k=2, spec_method="draft_model")
    s = decode_step(TOY_GPU, TOY_MODEL, 1, 1, 0, spec_k=2, spec_method="draft_model",
                    draft_model=TOY_MODEL, eff=EFF)
    assert s.t_draft == pytest.approx(2 * 2e9 / 0.5e12)  # two passes of the draft's 2 GB


def test_prefill_adds_flops() -> None:
    s = decode_step(TOY_GPU, TOY_MODEL, 1, 0, 0, prefill_tokens=1000, eff=EFF)
    assert s.flops_per_gpu == pytest.approx(2 * 1e9 * 1000 + 4 * 10 * 8 * 100 * 1000 * 500)


def test_seed_weight_pass() -> None:
    s = decode_step(get_gpu("RTX 3090"), get_model("qwen3.6-27b-5.5bit"), 2, 1, 0,
                    eff=Efficiency(bw_frac=1.0))
    assert s.t_weights == pytest.approx(9.3e9 / 936e9)  # 9.94 ms -> ~100 weight passes/s


def test_memory_plan_by_hand() -> None:
    plan = memory_plan(TOY_GPU, TOY_MODEL, tp=1, gpu_memory_utilization=0.9, max_num_seqs=10,
                       max_model_len=4096, max_num_batched_tokens=1000)
    assert plan.weights_per_gpu == 2e9
    assert plan.activations == pytest.approx(1000 * (2 * 4000 + 4 * 1000) * 2)
    assert plan.sampler_workspace == 10 * 1 * 1000 * 4
    kv = 0.9 * 10 * GiB - 2e9 - plan.activations - plan.sampler_workspace - plan.other
    assert plan.kv_bytes_per_gpu == pytest.approx(kv)
    assert plan.kv_capacity_tokens == int(kv // 8000) // 16 * 16
    assert plan.error_kind is None


def test_memory_plan_failures_use_vllm_wording() -> None:
    small = memory_plan(TOY_GPU, TOY_MODEL, 1, 0.3, 10, 4096 * 200, max_num_batched_tokens=1000)
    assert small.error_kind == "kv_too_small"
    assert small.error.startswith("ValueError: To serve at least one request with the model's max seq len (819200)")
    assert "GiB KV cache is needed, which is larger than the available KV cache memory" in small.error
    oom = memory_plan(get_gpu("RTX 3090"), get_model("llama-3.1-70b"), 2, 0.9, 16, 4096)
    assert oom.error_kind == "oom" and oom.error.startswith("torch.OutOfMemoryError: CUDA out of memory.")
    nocache = memory_plan(TOY_GPU, TOY_MODEL, 1, 0.2, 10, 4096, max_num_batched_tokens=1000)
    assert nocache.error_kind == "oom" and "No available memory for the cache blocks" in nocache.error


def test_seed_memory_plan_fits() -> None:
    plan = memory_plan(get_gpu("RTX 3090"), get_model("qwen3.6-27b-5.5bit"), 2, 0.97, 128, 98304,
                       spec_k=3, kv_dtype_bytes=1.0)
    assert plan.error_kind is None  # the seed's config starts
    assert plan.kv_capacity_tokens > 98304
