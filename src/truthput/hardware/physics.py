"""First-order physics of LLM decoding.

Shared by the roofline (which reports each bound) and the simulator (which sleeps for the step time),
so both tell the same story. Every figure this module produces is a MODEL figure, never a
measurement. Units: bytes, seconds, FLOP/s.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from truthput.errors import InputError
from truthput.hardware.gpus import GPU
from truthput.hardware.models import ModelProfile

GiB = 1024**3
ACTIVATION_BYTES = 2.0  # bf16 activations travel through the all-reduces
NGRAM_CPU_S_PER_SEQ = 20e-6  # estimate: n-gram lookup over a sequence's history, CPU, per step
DRAFT_MODEL_METHODS = ("draft_model", "draft")
NGRAM_METHODS = ("ngram", "ngram_gpu", "suffix")


@dataclass(frozen=True)
class Efficiency:
    """Achieved fractions of peak and fixed costs; the knobs calibration fits.

    tp_latency_s None means the interconnect's catalog alpha (per collective).
    t_overhead = step_overhead_s + per_seq_overhead_s x batch.
    """

    bw_frac: float = 0.8
    flops_frac: float = 0.5
    step_overhead_s: float = 0.003
    tp_latency_s: float | None = None
    per_seq_overhead_s: float = 0.0  # CPU cost per running sequence per step (sampling, detokenising)
    # n-gram speculation's CPU cost per decoding sequence per step (prompt lookup, draft bookkeeping,
    # verification sampling); on a CPU host it is milliseconds, the same core's time as the kernels'
    ngram_s_per_seq: float = NGRAM_CPU_S_PER_SEQ
    # speculation's cost per step whatever the batch (verification sampling, draft bookkeeping): on
    # vLLM-CPU, n-gram's extra time fitted as a cost per sequence at 1 stream over-predicted its steps
    # at 4 and 8 streams by 40-60%
    spec_step_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class StepBreakdown:
    """Time of one engine step (seconds) and which resource binds the max(mem, compute) part."""

    t_weights: float
    t_kv: float
    t_mem: float
    t_compute: float
    t_allreduce: float
    t_draft: float
    t_overhead: float
    total: float
    bound: str  # "memory" | "compute"
    weight_bytes_per_gpu: float = 0.0
    kv_bytes_per_gpu: float = 0.0
    flops_per_gpu: float = 0.0
    allreduce_bytes: float = 0.0
    collectives: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def kv_heads_per_gpu(model: ModelProfile, tp: int) -> float:
    """KV heads each GPU stores: split across TP ranks, replicated when kv_heads < tp."""
    return max(1.0, math.ceil(model.kv_heads / tp)) if tp > 1 else float(model.kv_heads)


def kv_bytes_per_token_per_gpu(model: ModelProfile, kv_dtype_bytes: float, tp: int) -> float:
    """KV bytes one token adds on each GPU (heads replicated when kv_heads < tp)."""
    return 2.0 * model.attn_layers * kv_heads_per_gpu(model, tp) * model.head_dim * kv_dtype_bytes


def compute_peak_flops(gpu: GPU, model: ModelProfile) -> float:
    """Peak dense FLOP/s for the matmul dtype: fp8 for 8-bit float checkpoints where the GPU has it,
    else bf16 (weight-only quantised kernels dequantise to bf16 and run bf16 tensor cores)."""
    if model.bits_per_weight == 8 and gpu.fp8_flops:
        return gpu.fp8_flops
    return gpu.bf16_flops


def tp_latency(gpu: GPU, eff: Efficiency) -> float:
    return gpu.interconnect.latency_s if eff.tp_latency_s is None else eff.tp_latency_s


def allreduce_time(gpu: GPU, tp: int, nbytes: float, eff: Efficiency) -> float:
    """One ring all-reduce: 2(t-1)/t x bytes / link bandwidth + alpha (0 without TP)."""
    if tp <= 1:
        return 0.0
    return 2.0 * (tp - 1) / tp * nbytes / link_bandwidth(gpu, tp) + tp_latency(gpu, eff)


def link_bandwidth(gpu: GPU, tp: int) -> float:
    """The TP link's bandwidth; a profile without one (a CPU host) cannot be split over TP > 1."""
    link = gpu.interconnect.bandwidth_Bps
    if link <= 0:
        raise InputError(f"{gpu.name} has no tensor-parallel link in its profile: TP={tp} cannot be modelled on it")
    return link


def _normalise_method(spec_k: int, spec_method: str | None, model: ModelProfile) -> str | None:
    if spec_k <= 0:
        return None
    method = (spec_method or "mtp").lower()
    if method in NGRAM_METHODS:
        return "ngram"
    if method in DRAFT_MODEL_METHODS:
        return "draft_model"
    if "mtp" in method or "eagle" in method or method == "medusa":
        return "mtp"
    raise InputError(f"unknown speculative method {spec_method!r} (physics): use mtp, eagle, ngram or draft_model")


def decode_step(
    gpu: GPU,
    model: ModelProfile,
    tp: int,
    batch: float,
    context_tokens_total: float,
    spec_k: int = 0,
    spec_method: str | None = None,
    kv_dtype_bytes: float = 2.0,
    prefill_tokens: float = 0,
    eff: Efficiency = Efficiency(),
    draft_model: ModelProfile | None = None,
    draft_tokens: float | None = None,
) -> StepBreakdown:
    """Time of one continuous-batching step: max(t_mem, t_compute) + t_allreduce + t_draft + t_overhead
    on a GPU, t_mem + t_compute + ... on a CPU host (`cpu_matmul_time`).

    batch sequences decode; context_tokens_total = sum of their context lengths; with speculation
    each sequence verifies its drafts beside its own token (positions = batch + draft tokens: FLOPs
    grow, weight bytes do not). draft_tokens is how many the step verifies across the batch; None
    means batch x spec_k, every sequence drafting k (MTP, EAGLE, a draft model). An n-gram proposer
    drafts only where the text repeats and then often fewer than k, so on a measured run it is the
    counters' draft tokens per sequence-step x batch. prefill_tokens of chunked prefill ride in the
    same step (FLOPs only, plus their share of the all-reduces).
    """
    if tp < 1 or batch < 0 or context_tokens_total < 0 or prefill_tokens < 0:
        raise InputError(f"decode_step: bad arguments tp={tp} batch={batch} context={context_tokens_total}")
    method = _normalise_method(spec_k, spec_method, model)
    k = spec_k if method else 0
    bw = eff.bw_frac * gpu.mem_bw_Bps
    peak = eff.flops_frac * compute_peak_flops(gpu, model)

    weight_bytes = model.weight_bytes / tp
    kv_bytes = context_tokens_total * kv_bytes_per_token_per_gpu(model, kv_dtype_bytes, tp)
    t_weights = weight_bytes / bw
    t_kv = kv_bytes / bw
    t_mem = t_weights + t_kv

    drafted = (batch * k if draft_tokens is None else min(max(draft_tokens, 0.0), batch * k)) if k else 0.0
    positions = batch + drafted + prefill_tokens
    per_seq_positions = 1.0 + drafted / batch if batch else 1.0
    matmul_flops = 2.0 * model.active_params * positions / tp
    attn_per_ctx = 4.0 * model.attn_layers * model.heads * model.head_dim / tp
    attn_flops = attn_per_ctx * (context_tokens_total * per_seq_positions + prefill_tokens * prefill_tokens / 2.0)
    flops = matmul_flops + attn_flops
    if gpu.kind == "cpu":
        t_compute = matmul_flops / (eff.flops_frac * (gpu.decode_flops or compute_peak_flops(gpu, model))) \
            + attn_flops / peak
    else:
        t_compute = flops / peak

    collectives = 2 * model.layers if tp > 1 else 0
    ar_bytes = positions * model.hidden * ACTIVATION_BYTES
    t_allreduce = collectives * allreduce_time(gpu, tp, ar_bytes, eff)

    t_draft = 0.0
    if method == "mtp":
        # k sequential passes of ~one decoder layer + LM head over the batch
        head_params = (model.mtp_params or model.params / model.layers) + model.vocab * model.hidden
        pass_bytes = head_params * model.bits_per_weight / 8 / tp
        pass_kv = kv_bytes / max(model.attn_layers, 1)
        pass_flops = 2.0 * head_params * batch / tp
        pass_ar = 2 * allreduce_time(gpu, tp, batch * model.hidden * ACTIVATION_BYTES, eff)
        t_draft = k * (max((pass_bytes + pass_kv) / bw, pass_flops / peak) + pass_ar)
    elif method == "ngram":
        t_draft = eff.ngram_s_per_seq * batch
    elif method == "draft_model":
        if draft_model is None:
            raise InputError("decode_step: spec_method 'draft_model' needs draft_model= a ModelProfile")
        one = decode_step(gpu, draft_model, tp, batch, context_tokens_total,
                          kv_dtype_bytes=kv_dtype_bytes, eff=Efficiency(eff.bw_frac, eff.flops_frac, 0.0, eff.tp_latency_s, 0.0))
        t_draft = k * one.total

    if method and batch:
        t_draft += eff.spec_step_s
    t_overhead = eff.step_overhead_s + eff.per_seq_overhead_s * batch
    total = cpu_matmul_time(t_mem, t_compute) if gpu.kind == "cpu" else max(t_mem, t_compute)
    total += t_allreduce + t_draft + t_overhead
    return StepBreakdown(
        t_weights=t_weights, t_kv=t_kv, t_mem=t_mem, t_compute=t_compute, t_allreduce=t_allreduce,
        t_draft=t_draft, t_overhead=t_overhead, total=total,
        bound="memory" if t_mem >= t_compute else "compute",
        weight_bytes_per_gpu=weight_bytes, kv_bytes_per_gpu=kv_bytes, flops_per_gpu=flops,
        allreduce_bytes=ar_bytes, collectives=collectives,
    )


def cpu_matmul_time(t_mem: float, t_compute: float) -> float:
    """A CPU host's decode step streams the weights and multiplies the rows one after the other:
    t_mem + t_compute, not the GPU roofline's max. One core's instruction stream both loads the
    weights and issues the FMAs, so the rows a step adds are not hidden under the streaming: vLLM-CPU's
    oneDNN kernel at a small model's shapes, on one core here, costs 0.36-0.7 ms per added row from
    the second row on, while the weights alone take 8 ms; a max() called the first ten rows free,
    and a fit then loaded their cost onto the per-sequence constants and mis-predicted larger batches.
    """
    return t_mem + t_compute


def prior_efficiency(gpu: GPU) -> Efficiency:
    """The efficiency to assume before any calibration: a datasheet's peaks are discounted (80% of
    the bandwidth, half the FLOP/s); a probed host's figures were achieved there, so they are
    not. On a probed 1-core host, the half-FLOP/s prior predicted 8 streams 37% too slow."""
    return Efficiency(bw_frac=1.0, flops_frac=1.0) if gpu.measured else Efficiency()


IDLE_POWER_FRAC = 0.2
"""Estimate: a GPU holding a served model between steps (clocks up, HBM refreshed, nothing
running) draws about a fifth of its board power limit."""


def step_power_w(gpu: GPU, step: StepBreakdown, idle_frac: float = IDLE_POWER_FRAC) -> float | None:
    """A model of one GPU's mean power over a step, for tok/s per watt: idle power plus the rest
    of the board limit in proportion to the time the step keeps the memory system or the tensor
    cores busy (the roofline part, and a draft model's pass), against the all-reduce waits and the
    host's per-step overhead, when the GPU idles. An estimate, ranking configurations by the energy
    a token costs; None when the board's power limit is not known."""
    if gpu.board_power_w is None or step.total <= 0:
        return None
    busy = min(1.0, (max(step.t_mem, step.t_compute) + step.t_draft) / step.total)
    return gpu.board_power_w * (idle_frac + (1.0 - idle_frac) * busy)


@dataclass(frozen=True)
class MemoryPlan:
    """Per-GPU memory at start-up, vLLM-style; error_kind/error say how vLLM would refuse to start."""

    weights_per_gpu: float
    activations: float
    sampler_workspace: float
    other: float
    kv_bytes_per_gpu: float
    kv_capacity_tokens: int
    error_kind: str | None  # None | "oom" | "kv_too_small"
    error: str | None
    budget_per_gpu: float = 0.0
    kv_bytes_per_token_per_gpu: float = 0.0
    max_concurrency_at_max_len: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


NON_TORCH_BYTES = 0.5 * GiB  # estimate: CUDA context, NCCL buffers
CUDA_GRAPH_BYTES = 0.5 * GiB  # estimate: captured graphs
BLOCK_SIZE = 16


def activation_peak_bytes(model: ModelProfile, tp: int, max_num_batched_tokens: int) -> float:
    """Peak activations of vLLM's profiling run at max_num_batched_tokens (estimate: the MLP's
    gate+up output and a few hidden-size buffers, bf16)."""
    per_token = (2.0 * model.intermediate / tp + 4.0 * model.hidden) * ACTIVATION_BYTES
    return max_num_batched_tokens * per_token


def memory_plan(gpu: GPU, model: ModelProfile, tp: int, gpu_memory_utilization: float, max_num_seqs: int,
                max_model_len: int, spec_k: int = 0, kv_dtype_bytes: float = 2.0,
                max_num_batched_tokens: int = 8192) -> MemoryPlan:
    """Per-GPU start-up budget: util x memory - weights - activations - sampler - other = KV cache."""
    if not 0.0 < gpu_memory_utilization <= 1.0:
        raise InputError(f"gpu_memory_utilization={gpu_memory_utilization} must be in (0, 1] (physics)")
    budget = gpu_memory_utilization * gpu.memory_bytes
    weights = model.weight_bytes / tp
    if spec_k > 0 and model.mtp_params:
        weights += model.mtp_params * model.bits_per_weight / 8 / tp
    activations = activation_peak_bytes(model, tp, max_num_batched_tokens)
    sampler = float(max_num_seqs) * (spec_k + 1) * model.vocab * 4.0
    other = NON_TORCH_BYTES + CUDA_GRAPH_BYTES
    per_token = kv_bytes_per_token_per_gpu(model, kv_dtype_bytes, tp)
    kv_bytes = budget - weights - activations - sampler - other
    error_kind: str | None = None
    error: str | None = None

    if weights > gpu.memory_bytes or weights + activations > gpu.memory_bytes:
        need = weights + activations - gpu.memory_bytes
        error_kind = "oom"
        error = (
            f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {max(need, 0) / GiB:.2f} GiB. "
            f"GPU 0 has a total capacity of {gpu.memory_bytes / GiB:.2f} GiB of which 0 bytes is free."
        )
    elif kv_bytes <= 0:
        error_kind = "oom"
        error = ("ValueError: No available memory for the cache blocks. Try increasing "
                 "`gpu_memory_utilization` when initializing the engine.")
    kv_bytes = max(kv_bytes, 0.0)
    capacity = int(kv_bytes // per_token) // BLOCK_SIZE * BLOCK_SIZE if per_token > 0 else 0
    needed = max_model_len * per_token
    if error_kind is None and needed > kv_bytes:
        estimated = capacity
        estimated_msg = (f"Based on the available memory, the estimated maximum model length is {estimated}."
                         if estimated > 0 else "")
        error_kind = "kv_too_small"
        error = (
            f"ValueError: To serve at least one request with the model's max seq len ({max_model_len}), "
            f"({needed / GiB:.2f} GiB KV cache is needed, which is larger than the available KV cache "
            f"memory ({kv_bytes / GiB:.2f} GiB). {estimated_msg} Try increasing `gpu_memory_utilization` "
            f"or decreasing `max_model_len` when initializing the engine."
        )
    return MemoryPlan(
        weights_per_gpu=weights, activations=activations, sampler_workspace=sampler, other=other,
        kv_bytes_per_gpu=kv_bytes, kv_capacity_tokens=capacity, error_kind=error_kind, error=error,
        budget_per_gpu=budget, kv_bytes_per_token_per_gpu=per_token,
        max_concurrency_at_max_len=capacity / max_model_len if max_model_len else 0.0,
    )
