"""A worked example of calibration, on the figures of the case in `shared/seed` (Qwen3.6-27B 5.5-bit
on 2x RTX 3090, TP=2, MTP spec-tokens 1, KV fp8): fit the model on the measured 1-stream counter
figure, predict 8 streams, compare with the measured 8-stream figure, and say what each constant
alone would have to be to explain the gap.

The two tok/s figures are that user's measurements (server counter, whole-run deltas); the
acceptance length and context are assumptions the notes did not record. Everything printed
besides them is a model figure. Run: python examples/calibrate_seed_case.py
"""

from __future__ import annotations

from dataclasses import replace

from truthput.sim.calibrate import CalibrationPoint, explain_misfit, fit

MEASURED_1_STREAM = 66.9  # tok/s, server counter, the seed case's notes
MEASURED_8_STREAMS = 339.9  # tok/s, server counter, the seed case's notes
ACCEPTANCE_LENGTH = 1.95  # assumption: MTP k=1 on chat text
CONTEXT = 2048  # assumption: mean context per stream


def main() -> None:
    one = CalibrationPoint(tp=2, concurrency=1, spec_k=1, spec_method="qwen3_5_mtp", acceptance_length=ACCEPTANCE_LENGTH,
                           context_tokens=CONTEXT, measured_tokps=MEASURED_1_STREAM, kv_dtype_bytes=1.0)
    eight = replace(one, concurrency=8, measured_tokps=MEASURED_8_STREAMS)
    result = fit([one], "RTX 3090", "qwen3.6-27b-5.5bit")
    value, lo, hi = result.predict(eight)
    print(f"fitted on {MEASURED_1_STREAM} tok/s at 1 stream: {', '.join(result.fitted)} "
          f"= {result.efficiency.step_overhead_s * 1e3:.1f} ms/step [model]")
    print(f"predicted at 8 streams: {value:.0f} tok/s (95% band {lo:.0f}-{hi:.0f}) [model]; "
          f"measured: {MEASURED_8_STREAMS} tok/s [server counter] ({MEASURED_8_STREAMS / value:.0%} of the prediction)")
    print("what would have to change, each alone, refitted through both points [model]:")
    for line in explain_misfit(result, one, eight):
        print(f"  - {line}")


if __name__ == "__main__":
    main()
