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
from typing import Any, TypeVar

from pydantic import BaseModel

from truthput.analyze.cells import Cell
from truthput.analyze.latency import GoodputRow, LatencyRow, latency_and_goodput
from truthput.analyze.placement import RooflineDoc, context_tokens, place_cells
from truthput.analyze.specdecode import SpecDecodeRow, spec_decode_rows
from truthput.analyze.audit import Audit, audit_of
from truthput.analyze.loadrows import LoadSummary
from truthput.analyze.summary import RunSummary, summary_of
from truthput.analyze.tables import cell_rows, trial_rows
from truthput.report.document import (SCHEMA, ClaimsDoc, CompareDocument,
                                      EventEntry, ExperimentInfo, FailureRow,
                                      ReportDocument, RunHead, RunInfo, Slo,
                                      TelemetryDoc, VariantInfo, VerdictSection,
                                      Versions, clean)
from truthput.store.summary import summary_inputs
from truthput.experiment.levels import Level, is_rate, level_json, level_label
from truthput.store.db import Store, StoredTrial
from truthput.store.rows import RequestRow, RunRow
from truthput.experiment.file import HardwareSection, ModelSection

S = TypeVar("S", bound=BaseModel)

GPU_UTIL_NOTE = ("GPU utilisation is the share of the sample period in which any kernel ran (time busy), "
                 "not the share of the GPU's capacity in use")


def _get(d: Any, *path: str) -> Any:
    cur = d
    for key in path:
        if not isinstance(cur, dict) or key not in cur:
            return None
        cur = cur[key]
    return cur


def run_summary(store: Store, run_id: str) -> RunSummary:
    """The summary every view of a stored run shows (`analyze.summary.summary_of`)."""
    return summary_of(summary_inputs(store, run_id))


def load_summary_of(store: Store, run_id: str) -> LoadSummary:
    """A stored `truthput load` run's summary: the one it stored as it ended, else (a run stored
    before load summaries) its rows rebuilt from its trials and requests."""
    from truthput.analyze.loadrows import load_row
    from truthput.load.records import client_tokens

    run_id = store.resolve_run(run_id)
    run = store.run(run_id)
    kept = LoadSummary.from_json(run.summary_json)
    if kept is not None:
        return kept
    rows = []
    for t in store.trial_results(run_id):
        records = [_record(r) for r in store.requests(t.id)]
        rows.append(load_row(float(t.level), t.results.load.mode if t.results.load else "closed", t.results, records,
                             t.status, t.error, client_tokens(records)))
    rate = any(is_rate(t.level) for t in store.trial_results(run_id))
    return LoadSummary(url=next((v.argv[0] for v in store.variants(run_id) if v.argv), ""), run_id=run_id,
                       simulated=bool(run.simulated), unit="req/s" if rate else "streams",
                       goodput=any(r.goodput_rps is not None for r in rows), levels=rows)


# ---- experiment -------------------------------------------------------------------------------
def _open_run(store: Store, run_id: str) -> tuple[str, RunRow, Any, str | None]:
    """The run's whole id, its row and its experiment (the simulator's target applied)."""
    run_id = store.resolve_run(run_id)
    return (run_id, store.run(run_id), *store.experiment(run_id))


def _raw_toml(run: RunRow) -> dict[str, Any]:
    try:
        return tomllib.loads(run.experiment_toml or "")
    except tomllib.TOMLDecodeError:
        return {}


def _slo(exp: Any, raw: dict[str, Any]) -> Slo | None:
    """The experiment's latency targets (`[slo]`; from the stored text where it no longer parses);
    None where it sets none."""
    section = exp.slo.model_dump() if exp is not None and exp.slo is not None else raw.get("slo")
    if not isinstance(section, dict):
        return None
    slo = Slo(**{k: section.get(k) for k in Slo.model_fields})
    return slo if slo.text() else None


def _section(model: type[S], table: Any) -> S | None:
    """A section of a stored experiment that no longer parses whole, where it still validates alone."""
    from pydantic import ValidationError

    try:
        return model.model_validate(table) if isinstance(table, dict) else None
    except ValidationError:
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
    hardware = exp.hardware if exp else _section(HardwareSection, raw.get("hardware"))
    model = exp.model if exp else _section(ModelSection, raw.get("model"))
    slo = _slo(exp, raw)
    return ExperimentInfo(
        name=run.name, path=run.experiment_path, toml=run.experiment_toml, parse_error=exp_error,
        base_command=[str(w) for w in command], base_command_shell=shlex.join(str(w) for w in command),
        baseline=exp.experiment.baseline if exp else _get(raw, "experiment", "baseline"),
        variants=variants,
        hardware=hardware, model=model,
        workload=clean(exp.workload.model_dump() if exp else raw.get("workload")),
        workload_shares=workload_shares(exp),
        measure=clean(exp.measure.model_dump() if exp else raw.get("measure")),
        slo=slo)


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
    return latency_and_goodput(trials, lambda t: [_record(r) for r in store.requests(t.id)], slo, simulated)


# ---- roofline ---------------------------------------------------------------------------------
def _roofline(exp_block: ExperimentInfo, summary: RunSummary, spec: list[SpecDecodeRow],
              simulated: bool) -> RooflineDoc:
    """The run's cells against the roofline (`analyze.placement.place_cells`), from the stored
    experiment's [hardware], [model] and workload and the variants' stored argv."""
    hw, model = exp_block.hardware, exp_block.model
    model_name = (model.path or model.profile) if model else None
    if not hw or not hw.gpu or not model_name:
        return RooflineDoc(available=False, reason="the experiment has no [hardware] and [model] sections, so no "
                                                   "roofline (add gpu/count and a model profile or path)")
    wl = exp_block.workload or {}
    return place_cells(hw.gpu, hw.count, model_name,
                       context_tokens(wl.get("input_tokens"), wl.get("output_tokens")), summary.cells,
                       {v.name: v.argv for v in exp_block.variants},
                       {(c.variant, c.key): c.mean_acceptance_length.value for c in spec}, simulated)


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
    from truthput.analyze.telemetry import telemetry_rows

    return TelemetryDoc(available=True, note=None, util_note=GPU_UTIL_NOTE, rows=telemetry_rows(trials, rows),
                        samples=len(rows))


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
    return ClaimsDoc(present=True, results=results,
                     bounds_note="ceilings: roofline without speculation per concurrency (source model)")


# ---- the document -----------------------------------------------------------------------------
def build_report_data(store: Store, run_id: str, summary: RunSummary | None = None,
                      audit: Audit | None = None) -> ReportDocument:
    """Everything a run's reports show, as one typed document (schema truthput-report/1).
    `summary`, `audit`: the run's, where the caller has them (else made from the stored trials)."""

    run_id, run, exp, exp_error = _open_run(store, run_id)
    simulated = bool(run.simulated)
    machine = run.machine
    trials = store.trial_results(run_id)
    starts = store.starts(run_id)
    engine_versions = sorted({s.engine_version for s in starts if s.engine_version})
    summary = summary or run_summary(store, run_id)
    experiment = _experiment_block(store, run_id, run, exp, exp_error)
    spec = spec_decode_rows(trials, simulated)
    roofline = _roofline(experiment, summary, spec, simulated)
    latency, goodput = _latency_and_goodput(store, trials, experiment.slo, simulated)
    audit = audit or audit_of(trials, simulated)
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
        cells=cell_rows(summary, simulated),
        headline=summary.headline_basis(),
        verdict=VerdictSection(from_=summary.origin, lines=summary.verdict.lines(), detail=summary.verdict,
                               failed=summary.failed, guard=summary.guard, stopping=summary.stopping),
        warnings=summary.warnings(), flags=summary.flag_lines(),
        audit=audit.rows,
        audit_against=audit.against,
        spec_decode=spec, latency=latency, goodput=goodput, roofline=roofline,
        claims=_claims(exp, trials, roofline, simulated), failures=_failures(store, run_id, trials),
        telemetry=_telemetry(store, trials), trials=trial_rows(trials, simulated),
        events=[EventEntry(t_wall=e.t_wall, kind=e.kind, message=e.message) for e in store.events(run_id)])


# ---- comparing two runs -----------------------------------------------------------------------
def run_cells(store: Store, run_id: str) -> dict[tuple[str, Level], Cell]:
    """(variant, level) -> the run's cell (headline figures per server start)."""
    from truthput.analyze.cells import build_cells

    return {c.key: c for c in build_cells(store.trial_results(run_id)) if c.per_start}


def compare_runs(store_a: Store, run_a: str, store_b: Store, run_b: str,
                 confidence: float = 0.95) -> CompareDocument:
    """Cells both runs have, side by side: B / A ratio, every shared cell decided together (Hochberg;
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
    rows = compare_cells(cells_a, cells_b, confidence, (sim_a, sim_b),
                         lambda variant: argv_a.get(variant) == argv_b.get(variant))
    notes = flag_notes(rows)
    if sim_a != sim_b:
        notes.append("one run is SIMULATED and the other is not: the ratio compares a model with a measurement")
    elif sim_a:
        notes.append("both runs are SIMULATED: no figure here is a measurement")
    only_a = sorted(set(cells_a) - set(cells_b))
    only_b = sorted(set(cells_b) - set(cells_a))
    if not rows:
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
    run_id, run, exp, exp_error = _open_run(store, run_id)
    simulated = bool(run.simulated)
    return _roofline(_experiment_block(store, run_id, run, exp, exp_error), summary or run_summary(store, run_id),
                     spec_decode_rows(store.trial_results(run_id), simulated), simulated)


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


def workload_shares(exp: Any) -> str | None:
    """What the experiment's workload shares by design (None: no experiment, or a file that is gone)."""
    if exp is None:
        return None
    from truthput.errors import InputError
    from truthput.load.workload import Workload

    try:
        return Workload.of_experiment(exp, 0).sharing()
    except InputError:
        return None
