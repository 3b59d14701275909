"""A run's cells placed against the roofline: each ok closed-loop cell's headline figure against the
ceilings of its variant's configuration (`analyze.roofline`), as the report's roofline section.

The measured figure keeps its own source and flags; every ceiling, bound and share is a model figure
(source "model"), never a measurement."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import Field

from truthput.analyze.cells import Cell, source_label
from truthput.analyze.roofline import Placement, Roofline, place, roofline
from truthput.analyze.rows import DocModel, Figure, FigureExtra, LevelRow, clean, figure, flag_refs
from truthput.errors import InputError
from truthput.experiment.levels import Level, level_json

from typing_extensions import Unpack

OPEN_LOOP_NOTE = ("open-loop levels are not placed against the roofline: their streams are what the server made "
                  "of the offered rate, not a setting")
SOURCE_NOTE = "ceilings and bounds: source 'model' (peak datasheet figures, first-order physics), not measurements"


class RoofCell(LevelRow):
    """One cell's headline figure (its own source and flags) against its configuration's roofline."""

    variant: str
    tp: int
    kv_cache_dtype: str
    kv_dtype_bytes: float
    spec_k: int
    acceptance_length: float | None
    measured: Figure
    tightest_ceiling: Figure
    no_spec_ceiling: Figure | None = None
    pct_of_tightest: Figure
    pct_of_weight_streaming: Figure
    measured_step_ms: Figure
    unexplained_ms: Figure
    bounds_ms: dict[str, Figure]
    weight_passes_per_s: Figure
    binding: str | None
    sentence: str
    reading: str
    roofline: dict[str, Any]
    placement: dict[str, Any]


class RooflineDoc(DocModel):
    available: bool
    reason: str | None = None
    gpu: str | None = None
    gpu_count: int | None = None
    model: str | None = None
    context_tokens: int | None = None
    context_basis: str | None = None
    cells: list[RoofCell] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
    source_note: str | None = None

    def no_spec_ceilings(self) -> dict[int, float]:
        """Per concurrency, the aggregate ceiling without speculation (what check-claims bounds by)."""
        return {r.concurrency: float(r.no_spec_ceiling.value) for r in self.cells
                if r.concurrency is not None and r.no_spec_ceiling is not None and r.no_spec_ceiling.value is not None}


def _roof_cell(c: Cell, tp: int, kv_text: str, k: int, acc: float | None, roof: Roofline, pl: Placement,
               simulated: bool) -> RoofCell:
    from truthput.hardware.dtypes import kv_dtype_bytes

    def model(value: float | None, unit: str, **extra: Unpack[FigureExtra]) -> Figure:
        return figure(value, unit, "model", simulated, **extra)

    assert c.estimate is not None and c.estimate.mean is not None
    tight = roof.tightest_ceiling
    tightest_tokps = roof.concurrency * pl.tokens_per_step_per_stream / tight.step_floor_s
    row = RoofCell(
        variant=c.variant, **level_json(c.level), tp=tp, kv_cache_dtype=kv_text,
        kv_dtype_bytes=clean(kv_dtype_bytes(kv_text)), spec_k=k, acceptance_length=clean(acc),
        measured=figure(float(c.estimate.mean), "tok/s", c.source, simulated, label=source_label(c.source),
                        flags=flag_refs(c.flags_on("tok/s"))),
        tightest_ceiling=model(tightest_tokps, "tok/s", name=tight.name),
        pct_of_tightest=model(pl.fraction_of_ceiling * 100.0, "%", note="measured / tightest ceiling"),
        pct_of_weight_streaming=model(pl.fraction_of_weight_streaming * 100.0, "%"),
        measured_step_ms=model(pl.measured_step_s * 1e3, "ms/step",
                               note="concurrency x tokens per step / measured tok/s"),
        unexplained_ms=model(pl.unexplained_step_s * 1e3, "ms/step",
                             note="measured step - tightest ceiling's step floor"),
        bounds_ms={name: model(b.seconds_per_step * 1e3, "ms/step", additive=b.additive, detail=b.detail)
                   for name, b in roof.bounds.items()},
        weight_passes_per_s=model(roof.weight_passes_per_s, "1/s"),
        binding=pl.binding, sentence=pl.sentence, reading=pl.sentence.partition(" — candidates: ")[0],
        roofline=clean(roof.to_dict()), placement=clean(pl.to_dict()))
    if "no_spec" in roof.ceilings:
        row.no_spec_ceiling = model(roof.ceilings["no_spec"].aggregate_tokps, "tok/s", name="no_spec")
    return row


def context_tokens(input_tokens: Any, output_tokens: Any) -> tuple[int, str]:
    """Mean context a stream holds during decode: prompt + half the output (what is known of it:
    a length, or a distribution's mean/value/max)."""
    def size(x: Any, default: int) -> float:
        if isinstance(x, (int, float)):
            return float(x)
        if isinstance(x, dict):
            for k in ("mean", "value", "max", "tokens"):
                if isinstance(x.get(k), (int, float)):
                    return float(x[k])
        return float(default)

    inp, out = size(input_tokens, 256), size(output_tokens, 256)
    return int(inp + out / 2), f"input {inp:g} + output {out:g} / 2 (mean context during decode)"


def place_cells(gpu_name: str, gpu_count: int | None, model_ref: str, context: tuple[int, str],
                cells: Sequence[Cell], argv_by_variant: Mapping[str, Sequence[str]],
                acceptance: Mapping[tuple[str, Level], float | None], simulated: bool) -> RooflineDoc:
    """Every ok closed-loop cell's headline figure against the roofline of its variant's argv (TP,
    KV-cache dtype, speculation read as the server reads them); open-loop cells are left out, said."""
    from truthput.experiment.argv import ServerArgv, speculative_settings, whole_number
    from truthput.hardware.dtypes import kv_dtype_bytes
    from truthput.hardware.gpus import get_gpu
    from truthput.hardware.models import get_model

    try:
        gpu = get_gpu(gpu_name)
        profile = get_model(model_ref)
    except Exception as exc:
        return RooflineDoc(available=False, reason=f"roofline inputs: {exc}")
    rows: list[RoofCell] = []
    notes: list[str] = []
    for c in cells:
        if not c.ok or c.estimate is None or not c.estimate.mean:
            continue
        if c.concurrency is None:
            if OPEN_LOOP_NOTE not in notes:
                notes.append(OPEN_LOOP_NOTE)
            continue
        words = list(argv_by_variant.get(c.variant) or [])
        argv = ServerArgv.parse(words) if words else None
        tp_text = argv.get("--tensor-parallel-size") if argv else None
        tp = (whole_number(tp_text) or 1) if isinstance(tp_text, str) else 1
        kv_text = str((argv.get("--kv-cache-dtype") if argv else None) or "auto").lower()
        try:
            spec = (speculative_settings(argv) if argv else None) or {}
        except InputError:
            spec = {}
        k = int(spec.get("num_speculative_tokens") or 0)
        acc = acceptance.get(c.key) if k else None
        if acc is not None and not 1.0 <= acc <= k + 1:
            notes.append(f"{c.variant} {c.label}: measured acceptance length {acc:.3f} outside [1, {k + 1}]; "
                         "the ceiling uses k+1")
            acc = None
        source = c.source
        try:
            roof = roofline(gpu, profile, tp, kv_dtype_bytes(kv_text), context[0], c.concurrency, k, acc)
            pl = place(roof, float(c.estimate.mean), acc, measured_source="simulator" if simulated else source,
                       model_bits=getattr(profile, "bits_per_weight", None))
        except Exception as exc:
            notes.append(f"{c.variant} {c.label}: {exc}")
            continue
        if gpu_count and int(gpu_count) != tp:
            notes.append(f"{c.variant}: [hardware].count = {gpu_count} but TP = {tp}; one TP replica modelled")
        rows.append(_roof_cell(c, tp, kv_text, k, acc, roof, pl, simulated))
    candidates = sorted({r.sentence.partition(" — candidates: ")[2] for r in rows} - {""})
    if candidates:
        notes.append("where no modelled resource binds, candidates for the rest of the step: " + "; ".join(candidates))
    return RooflineDoc(available=bool(rows), reason=None if rows else "no cell could be placed", gpu=gpu.name,
                       gpu_count=gpu_count, model=profile.name, context_tokens=context[0], context_basis=context[1],
                       cells=rows, notes=notes, source_note=SOURCE_NOTE)
