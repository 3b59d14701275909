"""Bytes per KV-cache element for each `--kv-cache-dtype` name: one table for the roofline, the
report, calibration and the simulator, so they cannot disagree about a dtype.

vLLM's names: `auto` follows the model dtype (16-bit for every profile truthput ships); the fp8
family (fp8, fp8_e4m3, fp8_e5m2, fp8_inc, fp8_ds_mla) stores one byte; `int8` is one byte too.
"""

from __future__ import annotations

KV_DTYPE_BYTES: dict[str, float] = {
    "auto": 2.0, "bf16": 2.0, "bfloat16": 2.0, "fp16": 2.0, "float16": 2.0, "half": 2.0,
    "fp8": 1.0, "fp8_e4m3": 1.0, "fp8_e5m2": 1.0, "fp8_inc": 1.0, "fp8_ds_mla": 1.0, "int8": 1.0,
    "fp32": 4.0, "float32": 4.0, "float": 4.0,
}


def kv_dtype_bytes(name: str | None, default: float = 2.0) -> float:
    """Bytes per KV element for a dtype name (`default` for names the table does not know)."""
    key = (name or "auto").strip().lower()
    if key in KV_DTYPE_BYTES:
        return KV_DTYPE_BYTES[key]
    return 1.0 if key.startswith("fp8") else default
