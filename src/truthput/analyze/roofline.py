"""Roofline: the per-step lower bounds physics puts on decode, and where a measurement sits.

Every figure here comes from the first-order model in truthput.hardware.physics evaluated at PEAK
datasheet figures (no efficiency fractions), so each bound is a true floor on step time and each
ceiling a true upper limit on throughput -- as far as the model goes. Figures are labelled
source "model"; a measurement passed to place() keeps its own label.

The point of place() is honesty: when a measurement is far from every bound, the report says that
no modelled resource binds and how many ms per step are unexplained, instead of calling the nearest
bound "the wall".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from truthput.errors import InputError
from truthput.hardware.gpus import GPU
from truthput.hardware.models import ModelProfile
from truthput.hardware.physics import (
    ACTIVATION_BYTES, compute_peak_flops, kv_bytes_per_token_per_gpu, link_bandwidth,
)

SOURCE = "model"
BIND_THRESHOLD = 0.70  # at or above this share of a ceiling, that bound is called binding


def _fig(value: float | None, unit: str, **extra: object) -> dict[str, Any]:
    return {"value": value, "unit": unit, "source": SOURCE, **extra}


@dataclass(frozen=True)
class Bound:
    """One resource's floor on the time of a decode step, at peak datasheet figures."""

    name: str
    seconds_per_step: float
    detail: str
    additive: bool = False  # True: adds to the step (all-reduce); False: overlaps inside max(mem, compute)

    def to_dict(self) -> dict[str, Any]:
        return _fig(self.seconds_per_step, "s/step", name=self.name, detail=self.detail,
                    additive=self.additive)


@dataclass(frozen=True)
class Ceiling:
    """An upper limit on throughput: aggregate and per stream, with the step floor it comes from."""

    name: str
    step_floor_s: float
    tokens_per_step_per_stream: float
    aggregate_tokps: float
    per_stream_tokps: float
    detail: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "detail": self.detail,
            "step_floor": _fig(self.step_floor_s, "s/step"),
            "tokens_per_step_per_stream": _fig(self.tokens_per_step_per_stream, "tokens"),
            "aggregate": _fig(self.aggregate_tokps, "tok/s"),
            "per_stream": _fig(self.per_stream_tokps, "tok/s"),
        }


@dataclass(frozen=True)
class Roofline:
    gpu: str
    model: str
    tp: int
    kv_dtype_bytes: float
    context_len: int
    concurrency: int
    spec_k: int
    acceptance_length: float | None
    bounds: dict[str, Bound]
    weight_passes_per_s: float
    ceilings: dict[str, Ceiling]
    tightest: str  # key into ceilings used by place()
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def tightest_ceiling(self) -> Ceiling:
        return self.ceilings[self.tightest]

    def to_dict(self) -> dict[str, Any]:
        return {
            "gpu": self.gpu, "model": self.model, "tp": self.tp, "kv_dtype_bytes": self.kv_dtype_bytes,
            "context_len": self.context_len, "concurrency": self.concurrency, "spec_k": self.spec_k,
            "acceptance_length": self.acceptance_length,
            "bounds": {k: b.to_dict() for k, b in self.bounds.items()},
            "weight_passes_per_s": _fig(self.weight_passes_per_s, "1/s"),
            "ceilings": {k: c.to_dict() for k, c in self.ceilings.items()},
            "tightest": self.tightest, "notes": list(self.notes),
        }


def _check(tp: int, concurrency: int, context_len: int, spec_k: int, acceptance_length: float | None) -> None:
    if tp < 1 or concurrency < 1 or context_len < 0 or spec_k < 0:
        raise InputError(f"roofline: bad arguments tp={tp} concurrency={concurrency} context={context_len} "
                         f"spec_k={spec_k}")
    if acceptance_length is not None and not 1.0 <= acceptance_length <= spec_k + 1:
        raise InputError(f"roofline: acceptance length {acceptance_length} outside [1, spec_k+1={spec_k + 1}]")


def roofline(
    gpu: GPU,
    model: ModelProfile,
    tp: int,
    kv_dtype_bytes: float,
    context_len: int,
    concurrency: int,
    spec_k: int = 0,
    acceptance_length: float | None = None,
) -> Roofline:
    """Per-step floors and throughput ceilings for `concurrency` streams each holding context_len tokens."""
    _check(tp, concurrency, context_len, spec_k, acceptance_length)
    b = concurrency
    bw = gpu.mem_bw_Bps
    peak = compute_peak_flops(gpu, model)

    t_weights = model.weight_bytes / tp / bw
    kv_bytes = b * context_len * kv_bytes_per_token_per_gpu(model, kv_dtype_bytes, tp)
    t_kv = kv_bytes / bw

    def compute_time(positions_per_seq: int) -> float:
        matmul = 2.0 * model.active_params * b * positions_per_seq / tp
        attention = 4.0 * model.attn_layers * model.heads * model.head_dim * b * context_len * positions_per_seq / tp
        return (matmul + attention) / peak

    collectives = 2 * model.layers if tp > 1 else 0

    def allreduce_bw_time(positions_per_seq: int) -> float:
        if tp <= 1:
            return 0.0
        nbytes = b * positions_per_seq * model.hidden * ACTIVATION_BYTES
        return collectives * 2.0 * (tp - 1) / tp * nbytes / link_bandwidth(gpu, tp)

    t_ar_lat = collectives * gpu.interconnect.latency_s
    bounds = {
        "weights": Bound("weights", t_weights,
                         f"{model.weight_bytes / tp / 1e9:.2f} GB of weights per GPU / {bw / 1e9:.0f} GB/s"),
        "kv": Bound("kv", t_kv, f"{kv_bytes / 1e9:.3f} GB of KV per GPU ({b} x {context_len} tokens) / "
                                f"{bw / 1e9:.0f} GB/s"),
        "compute": Bound("compute", compute_time(1),
                         f"{b} positions x 2 x {model.active_params / 1e9:.1f}e9 params / TP {tp} / "
                         f"{peak / 1e12:.0f} TFLOP/s dense"),
        "allreduce_bandwidth": Bound("allreduce_bandwidth", allreduce_bw_time(1),
                                     f"{collectives} all-reduces of {b} x {model.hidden} bf16 over "
                                     f"{gpu.interconnect.kind} at {gpu.interconnect.bandwidth_Bps / 1e9:.0f} GB/s",
                                     additive=True),
        "allreduce_latency": Bound("allreduce_latency", t_ar_lat,
                                   f"{collectives} collectives x {gpu.interconnect.latency_s * 1e6:.0f} us "
                                   f"(estimated alpha, {gpu.interconnect.kind})", additive=True),
    }
    if spec_k > 0:
        bounds["compute_verify"] = Bound(
            "compute_verify", compute_time(spec_k + 1),
            f"verification scores {spec_k + 1} positions per stream: compute x {spec_k + 1}")
        bounds["allreduce_bandwidth_verify"] = Bound(
            "allreduce_bandwidth_verify", allreduce_bw_time(spec_k + 1),
            f"all-reduce bytes x {spec_k + 1} for verification", additive=True)

    def ceiling(name: str, floor: float, tokens: float, detail: str) -> Ceiling:
        agg = b * tokens / floor if floor > 0 else float("inf")
        return Ceiling(name, floor, tokens, agg, agg / b, detail)

    t_mem = t_weights + t_kv
    ceilings = {
        "weight_streaming": ceiling("weight_streaming", t_weights, 1.0,
                                    "weights only, one token per stream per pass"),
        "no_spec": ceiling("no_spec", max(t_mem, bounds["compute"].seconds_per_step), 1.0,
                           "max(weights + KV, compute), no speculation"),
        "no_spec_with_allreduce": ceiling(
            "no_spec_with_allreduce",
            max(t_mem, bounds["compute"].seconds_per_step) + t_ar_lat + bounds["allreduce_bandwidth"].seconds_per_step,
            1.0, "no speculation, plus TP all-reduce (alpha is an estimate)"),
    }
    notes = []
    tightest = "no_spec"
    if spec_k > 0:
        tokens = acceptance_length if acceptance_length is not None else spec_k + 1.0
        label = (f"measured mean acceptance length {acceptance_length:g}" if acceptance_length is not None
                 else f"hard bound k+1 = {spec_k + 1} tokens per step")
        spec_floor = max(t_mem, bounds["compute_verify"].seconds_per_step)
        ceilings["spec"] = ceiling("spec", spec_floor, tokens, f"max(weights + KV, compute x {spec_k + 1}); {label}")
        ceilings["spec_with_allreduce"] = ceiling(
            "spec_with_allreduce",
            spec_floor + t_ar_lat + bounds["allreduce_bandwidth_verify"].seconds_per_step, tokens,
            f"speculation plus TP all-reduce (alpha is an estimate); {label}")
        tightest = "spec"
        if acceptance_length is None:
            notes.append(f"speculation ceiling uses the hard bound of {spec_k + 1} tokens per step; pass a "
                         "measured acceptance length for a realistic one")
    notes.append("draft passes, step overhead and kernel efficiency are not bounds: they appear as "
                 "unexplained time when a measurement is placed")
    return Roofline(
        gpu=gpu.name, model=model.name, tp=tp, kv_dtype_bytes=kv_dtype_bytes, context_len=context_len,
        concurrency=concurrency, spec_k=spec_k, acceptance_length=acceptance_length, bounds=bounds,
        weight_passes_per_s=1.0 / t_weights if t_weights > 0 else float("inf"), ceilings=ceilings,
        tightest=tightest, notes=tuple(notes),
    )


@dataclass(frozen=True)
class Placement:
    """A measured throughput placed against the roofline."""

    measured_tokps: float
    measured_source: str
    tokens_per_step_per_stream: float
    tokens_per_step_basis: str
    measured_step_s: float
    bound_shares: dict[str, float]  # bound -> its floor as a fraction of the measured step time
    ceiling_name: str
    ceiling_tokps: float
    fraction_of_ceiling: float
    unexplained_step_s: float
    binding: str | None  # the bound that binds, or None when no modelled resource does
    sentence: str
    fraction_of_weight_streaming: float = 0.0  # vs. B x 1 token / weight pass (no speculation)

    def to_dict(self) -> dict[str, Any]:
        return {
            "measured": {"value": self.measured_tokps, "unit": "tok/s", "source": self.measured_source},
            "tokens_per_step_per_stream": _fig(self.tokens_per_step_per_stream, "tokens",
                                               basis=self.tokens_per_step_basis),
            "measured_step": _fig(self.measured_step_s, "s/step",
                                  derived_from="measured tok/s and tokens per step"),
            "bound_shares": {k: _fig(v, "fraction of measured step") for k, v in self.bound_shares.items()},
            "ceiling": _fig(self.ceiling_tokps, "tok/s", name=self.ceiling_name),
            "fraction_of_ceiling": _fig(self.fraction_of_ceiling, "fraction"),
            "unexplained_step": _fig(self.unexplained_step_s, "s/step"),
            "fraction_of_weight_streaming": _fig(self.fraction_of_weight_streaming, "fraction"),
            "binding": self.binding,
            "sentence": self.sentence,
        }


def _candidates(roof: Roofline, model_bits: float | None) -> list[str]:
    out = []
    if roof.tp > 1:
        lat = roof.bounds["allreduce_latency"].seconds_per_step
        out.append(f"TP all-reduce latency (~{lat * 1e3:.1f} ms/step at the estimated alpha)")
    if model_bits is not None and model_bits < 16:
        out.append("quantised kernel efficiency")
    if roof.spec_k > 0:
        out.append("draft passes")
    out.append("CPU scheduling")
    return out


def place(roof: Roofline, measured_tokps: float, acceptance_length: float | None = None,
          measured_source: str = "server_counter", model_bits: float | None = None) -> Placement:
    """Where `measured_tokps` (aggregate over roof.concurrency streams) sits against the roofline.

    With speculation, the measured step time needs tokens per step: the measured acceptance length
    when given (here or in the roofline), else k+1 (which makes the step time an upper estimate).
    """
    if measured_tokps <= 0:
        raise InputError(f"place: measured throughput must be positive, got {measured_tokps}")
    acc = acceptance_length if acceptance_length is not None else roof.acceptance_length
    if roof.spec_k > 0:
        tokens = acc if acc is not None else roof.spec_k + 1.0
        basis = "measured acceptance length" if acc is not None else f"assumed k+1 = {roof.spec_k + 1}"
    else:
        tokens, basis = 1.0, "no speculation"
    step = roof.concurrency * tokens / measured_tokps
    shares = {name: bound.seconds_per_step / step for name, bound in roof.bounds.items()}
    ceil = roof.tightest_ceiling
    ceiling_tokps = roof.concurrency * tokens / ceil.step_floor_s
    fraction = measured_tokps / ceiling_tokps
    unexplained = step - ceil.step_floor_s
    overlap = {k: v for k, v in roof.bounds.items() if not v.additive and k != "weights" and k != "kv"}
    mem = roof.bounds["weights"].seconds_per_step + roof.bounds["kv"].seconds_per_step
    compute_key = "compute_verify" if roof.spec_k > 0 else "compute"
    nearest = "memory bandwidth" if mem >= overlap[compute_key].seconds_per_step else "compute"
    pct = f"{fraction * 100:.0f}%"
    # on the simulator the time beyond the floor is its own modelled overhead, not a mystery
    rest = "of the simulator's modelled overhead" if measured_source == "simulator" else "unexplained"
    if fraction >= BIND_THRESHOLD:
        binding: str | None = nearest
        sentence = (f"{nearest} binds: {pct} of the {ceil.name} ceiling "
                    f"({ceiling_tokps:.1f} tok/s); {unexplained * 1e3:.1f} ms/step {rest}")
    else:
        binding = None
        sentence = (f"no modelled resource binds: {pct} of the tightest ceiling "
                    f"({ceiling_tokps:.1f} tok/s, {nearest}); {unexplained * 1e3:.0f} ms/step {rest}"
                    + ("" if measured_source == "simulator"
                       else f" — candidates: {', '.join(_candidates(roof, model_bits))}"))
    return Placement(
        measured_tokps=measured_tokps, measured_source=measured_source, tokens_per_step_per_stream=tokens,
        tokens_per_step_basis=basis, measured_step_s=step, bound_shares=shares, ceiling_name=ceil.name,
        ceiling_tokps=ceiling_tokps, fraction_of_ceiling=fraction, unexplained_step_s=unexplained,
        binding=binding, sentence=sentence,
        fraction_of_weight_streaming=measured_tokps / roof.ceilings["weight_streaming"].aggregate_tokps,
    )
