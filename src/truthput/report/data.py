"""The report document: ONE typed document with everything a run's reports show.

Why one document: the HTML page, the markdown, the CSV files and the JSON export all render this
document, so they cannot disagree, and the JSON export *is* the document (schema "truthput-report/1",
documented in docs/export-schema.md). Every figure keeps its provenance: figures are objects
`{"value", "unit", "source", ...}`; in a simulated run the source of every figure derived from the
simulated server is "simulator" and `read_via` keeps the mechanism (server counter, usage, ...),
so a simulated figure is never presented as a measurement.

Numbers that are not finite (NaN intervals of one-start cells) become null, so the document is
strict JSON. Every section is built by keyword from the analysis's typed results, so mypy refuses
a misspelt field (the pydantic plugin checks the models' keywords, `FigureExtra` the figures').
"""

from __future__ import annotations

import shlex
import tomllib
from datetime import datetime, timezone
from statistics import mean
from collections.abc import Sequence
from typing import Any, TypedDict

from typing_extensions import Unpack

from truthput.analyze.cells import Cell, CellFlag, source_label
from truthput.analyze.latency import latency_and_goodput
from truthput.analyze.roofline import RooflineSection, context_tokens, place_cells
from truthput.analyze.specdecode import SpecDecodeCell, spec_decode_cells
from truthput.analyze.summary import RunSummary
from truthput.report.document import (SCHEMA, AuditEntry, CellRow, ClaimEntry, ClaimsDoc, CompareDocument,
                                      CompareRow, EventEntry, ExperimentInfo, FailureRow, Figure, FlagRef,
                                      GoodputRow, GuardSummary, Hardware, LatencyRow, ModelRef, Ratio,
                                      ReportDocument, RoofCell, RooflineDoc, RunHead, RunInfo, Slo, SpecDecodeRow,
                                      TelemetryDoc, TelemetryEntry, TrialEntry, VariantInfo, VerdictSection,
                                      Versions, clean)
from truthput.store.summary import run_summary
from truthput.experiment.levels import Level, level_json, level_label
from truthput.measure.model import Flag
from truthput.store.db import Store, StoredTrial
from truthput.store.rows import RequestRow, RunRow

GPU_UTIL_NOTE = ("GPU utilisation is the share of the sample period in which any kernel ran (time busy), "
                 "not the share of the GPU's capacity in use")


class FigureExtra(TypedDict, total=False):
    """What a figure may carry besides its value, unit and source (`document.Figure`'s fields)."""

    label: str | None
    lo: float | None
    hi: float | None
    note: str | None
    interval: str | None
    n_starts: int | None
    n_trials: int | None
    position: int | None
    name: str | None
    significant: bool | None
    outcome: str | None
    level: float | None
    additive: bool | None
    detail: str | None
    flags: list[FlagRef] | None


def figure(value: float | None, unit: str, source: str, simulated: bool, **extra: Unpack[FigureExtra]) -> Figure:
    """A figure with provenance; in a simulated run the source is 'simulator' (read via `source`),
    except a model's figure (a ceiling, a bound), which no server produced. Non-finite numbers: null."""
    fields: dict[str, Any] = {k: clean(v) if not isinstance(v, list) else v for k, v in extra.items()}
    if simulated and source != "model":
        return Figure(value=clean(value), unit=unit, source="simulator", read_via=source, **fields)
    return Figure(value=clean(value), unit=unit, source=source, **fields)


def flag_refs(flags: Sequence[CellFlag | Flag]) -> list[FlagRef]:
    """A figure's or a cell's validity flags as the document keeps them."""
    return [FlagRef(code=f.code, reason=f.reason, figure=f.figure, trials=f.trials, of=f.of)
            if isinstance(f, CellFlag) else FlagRef(code=f.code, reason=f.reason) for f in flags]


def _get(d: Any, *path: str) -> Any:
    cur = d
    for key in path:
        if not isinstance(cur, dict) or key not in cur:
            return None
        cur = cur[key]
    return cur


# ---- experiment -------------------------------------------------------------------------------
def _experiment(run: RunRow) -> tuple[Any, str | None]:
    """The stored experiment parsed again (None and why when it no longer parses)."""
    from truthput.errors import TruthputError
    from truthput.experiment.file import parse_experiment

    try:
        return parse_experiment(run.experiment_toml, f"{run.experiment_path or 'stored experiment'}"), None
    except TruthputError as exc:
        return None, str(exc)
    except Exception as exc:  # a schema that changed since the run
        return None, f"stored experiment no longer parses: {exc}"


def _raw_toml(run: RunRow) -> dict[str, Any]:
    try:
        return tomllib.loads(run.experiment_toml or "")
    except tomllib.TOMLDecodeError:
        return {}


def _slo(exp: Any, raw: dict[str, Any]) -> dict[str, float | None] | None:
    """Latency targets, wherever the experiment keeps them ([slo], [workload.slo] or [measure.slo])."""
    for holder in (exp, getattr(exp, "workload", None), getattr(exp, "measure", None)):
        slo = getattr(holder, "slo", None) if holder is not None else None
        if slo is not None:
            d = slo.model_dump() if hasattr(slo, "model_dump") else dict(slo)
            if d.get("ttft_ms") is not None or d.get("itl_ms") is not None:
                return {"ttft_ms": d.get("ttft_ms"), "itl_ms": d.get("itl_ms")}
    for table in (raw.get("slo"), _get(raw, "workload", "slo"), _get(raw, "measure", "slo")):
        if isinstance(table, dict) and (table.get("ttft_ms") is not None or table.get("itl_ms") is not None):
            return {"ttft_ms": table.get("ttft_ms"), "itl_ms": table.get("itl_ms")}
    return None


def _experiment_block(store: Store, run_id: str, run: RunRow, exp: Any, exp_error: str | None) -> ExperimentInfo:
    from truthput.experiment.argv import ServerArgv, speculative_settings
    from truthput.experiment.engines import metric_family

    raw = _raw_toml(run)
    variants = []
    for v in store.variants(run_id):
        argv = v.argv
        diff = v.diff
        try:
            spec = speculative_settings(ServerArgv.parse(argv, engine=metric_family(run.engine)))
        except Exception as exc:  # a stored argv the parser no longer accepts
            spec = {"error": str(exc)}
        variants.append(VariantInfo(
            name=v.name, position=v.position, baseline=bool(v.is_baseline), argv=argv,
            diff=clean(diff.get("diff", diff)), diff_lines=diff.get("lines") or [], env=v.env,
            speculative=clean(spec),
            description=next((x.description for x in exp.variant if x.name == v.name), "") if exp else ""))
    command = list(exp.server.command) if exp else list(_get(raw, "server", "command") or [])
    hardware = exp.hardware.model_dump() if exp and exp.hardware else raw.get("hardware")
    model = exp.model.model_dump() if exp and exp.model else raw.get("model")
    slo = _slo(exp, raw)
    return ExperimentInfo(
        name=run.name, path=run.experiment_path, toml=run.experiment_toml, parse_error=exp_error,
        base_command=[str(w) for w in command], base_command_shell=shlex.join(str(w) for w in command),
        baseline=exp.experiment.baseline if exp else _get(raw, "experiment", "baseline"),
        variants=variants,
        hardware=Hardware(**clean(hardware)) if hardware is not None else None,
        model=ModelRef(**clean(model)) if model is not None else None,
        workload=clean(exp.workload.model_dump() if exp else raw.get("workload")),
        measure=clean(exp.measure.model_dump() if exp else raw.get("measure")),
        slo=Slo(**slo) if slo is not None else None)


# ---- cells ------------------------------------------------------------------------------------
HEADLINE_NOTES = {
    "server_counter": "emitted-token counter delta over the steady-state window / its wall time",
    "usage": "no server counter: running usage counts (continuous_usage_stats) of the chunks that arrived in the "
             "steady-state window / its wall time",
}


def _cells(summary: RunSummary, simulated: bool) -> list[CellRow]:
    """The summary's cells as document rows; the interval of `delta_pct` is the verdict's."""
    out = []
    for cell in summary.cells:
        row = CellRow(variant=cell.variant, **level_json(cell.level), baseline=cell.baseline, status=cell.status,
                      warnings=list(cell.warnings))
        est = cell.estimate
        if cell.ok and est is not None:
            source = cell.source
            note = " / ".join(HEADLINE_NOTES.get(x, x) for x in cell.sources)
            row.tokps = figure(est.mean, "tok/s", source, simulated, lo=est.lo, hi=est.hi,
                               interval=f"{summary.verdict.confidence:.0%} Student-t over server starts", note=note,
                               flags=flag_refs(cell.flags_on("tok/s")))
            if cell.flags_on("counter"):
                row.counter_set_aside = flag_refs(cell.flags_on("counter"))
            row.n_starts, row.n_trials = est.n_starts, est.n_trials
            row.cv_within, row.warning, row.noise = clean(est.cv_within), est.warning, list(cell.noise)
            row.per_stream = figure(cell.per_stream, "tok/s/stream", "usage", simulated,
                                    note="median over trials of per-request (tokens-1)/(last chunk - first token); "
                                         "leaves out TTFT and the gaps between requests, so at c=1 it can exceed "
                                         "the aggregate",
                                    flags=flag_refs(cell.flags_on("per stream")))
            row.ttft_p50 = figure(cell.ttft_p50, "s", "client_clock", simulated)
            row.itl_p50 = figure(cell.itl_p50, "s", "client_clock", simulated)
            for name in ("ttft", "itl", "tpot", "e2e"):
                for q in ("p50", "p90", "p99"):
                    if getattr(row, f"{name}_{q}") is None:
                        setattr(row, f"{name}_{q}", figure(cell.median_over_trials(name, q), "s", "client_clock",
                                                           simulated, note="median over the cell's trials of each "
                                                                           "trial's quantile"))
            comp = summary.comparison(cell.variant, cell.level)
            if comp is not None:
                e = comp.estimate
                row.delta_pct = figure(e.pct, "%", source, simulated, lo=e.pct_lo, hi=e.pct_hi,
                                       significant=e.significant, outcome=comp.outcome, note=e.warning,
                                       level=e.level, interval=f"the verdict's: {e.method}; {e.correction}")
        out.append(row)
    return out


# ---- requests, latency, goodput -----------------------------------------------------------------
def _record(row: RequestRow) -> Any:
    from truthput.load.records import RequestRecord

    from truthput.store.db import decode_chunks

    times, running, texts = decode_chunks(row.chunks_json)
    return RequestRecord(
        idx=row.idx, t_start=row.t_start, t_end=row.t_end or row.t_start, t_first=row.t_first,
        chunk_times=times, chunk_tokens=running, chunk_texts=texts, prompt_tokens=row.prompt_tokens,
        completion_tokens=row.completion_tokens, finish_reason=row.finish_reason, status=row.status,
        http_status=row.http_status, error=row.error)


def _latency_and_goodput(store: Store, trials: list[StoredTrial], slo: Slo | None,
                         simulated: bool) -> tuple[list[LatencyRow], list[GoodputRow] | None]:
    latency, good = latency_and_goodput(trials, lambda t: [_record(r) for r in store.requests(t.id)],
                                        slo.model_dump() if slo is not None else None)
    lat_rows = [LatencyRow(
        variant=c.variant, **level_json(c.level), ttft_ms=clean(c.ttft_ms), itl_ms=clean(c.itl_ms),
        n_requests=c.n_requests, n_failed=c.n_failed, from_results=clean(c.per_trial),
        requests_per_s=figure(c.requests_per_s, "req/s", "client_clock", simulated,
                              note="requests finished inside the window / its seconds; median over trials"),
        prompt_tps=figure(c.prompt_tps, "tok/s", "usage", simulated,
                          note="prompt tokens of requests whose first token came inside the window / "
                               "its seconds; median over trials"),
        kv_usage_max=figure(c.kv_usage_max, "fraction", "server_counter", simulated,
                            note="the server's KV-cache use gauge, highest at the window's scrapes; "
                                 "median over trials"),
        waiting_mean=figure(c.waiting_mean, "requests", "server_counter", simulated),
        waiting_max=figure(c.waiting_max, "requests", "server_counter", simulated),
        preemptions=figure(c.preemptions, "requests", "server_counter", simulated,
                           note="the server's preemption counter over the window; mean per trial"),
        source="simulator" if simulated else "client_clock",
        note=("per request, from the requests table: TTFT = first chunk - request sent; "
              "ITL = (last chunk - first chunk) / (completion tokens - 1)")) for c in latency]
    if good is None:
        return lat_rows, None
    return lat_rows, [GoodputRow(
        variant=g.variant, **level_json(g.level), slo=Slo(**g.slo),
        goodput_rps=figure(g.goodput_rps, "req/s", "client_clock", simulated),
        good_tokens_per_s=figure(g.good_tokens_per_s, "tok/s", "usage", simulated),
        good_fraction=figure(g.good_fraction, "fraction", "client_clock", simulated),
        n_trials=g.n_trials) for g in good]


# ---- spec decode ------------------------------------------------------------------------------
def _spec_decode(cells: list[SpecDecodeCell], simulated: bool) -> list[SpecDecodeRow]:
    return [SpecDecodeRow(
        variant=c.variant, **level_json(c.level), k=c.k, method=c.method, note=c.note,
        per_position=[figure(m, "ratio", "server_counter", simulated, position=p, n_trials=n)
                      for p, m, n in c.per_position],
        mean_acceptance_length=figure(c.mean_acceptance_length, "tokens/step", "server_counter", simulated,
                                      note="1 + accepted / drafts over the window, mean over trials"),
        acceptance_rate=figure(c.acceptance_rate, "ratio", "server_counter", simulated),
        n_trials=c.n_trials) for c in cells]


# ---- roofline ---------------------------------------------------------------------------------
def _roofline_section(exp_block: ExperimentInfo, summary: RunSummary, spec: list[SpecDecodeCell],
                      simulated: bool) -> RooflineSection:
    """The run's cells against the roofline (`analyze.roofline.place_cells`), from the stored
    experiment's [hardware], [model] and workload and the variants' stored argv."""
    hw, model = exp_block.hardware, exp_block.model
    model_name = (model.path or model.profile) if model else None
    if not hw or not hw.gpu or not model_name:
        return RooflineSection(False, "the experiment has no [hardware] and [model] sections, so no roofline "
                                      "(add gpu/count and a model profile or path)")
    wl = exp_block.workload or {}
    return place_cells(hw.gpu, hw.count, model_name,
                       context_tokens(wl.get("input_tokens"), wl.get("output_tokens")), summary.cells,
                       {v.name: v.argv for v in exp_block.variants},
                       {(c.variant, c.level): c.mean_acceptance_length for c in spec}, simulated)


def _roofline(section: RooflineSection, simulated: bool) -> RooflineDoc:
    if not section.available:
        return RooflineDoc(available=False, reason=section.reason)
    rows = []
    for r in section.cells:
        roof, pl = r.roof, r.placement

        def model(value: float | None, unit: str, **extra: Unpack[FigureExtra]) -> Figure:
            return figure(value, unit, "model", simulated, **extra)

        row = RoofCell(
            variant=r.variant, **level_json(r.level), tp=r.tp, kv_cache_dtype=r.kv_cache_dtype,
            kv_dtype_bytes=clean(r.kv_dtype_bytes), spec_k=r.spec_k, acceptance_length=clean(r.acceptance_length),
            measured=figure(r.measured_tokps, "tok/s", r.measured_source, simulated,
                            label=source_label(r.measured_source), flags=flag_refs(r.measured_flags)),
            tightest_ceiling=model(r.tightest_ceiling_tokps, "tok/s", name=roof.tightest_ceiling.name),
            pct_of_tightest=model(pl.fraction_of_ceiling * 100.0, "%", note="measured / tightest ceiling"),
            pct_of_weight_streaming=model(pl.fraction_of_weight_streaming * 100.0, "%"),
            measured_step_ms=model(pl.measured_step_s * 1e3, "ms/step",
                                   note="concurrency x tokens per step / measured tok/s"),
            unexplained_ms=model(pl.unexplained_step_s * 1e3, "ms/step",
                                 note="measured step - tightest ceiling's step floor"),
            bounds_ms={name: model(b.seconds_per_step * 1e3, "ms/step", additive=b.additive, detail=b.detail)
                       for name, b in roof.bounds.items()},
            weight_passes_per_s=model(roof.weight_passes_per_s, "1/s"),
            binding=pl.binding, sentence=pl.sentence, reading=r.reading,
            roofline=clean(roof.to_dict()), placement=clean(pl.to_dict()))
        if "no_spec" in roof.ceilings:
            row.no_spec_ceiling = model(roof.ceilings["no_spec"].aggregate_tokps, "tok/s", name="no_spec")
        rows.append(row)
    return RooflineDoc(
        available=True, reason=None, gpu=section.gpu, gpu_count=section.gpu_count, model=section.model,
        context_tokens=section.context_tokens, context_basis=section.context_basis, cells=rows,
        notes=section.notes,
        source_note="ceilings and bounds: source 'model' (peak datasheet figures, first-order physics), "
                    "not measurements")


# ---- failures, telemetry, trials ----------------------------------------------------------------
def _failures(store: Store, run_id: str, trials: list[StoredTrial]) -> list[FailureRow]:
    out = []
    for s in store.starts(run_id):
        if s.status != "failed" and not s.failure_class:
            continue
        excerpt = s.log_excerpt
        if not excerpt:
            excerpt = "\n".join(r.line for r in store.logs(s.id)[-30:])
        out.append(FailureRow(kind="start", variant=s.variant, start_index=s.start_index,
                              failure_class=s.failure_class, reason=s.failure_reason, line=s.failure_line,
                              log_excerpt=excerpt or "", argv=s.argv, source="log_line"))
    for t in trials:
        if not t.ok:
            out.append(FailureRow(kind="trial", variant=t.variant, start_index=t.start_index, **level_json(t.level),
                                  trial_index=t.trial_index, failure_class=(t.error or "failed").split(":", 1)[0],
                                  reason=t.error, line=None, log_excerpt="", source="client_clock"))
    return out


def _telemetry(store: Store, trials: list[StoredTrial]) -> TelemetryDoc:
    rows = store.telemetry(trials[0].run_id) if trials else []
    if not rows:
        return TelemetryDoc(available=False, note="no GPU telemetry recorded for this run", util_note=GPU_UTIL_NOTE,
                            rows=[], samples=0)
    from truthput.analyze.telemetry import gpu_cells

    def nvml(value: float | None, unit: str, **extra: Unpack[FigureExtra]) -> Figure:
        return figure(value, unit, "nvml", False, **extra)  # the GPU's own sampler, never the simulator

    out = [TelemetryEntry(variant=g.variant, **level_json(g.level), gpu=g.gpu, samples=g.samples,
                          util_pct_mean=nvml(g.util_pct_mean, "%", note="time busy, not capacity used"),
                          mem_used_gb_max=nvml(g.mem_used_gb_max, "GB"), power_w_mean=nvml(g.power_w_mean, "W"),
                          sm_clock_mhz_mean=nvml(g.sm_clock_mhz_mean, "MHz"))
           for g in gpu_cells(trials, rows)]
    return TelemetryDoc(available=True, note=None, util_note=GPU_UTIL_NOTE, rows=out, samples=len(rows))


def _trial_table(trials: list[StoredTrial], simulated: bool) -> list[TrialEntry]:
    from truthput.analyze.cells import headline, trial_warnings

    out = []
    for t in trials:
        r = t.results
        spec_w = r.spec_decode.window if r.spec_decode is not None else None
        h = headline(r)
        out.append(TrialEntry(
            trial_id=t.id, variant=t.variant, start_index=t.start_index, **level_json(t.level),
            trial_index=t.trial_index, status=t.status, error=t.error,
            t0_utc=datetime.fromtimestamp(t.t0_wall, timezone.utc).isoformat() if t.t0_wall else None,
            window_s=clean(r.window.seconds),
            headline_tokps=figure(h.number(), "tok/s", h.source, simulated, note=h.note, flags=flag_refs(h.flags)),
            counter_tokps=figure(r.throughput.counter_window.number(), "tok/s", "server_counter", simulated),
            usage_tokps=figure(r.throughput.usage_window.number(), "tok/s", "usage", simulated),
            per_stream_median=figure(r.per_stream.decode_tps_median.number(), "tok/s/stream", "usage", simulated),
            ttft_p50=figure(r.latency.ttft.at("p50"), "s", "client_clock", simulated),
            itl_p99=figure(r.latency.itl.at("p99"), "s", "client_clock", simulated),
            acceptance_length=figure(spec_w.mean_acceptance_length.number()
                                     if spec_w is not None and spec_w.mean_acceptance_length is not None else None,
                                     "tokens/step", "server_counter", simulated),
            requests_ok=r.requests.ok, requests_total=r.requests.total, integrity_holds=r.integrity.holds,
            integrity=r.integrity.message, warnings=list(r.warnings) + trial_warnings(t)))
    return out


def _claims(exp: Any, raw_trials: list[StoredTrial], roof: RooflineDoc, simulated: bool) -> ClaimsDoc:
    if exp is None or not getattr(exp, "claim", None):
        return ClaimsDoc(present=False, results=[])
    from truthput.analyze.claims import check_claims
    from truthput.experiment.claims import parse_claims

    ceilings = roof.no_spec_ceilings()
    try:
        claims = parse_claims(exp.claim)
        results = check_claims(claims, raw_trials, {"ceiling_tps": ceilings} if ceilings else None,
                               simulated=simulated)
    except Exception as exc:
        return ClaimsDoc(present=True, error=str(exc), results=[])
    return ClaimsDoc(present=True, results=[ClaimEntry(**clean(r.to_dict())) for r in results],
                     bounds_note="ceilings: roofline without speculation per concurrency (source model)")


# ---- the document -----------------------------------------------------------------------------
def build_report_data(store: Store, run_id: str, summary: RunSummary | None = None) -> ReportDocument:
    """Everything a run's reports show, as one typed document (schema truthput-report/1).
    `summary`: the run's, where the caller has it (else recomputed from the stored trials)."""
    from truthput.analyze.audit import audit_reference, audit_rows

    run_id = store.resolve_run(run_id)
    run = store.run(run_id)
    simulated = bool(run.simulated)
    exp, exp_error = _experiment(run)
    if exp is not None:
        store.apply_sim_target(run_id, exp)
    machine = run.machine
    trials = store.trial_results(run_id)
    starts = store.starts(run_id)
    engine_versions = sorted({s.engine_version for s in starts if s.engine_version})
    summary = summary or run_summary(store, run_id)
    experiment = _experiment_block(store, run_id, run, exp, exp_error)
    spec = spec_decode_cells(trials)
    roofline = _roofline(_roofline_section(experiment, summary, spec, simulated), simulated)
    latency, goodput = _latency_and_goodput(store, trials, experiment.slo, simulated)
    stored = summary.to_dict()
    audit = audit_rows(trials, simulated=simulated)
    return ReportDocument(
        schema_=SCHEMA, generated_at=datetime.now(timezone.utc).isoformat(), simulated=simulated,
        simulated_note=("SIMULATED: every figure comes from the embedded simulator (a physics model), "
                        "not from a measurement of real hardware") if simulated else None,
        run=RunInfo(id=run_id, name=run.name, status=run.status, created_at=clean(run.created_at),
                    finished_at=clean(run.finished_at), engine=run.engine, simulated=simulated, seed=run.seed,
                    experiment_path=run.experiment_path, machine=clean(machine),
                    versions=Versions(truthput=machine.get("truthput_version"), git=clean(machine.get("git")),
                                      python=machine.get("python"), engine=engine_versions)),
        experiment=experiment,
        cells=_cells(summary, simulated),
        headline=summary.headline_basis(),
        verdict=VerdictSection(
            from_=summary.origin, lines=stored["verdict_lines"],
            detail=clean(stored["verdict"]), failed=stored["failed"],
            guard={k: GuardSummary(**clean(v)) for k, v in stored["guard"].items()},
            stopping=clean(stored["stopping"])),
        warnings=summary.warnings(), flags=summary.flag_lines(),
        audit=[AuditEntry(**clean(r.to_dict())) for r in audit],
        audit_against=audit_reference(r.reference for r in audit),
        spec_decode=_spec_decode(spec, simulated), latency=latency, goodput=goodput, roofline=roofline,
        claims=_claims(exp, trials, roofline, simulated), failures=_failures(store, run_id, trials),
        telemetry=_telemetry(store, trials), trials=_trial_table(trials, simulated),
        events=[EventEntry(t_wall=e.t_wall, kind=e.kind, message=e.message) for e in store.events(run_id)])


# ---- comparing two runs -----------------------------------------------------------------------
def run_cells(store: Store, run_id: str) -> dict[tuple[str, Level], Cell]:
    """(variant, level) -> the run's cell (headline figures per server start)."""
    from truthput.analyze.cells import build_cells

    return {c.key: c for c in build_cells(store.trial_results(run_id)) if c.per_start}


def compare_runs(store_a: Store, run_a: str, store_b: Store, run_b: str,
                 confidence: float = 0.95) -> CompareDocument:
    """Cells both runs have, side by side: B / A ratio, every shared cell decided together (Holm;
    faster, slower, equivalent within +-2%, or not decided), e.g. before/after a vLLM upgrade. Server
    starts are the unit of replication; each ratio uses its two cells' own variances (Welch), since
    two runs need not share their noise."""
    from truthput.analyze.compare import compare_cells, flag_notes

    run_a, run_b = store_a.resolve_run(run_a), store_b.resolve_run(run_b)
    ra, rb = store_a.run(run_a), store_b.run(run_b)
    cells_a, cells_b = run_cells(store_a, run_a), run_cells(store_b, run_b)
    argv_a = {v.name: v.argv for v in store_a.variants(run_a)}
    argv_b = {v.name: v.argv for v in store_b.variants(run_b)}
    sim_a, sim_b = bool(ra.simulated), bool(rb.simulated)
    comparisons = compare_cells(cells_a, cells_b, confidence)
    rows = []
    for c in comparisons:
        ea, eb, r = c.a_estimate, c.b_estimate, c.ratio
        rows.append(CompareRow(
            variant=c.variant, **level_json(c.level),
            a=figure(ea.mean, "tok/s", c.a.source, sim_a, lo=ea.lo, hi=ea.hi, n_starts=ea.n_starts,
                     n_trials=ea.n_trials, flags=flag_refs(c.a.flags_on("tok/s"))),
            b=figure(eb.mean, "tok/s", c.b.source, sim_b, lo=eb.lo, hi=eb.hi, n_starts=eb.n_starts,
                     n_trials=eb.n_trials, flags=flag_refs(c.b.flags_on("tok/s"))),
            ratio=Ratio(value=clean(r.ratio), lo=clean(r.lo), hi=clean(r.hi), unit="B/A", source=c.source,
                        pct=clean(r.pct), pct_lo=clean(r.pct_lo), pct_hi=clean(r.pct_hi), p_value=clean(r.p_value),
                        significant=r.significant, method=r.method, correction=r.correction, warning=r.warning,
                        outcome=c.outcome),
            same_argv=argv_a.get(c.variant) == argv_b.get(c.variant)))
    notes = flag_notes(comparisons)
    if sim_a != sim_b:
        notes.append("one run is SIMULATED and the other is not: the ratio compares a model with a measurement")
    elif sim_a:
        notes.append("both runs are SIMULATED: no figure here is a measurement")
    only_a = sorted(set(cells_a) - set(cells_b))
    only_b = sorted(set(cells_b) - set(cells_a))
    if not comparisons:
        notes.append("the runs share no variant x level cell (same variant name and load level)")

    def head(store: Store, run_id: str, row: RunRow) -> RunHead:
        machine = row.machine
        versions = sorted({s.engine_version for s in store.starts(run_id) if s.engine_version})
        return RunHead(store=str(store.path), id=run_id, name=row.name, created_at=clean(row.created_at),
                       engine=row.engine, simulated=bool(row.simulated), engine_versions=versions,
                       truthput=machine.get("truthput_version"), host=machine.get("hostname"))

    return CompareDocument(a=head(store_a, run_a, ra), b=head(store_b, run_b, rb), rows=rows,
                           only_a=[[k[0], level_label(k[1])] for k in only_a],
                           only_b=[[k[0], level_label(k[1])] for k in only_b], notes=notes, confidence=confidence)


# ---- the roofline section on its own (terminal output of `run` / `report`) ----------------------
def roofline_for_run(store: Store, run_id: str, summary: RunSummary | None = None) -> RooflineDoc:
    """The roofline section of the report document without building the rest of it."""
    run_id = store.resolve_run(run_id)
    run = store.run(run_id)
    simulated = bool(run.simulated)
    exp, exp_error = _experiment(run)
    if exp is not None:
        store.apply_sim_target(run_id, exp)
    section = _roofline_section(_experiment_block(store, run_id, run, exp, exp_error),
                                summary or run_summary(store, run_id),
                                spec_decode_cells(store.trial_results(run_id)), simulated)
    return _roofline(section, simulated)


def roofline_lines(roof: RooflineDoc) -> list[str]:
    """Plain sentences for a terminal: one per cell, plus the notes. Ceilings are model figures."""
    if not roof.available:
        return [f"roofline: {roof.reason}"]
    out = [f"roofline ({roof.gpu_count} x {roof.gpu}, {roof.model}, {roof.context_tokens} context "
           "tokens per stream; ceilings are physics-model figures at peak datasheet numbers, not measurements):"]
    for r in roof.cells:
        m = r.measured
        kind = "SIMULATED" if m.source == "simulator" else "measured"
        flags = "".join(f" !{code}" for code in m.flag_codes)
        out.append(f"  {r.variant} {r.level}: {kind} {m.value or 0.0:.1f} tok/s [{m.label}]{flags}, "
                   f"{r.measured_step_ms.value or 0.0:.1f} ms/step; {r.reading}")
    out += [f"  note: {n}" for n in roof.notes]
    return out
