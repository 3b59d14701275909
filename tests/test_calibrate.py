"""Calibration recovers known constants from points the physics model generated (+ seeded noise)."""

from __future__ import annotations

import itertools
import json
import math
import random
from pathlib import Path

import pytest

from truthput.errors import InputError
from truthput.hardware.gpus import get_gpu
from truthput.hardware.models import get_model
from truthput.hardware.physics import Efficiency, decode_step
from truthput.sim.calibrate import CalibrationPoint, fit, load_profile, model_tokps

TRUE = Efficiency(bw_frac=0.7, flops_frac=0.4, step_overhead_s=0.004, tp_latency_s=30e-6)
GPU = get_gpu("RTX 3090")
MODEL = get_model("llama-3.1-8b")


def synthetic_points(noise: float, seed: int = 7) -> list[CalibrationPoint]:
    rng = random.Random(seed)
    points = []
    for tp, conc, ctx in itertools.product((1, 2, 4), (1, 4, 16, 64, 256), (512, 4096)):
        p = CalibrationPoint(tp=tp, concurrency=conc, spec_k=0, spec_method=None, acceptance_length=None,
                             context_tokens=ctx)
        truth = model_tokps(GPU, MODEL, p, TRUE)
        points.append(CalibrationPoint(**{**p.__dict__, "measured_tokps": truth * math.exp(rng.gauss(0, noise))}))
    return points


def test_recovers_known_constants_within_5_percent() -> None:
    result = fit(synthetic_points(noise=0.02), GPU, MODEL)
    eff = result.efficiency
    assert set(result.fitted) == {"bw_frac", "flops_frac", "step_overhead_s", "tp_latency_s"}
    # the resources that scale with the data are pinned to within 5%
    assert eff.bw_frac == pytest.approx(TRUE.bw_frac, rel=0.05)
    assert eff.flops_frac == pytest.approx(TRUE.flops_frac, rel=0.05)
    # the two fixed per-step times are told apart only by TP=1 vs TP>1 points: their sum at TP>1
    # is pinned to 5%, each alone to within its reported uncertainty (a 2% noise honestly allows
    # ~10-20% on each; the covariance says so)
    collectives = 2 * MODEL.layers
    fixed = eff.step_overhead_s + collectives * eff.tp_latency_s
    assert fixed == pytest.approx(TRUE.step_overhead_s + collectives * TRUE.tp_latency_s, rel=0.05)
    for name in result.fitted:
        assert abs(getattr(eff, name) - getattr(TRUE, name)) < 4 * result.std[name], name
    assert result.std["tp_latency_s"] / eff.tp_latency_s > 5 * result.std["bw_frac"] / eff.bw_frac
    assert 0.01 < result.noise_log < 0.03  # the 2% noise is recovered from the residuals
    for conc in (1, 8, 64):
        probe = CalibrationPoint(2, conc, 0, None, None, 2048)
        value, lo, hi = result.predict(probe)
        assert value == pytest.approx(model_tokps(GPU, MODEL, probe, TRUE), rel=0.05)
        assert lo < value < hi and hi / lo < 1.2


def test_exact_points_are_fitted_exactly() -> None:
    result = fit(synthetic_points(noise=0.0), GPU, MODEL)
    for name in result.fitted:
        assert getattr(result.efficiency, name) == pytest.approx(getattr(TRUE, name), rel=1e-4)


def test_one_point_fits_one_constant_and_says_so() -> None:
    p = CalibrationPoint(2, 1, 0, None, None, 1024)
    measured = model_tokps(GPU, MODEL, p, TRUE)
    prior = Efficiency(bw_frac=0.7, flops_frac=0.4, step_overhead_s=0.001, tp_latency_s=30e-6)
    result = fit([CalibrationPoint(**{**p.__dict__, "measured_tokps": measured})], GPU, MODEL, prior=prior)
    assert result.fitted == ("step_overhead_s",)
    assert set(result.dropped) == {"bw_frac", "flops_frac", "tp_latency_s"}
    assert result.efficiency.step_overhead_s == pytest.approx(0.004, rel=1e-4)
    assert "one data point" in result.notes[0]
    assert "assumed" in result.noise_basis


def test_unidentifiable_constants_are_dropped() -> None:
    # TP=1 only and small batches: TP latency has no data, compute never binds
    points = [p for p in synthetic_points(0.0) if p.tp == 1 and p.concurrency <= 4]
    result = fit(points, GPU, MODEL)
    assert "tp_latency_s" in result.dropped and "flops_frac" in result.dropped
    assert result.efficiency.flops_frac == Efficiency().flops_frac  # left at the prior


def test_profile_round_trip(tmp_path: Path) -> None:
    result = fit(synthetic_points(noise=0.01), GPU, MODEL)
    path = result.save_profile(tmp_path / "profile.json")
    eff, meta = load_profile(path)
    assert eff == result.efficiency
    assert meta["gpu"] == "RTX 3090" and meta["model"] == "llama-3.1-8b" and len(meta["points"]) == 30
    (tmp_path / "bad.json").write_text(json.dumps({"format": "other"}))
    with pytest.raises(InputError, match="not a truthput simulator profile"):
        load_profile(tmp_path / "bad.json")
    with pytest.raises(InputError, match="cannot read"):
        load_profile(tmp_path / "missing.json")


def test_speculation_point_needs_acceptance() -> None:
    with pytest.raises(InputError, match="acceptance_length"):
        fit([CalibrationPoint(1, 1, 2, "mtp", None, 100, 50.0)], GPU, MODEL)


SEED_1_STREAM, SEED_8_STREAMS = 66.9, 339.9
"""Fixture: the seed case's measured counter figures (2x RTX 3090, TP=2, MTP k=1)."""


def test_hand_written_profile_and_the_calibrate_command(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from truthput.cli import app

    (tmp_path / "hand.json").write_text(json.dumps({"bw_frac": 0.6, "step_overhead_s": 0.01}))
    eff, meta = load_profile(tmp_path / "hand.json")
    assert eff.bw_frac == 0.6 and eff.step_overhead_s == 0.01 and "hand-written" in meta["note"]
    out = tmp_path / "p.json"
    res = CliRunner().invoke(app, ["sim", "calibrate", "--gpu", "RTX 3090", "--model", "qwen3.6-27b-5.5bit",
                                   "--free", "step_overhead_s", "--out", str(out), "--store", str(tmp_path / "none.db"),
                                   "--point", "tp=2,concurrency=1,spec_k=1,spec_method=mtp,acceptance=1.95,"
                                   f"context=2048,tokps={SEED_1_STREAM},kv=1"])
    assert res.exit_code == 0, res.output
    eff, meta = load_profile(out)
    assert meta["fitted"] == ["step_overhead_s"] and 0.005 < eff.step_overhead_s < 0.015
    bad = CliRunner().invoke(app, ["sim", "calibrate", "--gpu", "RTX 3090", "--model", "x", "--point", "tp=2",
                                   "--store", str(tmp_path / "none.db")])
    assert bad.exit_code != 0


def test_two_seed_points_pick_the_constants_that_explain_them() -> None:
    base = CalibrationPoint(2, 1, 1, "qwen3_5_mtp", 1.95, 2048, 66.9, kv_dtype_bytes=1.0)
    points = [base, CalibrationPoint(**{**base.__dict__, "concurrency": 8, "measured_tokps": 339.9})]
    result = fit(points, "RTX 3090", "qwen3.6-27b-5.5bit")
    # only a compute-efficiency term grows with the batch the way the data do: bandwidth and TP
    # latency terms are nearly batch-independent here
    assert result.fitted == ("step_overhead_s", "flops_frac")
    assert result.efficiency.flops_frac == pytest.approx(0.218, abs=0.005)
    assert result.efficiency.step_overhead_s == pytest.approx(0.0093, abs=0.0002)
    assert max(abs(r) for r in result.residuals_log) < 1e-6


def test_speculations_cost_per_step_and_per_sequence_are_told_apart_by_two_concurrencies() -> None:
    """n-gram points made by the physics with a known cost per step (verification, bookkeeping)
    and per decoding sequence: at 1 and 4 streams the fit recovers both; at 1 stream alone it
    cannot tell them apart and puts the cost on the step, which holds at a larger batch where
    a per-sequence cost would multiply the error."""
    truth = Efficiency(bw_frac=0.8, flops_frac=0.5, step_overhead_s=0.004, spec_step_s=0.003, ngram_s_per_seq=0.0005)
    free = ("step_overhead_s", "spec_step_s", "ngram_s_per_seq")

    def point(conc: int, k: int) -> CalibrationPoint:
        p = CalibrationPoint(tp=1, concurrency=conc, spec_k=k, spec_method="ngram" if k else None,
                             acceptance_length=1.8 if k else None, context_tokens=1024)
        return CalibrationPoint(**{**p.__dict__, "measured_tokps": model_tokps(GPU, MODEL, p, truth)})

    both = fit([point(c, k) for c in (1, 4) for k in (0, 3)], GPU, MODEL, free=free)
    assert both.efficiency.spec_step_s == pytest.approx(0.003, rel=1e-3)
    assert both.efficiency.ngram_s_per_seq == pytest.approx(0.0005, rel=1e-3)
    one = fit([point(1, 0), point(1, 3)], GPU, MODEL, free=free)
    assert one.fitted == ("step_overhead_s", "spec_step_s") and "ngram_s_per_seq" in one.dropped
    assert one.efficiency.spec_step_s == pytest.approx(0.0035, rel=0.05)  # the two costs, as one per step


def test_a_probed_hosts_figures_are_not_discounted_as_a_datasheets_are() -> None:
    from dataclasses import replace

    from truthput.hardware.physics import prior_efficiency

    assert prior_efficiency(GPU) == Efficiency()  # the catalog's datasheet peaks: 80% / 50%
    probed = replace(GPU, sources=("measured by `truthput hardware probe` on 2026-12-02",), kind="cpu")
    assert (prior_efficiency(probed).bw_frac, prior_efficiency(probed).flops_frac) == (1.0, 1.0)


def test_a_cpu_hosts_front_end_cpu_per_sequence_is_the_per_sequence_cost_one_and_two_streams_cannot_fit() -> None:
    """Windows made by the physics on a CPU host whose engine loses CPU to the server's front end
    on the same cores: 0.5 ms per step (in the per-step cost) and 2 ms per running sequence per
    step. Fitted at 1 and 2 streams, a per-sequence cost is not told from the per-step one; with
    the front end's CPU time in each window as measured, the fit takes its per-sequence slope as
    the per-sequence cost and predicts 8 streams. One concurrency cannot give the slope: then the
    cost stays on the step, as before."""
    from dataclasses import replace

    host = replace(GPU, name="probed host", sources=("measured by `truthput hardware probe`",), kind="cpu")
    truth = Efficiency(bw_frac=1.0, flops_frac=1.0, step_overhead_s=0.03, per_seq_overhead_s=0.002)
    front_per_step, front_per_seq = 0.0005, 0.002

    def window(conc: int, start: int, front: bool) -> CalibrationPoint:
        steps = tuple((conc, conc * 1024.0, 0.0) for _ in range(100))
        p = CalibrationPoint(tp=1, concurrency=conc, spec_k=0, spec_method=None, acceptance_length=None,
                             context_tokens=1024, steps=steps, window_s=1.0, measured_tokps=1.0)
        busy = sum(decode_step(host, MODEL, 1, d, ctx, eff=truth).total for d, ctx, _ in steps)
        return replace(p, measured_tokps=100 * conc / busy, window_s=busy, group=f"s{start}",
                       front_cpu_s=100 * (front_per_step + front_per_seq * conc) if front else None)

    eight = CalibrationPoint(tp=1, concurrency=8, spec_k=0, spec_method=None, acceptance_length=None,
                             context_tokens=1024)
    true_eight = model_tokps(host, MODEL, eight, truth)
    for front, close in ((True, True), (False, False)):
        points = [window(c, s, front) for c in (1, 2) for s in (0, 1)]
        result = fit(points, host, MODEL, free=("step_overhead_s",))
        value, _lo, _hi = result.predict(eight)
        assert (abs(value / true_eight - 1) < 0.01) is close, (front, value, true_eight)
        if front:
            assert result.efficiency.per_seq_overhead_s == pytest.approx(0.002, rel=1e-6)
            assert result.efficiency.step_overhead_s == pytest.approx(0.03, rel=1e-3)
            assert any("measured" in n and "per_seq_overhead_s" in n for n in result.notes)
    one = fit([window(1, s, True) for s in (0, 1)], host, MODEL, free=("step_overhead_s",))
    assert one.efficiency.per_seq_overhead_s == 0.0 and not any("per_seq_overhead_s" in n for n in one.notes)
    # a GPU's front end runs beside the engine, not on its cores: not read as an engine cost
    gpu_points = [window(c, s, True) for c in (1, 2) for s in (0, 1)]
    assert fit(gpu_points, GPU, MODEL, free=("step_overhead_s",)).efficiency.per_seq_overhead_s == 0.0


def test_a_cpu_hosts_step_pays_for_each_row_on_top_of_streaming_the_weights() -> None:
    """On one CPU core the weights are streamed and the rows multiplied in one instruction stream:
    each sequence (and each verified draft token) a step adds costs 2 x active params FLOPs at the
    host's decode-row rate, on top of the weights' streaming time. A GPU's roofline hides the same
    rows under the streaming. n-gram verifies only the drafts it proposed: 4 sequences with 6 draft
    tokens between them are 10 rows, not 4 x (3 + 1)."""
    from dataclasses import replace

    host = replace(GPU, name="probed host", kind="cpu", mem_bw_Bps=40e9, bf16_flops=400e9, decode_flops=500e9,
                   sources=("measured by `truthput hardware probe`",))
    bare = Efficiency(bw_frac=1.0, flops_frac=1.0, step_overhead_s=0.0, ngram_s_per_seq=0.0)
    row = 2 * MODEL.active_params / 500e9
    one = decode_step(host, MODEL, 1, 1, 0.0, eff=bare)
    nine = decode_step(host, MODEL, 1, 9, 0.0, eff=bare)
    assert one.total == pytest.approx(MODEL.weight_bytes / 40e9 + row, rel=1e-9)
    assert nine.total - one.total == pytest.approx(8 * row, rel=1e-9)
    on_gpu = Efficiency(step_overhead_s=0.0, ngram_s_per_seq=0.0)
    assert decode_step(GPU, MODEL, 1, 9, 0.0, eff=on_gpu).total == decode_step(GPU, MODEL, 1, 1, 0.0, eff=on_gpu).total

    drafted = decode_step(host, MODEL, 1, 4, 0.0, spec_k=3, spec_method="ngram", eff=bare, draft_tokens=6)
    every = decode_step(host, MODEL, 1, 4, 0.0, spec_k=3, spec_method="ngram", eff=bare)
    assert drafted.total == pytest.approx(MODEL.weight_bytes / 40e9 + 10 * row, rel=1e-9)
    assert every.total == pytest.approx(MODEL.weight_bytes / 40e9 + 16 * row, rel=1e-9)
    # a count above k per sequence is not possible: it is held to k
    assert decode_step(host, MODEL, 1, 4, 0.0, spec_k=3, spec_method="ngram", eff=bare, draft_tokens=99).total \
        == pytest.approx(every.total, rel=1e-12)
    # a profile without a decode-row rate prices the rows at its matmul rate
    plain = replace(host, decode_flops=None)
    assert decode_step(plain, MODEL, 1, 9, 0.0, eff=bare).total - decode_step(plain, MODEL, 1, 1, 0.0, eff=bare).total \
        == pytest.approx(8 * 2 * MODEL.active_params / 400e9, rel=1e-9)


def test_the_rows_a_step_verifies_come_from_the_servers_draft_counters() -> None:
    """Draft tokens per sequence-step: the counters' draft tokens over the sequence-steps, those
    that drafted (drafts) and those that did not (emitted - drafts - accepted)."""
    from truthput.sim.runs import draft_tokens_per_step
    from truthput.measure.specdecode import SpecDeltas, spec_decode_stats

    window = spec_decode_stats(SpecDeltas(emitted=1000, drafts=300, draft_tokens=700, accepted=400), k=3,
                               method="ngram", first_tokens=None, label="window")
    assert draft_tokens_per_step(window) == pytest.approx(700 / (300 + 300))
    assert draft_tokens_per_step(None) is None
    point = CalibrationPoint(tp=1, concurrency=4, spec_k=3, spec_method="ngram", acceptance_length=1.5,
                             context_tokens=0.0, draft_tokens_per_step=1.2)
    host = get_gpu("Xeon Platinum 8480+ (1 socket)")
    bare = Efficiency(step_overhead_s=0.0, ngram_s_per_seq=0.0)
    tokps = model_tokps(host, MODEL, point, bare)
    assert tokps == pytest.approx(4 * 1.5 / decode_step(host, MODEL, 1, 4, 0.0, spec_k=3, spec_method="ngram",
                                                         eff=bare, draft_tokens=4.8).total, rel=1e-12)


def test_with_one_start_per_configuration_the_start_spread_is_read_off_the_starts_means() -> None:
    """Nothing measures the start-to-start spread model-free when each configuration ran on one
    start, so the fidelity protocol takes it from how far the starts' means sit off the fit (on a CI
    host no speculation and k=1 at one stream read +16% and -12% off it, and an assumed 2% put both
    fitted points outside their own bands). Two starts offset by +-15% with nothing fitted leave two
    degrees of freedom: the spread is 15%. One start and one constant leave none: the CV `truthput
    plan` assumes stands in."""
    import sys
    from dataclasses import replace

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from sim_fidelity import _lack_of_fit_spread

    from truthput.analyze.planning import DEFAULT_START_CV

    points = []
    for group, conc, offset in (("start-1", 1, 0.15), ("start-2", 4, -0.15)):
        p = CalibrationPoint(tp=1, concurrency=conc, spec_k=0, spec_method=None, acceptance_length=None,
                             context_tokens=1024, group=group)
        truth = model_tokps(GPU, MODEL, p, TRUE)
        points += [replace(p, measured_tokps=truth * math.exp(offset + w)) for w in (-0.01, 0.0, 0.01)]
    spread, basis = _lack_of_fit_spread(fit(points, GPU, MODEL, free=(), prior=TRUE))
    assert spread == pytest.approx(0.15, rel=1e-6)
    assert "2 degrees of freedom" in basis
    slow = [p for p in points if p.group == "start-2"]
    result = fit(slow, GPU, MODEL, free=("step_overhead_s",), prior=TRUE)
    assert result.interior == ("step_overhead_s",)
    assert _lack_of_fit_spread(result)[0] == DEFAULT_START_CV


def test_the_fidelity_benchmark_predicts_acceptance_from_training_points_only():
    """A held-out speculative configuration's acceptance predicted from the training points: at
    the same k, their mean; at a larger k, each draft token accepted with the k=1 points' chance p
    position by position (1 + p + p^2 + p^3 tokens per drafting step at k=3), drafting as often."""
    import sys
    from types import SimpleNamespace as Point

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from sim_fidelity import predict_acceptance

    train = [Point(spec_k=1, acceptance_length=1.5, draft_tokens_per_step=0.6),
             Point(spec_k=1, acceptance_length=1.7, draft_tokens_per_step=0.8),
             Point(spec_k=0, acceptance_length=None, draft_tokens_per_step=None)]
    acc, drafted, basis = predict_acceptance(train, 1)
    assert (acc, drafted) == pytest.approx((1.6, 0.7)) and basis == "training points at k=1"
    acc, drafted, basis = predict_acceptance(train, 3)
    assert acc == pytest.approx(1 + 0.6 + 0.6 ** 2 + 0.6 ** 3) and drafted == pytest.approx(3 * 0.7)
    assert "k=1 training points" in basis
    assert predict_acceptance([train[2]], 3) is None  # nothing speculative to learn from
