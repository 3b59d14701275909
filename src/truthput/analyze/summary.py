"""A run's summary: its cells, the verdict (every comparison's one interval), failures, the guard.

Computed from the trials once per look of the stopping rule (`summarize`); the last look's is the
run's and is stored once, typed and schema-versioned (`StoredSummary`, `SUMMARY_SCHEMA`), when the
run ends. Every later view (the terminal table, `truthput report`, the report document, `runs`,
`unit`) reads that record back and rebuilds only the cells' figures from the trials, so each view's
interval and verdict are the ones the run decided. The comparison is computed here, at the level
the design calls for (Hochberg over the family, plus the look's share of a sequential stopping rule).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from truthput.analyze.cells import Cell, HeadlineBasis, TrialLike, build_cells, headline_basis, metric_groups
from truthput.analyze.guard import GuardResult, compare_outputs
from truthput.analyze.values import StartValues, decide, start_values, stopping_rule
from truthput.analyze.verdict import Caution, ComparisonVerdict, FlaggedArm, Verdict
from truthput.experiment.file import MeasureSection
from truthput.experiment.levels import Level, level_label

SUMMARY_SCHEMA = 3
"""The version of `StoredSummary` a run keeps in `runs.summary_json`; a stored summary of another
version (or none: a run stored before schema 2; schema 2 kept each comparison's line as patched text) is
recomputed from the trials instead."""


@dataclass
class RunSummary:
    cells: list[Cell]
    verdict: Verdict
    failed: dict[str, str]
    guard: dict[str, GuardResult] = field(default_factory=dict)
    guard_texts: dict[str, list[str]] = field(default_factory=dict)
    stopping: StoppingInfo | None = None
    values: list[StartValues] = field(default_factory=list)
    """The per-start values the verdict was decided from (`truthput decide` recomputes it)."""
    origin: str = "computed from the trials (truthput.analyze.summary)"
    """Where this summary's verdict comes from: computed now, or the run's stored record."""
    before_load: list[str] = field(default_factory=list)
    """What a server truthput does not own did before any load (another client's traffic), per start."""

    def comparison(self, variant: str, level: Level, metric: str = "tok/s") -> ComparisonVerdict | None:
        """The verdict's comparison of `variant` with the baseline at `level` on `metric`."""
        for cv in self.verdict.per_concurrency:
            if cv.level == level and cv.metric == metric:
                return next((c for c in cv.comparisons if c.variant == variant), None)
        return None

    def said_of(self, variant: str | None, where: str = "") -> tuple[str, list[str]]:
        """(the variant a user means, what the verdict said against it): the one winner when none is
        named (else ValueError listing the winners), and a warning for a variant never measured, or
        decided slower than another at some level (than the baseline; for the baseline itself, than a
        variant decided faster)."""
        from truthput.experiment.levels import level_label

        winners = self.verdict.winners()
        if variant is None:
            if len(winners) != 1:
                said = "; ".join(f"{w} at {', '.join(map(level_label, lv))}" for w, lv in winners.items())
                raise ValueError(f"the verdict names {said or 'no winner at any level'}")
            variant = next(iter(winners))
        warnings: list[str] = []
        if variant not in {c.variant for c in self.cells if c.per_start}:
            why = self.failed.get(variant, "no trial of it succeeded")
            warnings.append(f"{variant} was never measured{where} ({why}): this unit is untested")
        for cv in self.verdict.per_concurrency:
            for c in cv.comparisons:
                if c.metric != "tok/s":
                    continue
                if c.variant == variant and c.outcome == "slower":
                    warnings.append(f"the verdict decided {variant} {abs(c.estimate.pct):.0f}% slower than "
                                    f"{cv.baseline} at {level_label(cv.level)}")
                elif cv.baseline == variant and c.outcome == "faster":
                    warnings.append(f"the verdict decided {c.variant} {abs(c.estimate.pct):.0f}% faster than "
                                    f"{variant} at {level_label(cv.level)}")
        return variant, warnings

    def headline_basis(self) -> HeadlineBasis:
        """What the cells' tok/s are (their sources): every view's header and footnote say it."""
        return headline_basis(c.source for c in self.cells if c.per_start)

    def flag_lines(self) -> list[str]:
        """One line per validity flag on a cell's figures: where, which figure, why, how often."""
        return [f"{c.variant} {c.label}: {f.text()}" for c in self.cells for f in c.flags]

    def warnings(self) -> list[str]:
        """What the server did before the load, then every trial warning of the run (each names its trial)."""
        return [*self.before_load, *(w for c in self.cells for w in c.warnings)]

    def measured_nothing(self) -> list[str] | None:
        """Where no cell has a figure: one paragraph (why, per variant, and what to try) in place of
        tables of empty cells; None where anything was measured."""
        if any(c.ok for c in self.cells) or not (self.cells or self.failed):
            return None  # something measured, or nothing ran yet
        out = ["nothing was measured: no variant produced a throughput figure, so there is nothing to show or "
               "compare. The first reason of each variant:"]
        # variants whose servers never started have no cell at all, only their failure
        for variant in dict.fromkeys([*(c.variant for c in self.cells), *self.failed]):
            why = self.failed.get(variant) or next(
                (w for c in self.cells if c.variant == variant for w in c.warnings), "no trial finished")
            out.append(f"  {variant}: {why if len(why) <= 420 else why[:417] + '...'}")
        out.append("What to try: a server that refused every request (HTTP 4xx) disagrees with the workload "
                   "(e.g. a context length below input + output tokens); one that did not start has its log "
                   "excerpt in `truthput report RUN --json` (failures); `truthput load URL` against one server "
                   "started by hand shows in seconds whether it answers at all.")
        return out

    def stored(self) -> StoredSummary:
        """What the run keeps of this summary: the decision and what it was decided from."""
        return StoredSummary(SUMMARY_SCHEMA, self.verdict, self.failed, self.guard, self.guard_texts,
                             self.stopping, self.values)


@dataclasses.dataclass
class StoppingInfo:
    """How the stopping rule ran: its method, the starts it used, its first and last look, and
    the starts a fixed design would have needed for the same precision (where that could be sized)."""

    method: str
    starts_used: int | None
    first_look: int
    max_starts: int
    fixed_design_starts: int | None = None
    fixed_design_note: str | None = None


@dataclasses.dataclass
class StoredSummary:
    """A run's summary as stored once when the run ends (`runs.summary_json`), typed: the verdict
    with its comparisons and flags, the failures, the guard (with its texts, so a resumed run
    compares new outputs with the same baseline), the stopping record and the per-start values."""

    __pydantic_config__ = {"ser_json_inf_nan": "strings"}  # NaN estimates stay NaN (as "NaN": strict JSON)

    schema: int
    verdict: Verdict
    failed: dict[str, str]
    guard: dict[str, GuardResult]
    guard_texts: dict[str, list[str]]
    stopping: StoppingInfo | None
    values: list[StartValues]

    def to_json(self) -> str:
        return str(_stored_adapter().dump_json(self).decode())

    @staticmethod
    def from_json(text: str | None) -> StoredSummary | None:
        """The stored record, or None when there is none or it has another schema (recompute)."""
        import json

        if not text:
            return None
        if json.loads(text).get("schema") != SUMMARY_SCHEMA:
            return None
        record: StoredSummary = _stored_adapter().validate_json(text)
        return record

    def summary(self, cells: list[Cell]) -> RunSummary:
        """The run's summary: this decision, with the cells rebuilt from the run's trials."""
        return RunSummary(cells=cells, verdict=self.verdict, failed=self.failed, guard=self.guard,
                          guard_texts=self.guard_texts, stopping=self.stopping, values=self.values,
                          origin=f"stored when the run ended (summary schema {self.schema}); cells from the trials")


@dataclass
class SummaryInputs:
    """What a run's summary is decided from, as the store holds it (`store.summary.summary_inputs`)."""

    trials: Sequence[TrialLike]
    variants: list[str]
    failed: dict[str, str]
    """Variant -> why its server starts failed."""
    baseline: str
    measure: MeasureSection
    simulated: bool
    guard_texts: dict[str, list[str]]
    placements: dict[int, dict[str, Any]]
    """Start id -> where a cluster executor ran it (empty: this machine)."""
    record: str | None = None
    """The summary the run stored when it ended (JSON), if any."""
    prompt_source: str = "synthetic"
    """Where the run's prompts came from (`[workload] prompt_source`)."""
    compares: bool = True
    """False for a `truthput load` run: one server measured, nothing compared, so no verdict."""
    cache_changes: dict[str, list[str]] = field(default_factory=dict)
    """Variant -> the settings it changes that set what the prefix cache holds (`experiment.cache`)."""
    before_load: list[str] = field(default_factory=list)
    """Another client's traffic seen before any load (the run's `other_traffic` events)."""


def summary_of(given: SummaryInputs, *, fresh: bool = False) -> RunSummary:
    """The one summary of a stored run (`_summary_of`), with what the server did before the load."""
    summary = _summary_of(given, fresh=fresh)
    summary.before_load = list(given.before_load)
    return summary


def _summary_of(given: SummaryInputs, *, fresh: bool = False) -> RunSummary:
    """The one summary of a stored run: the decision it stored when it ended, where it has one of
    the current schema, with its cells rebuilt from the trials; else decided from the trials now
    (`fresh`: always, as the run loop does at each look). A `load` run's cells, and no verdict."""
    if not given.compares:
        cells = build_cells(given.trials, given.variants, given.baseline, given.failed)
        return RunSummary(cells=cells, verdict=Verdict([], dict(given.failed), [], simulated=given.simulated),
                          failed=dict(given.failed), origin="a load run: one server measured, nothing compared")
    record = None if fresh else StoredSummary.from_json(given.record)
    if record is not None:
        return record.summary(build_cells(given.trials, given.variants, given.baseline, record.failed))
    return summarize(given.trials, given.variants, given.failed, given.baseline, given.measure, given.simulated,
                     given.guard_texts, placements=given.placements or None, prompt_source=given.prompt_source,
                     cache_changes=given.cache_changes)


def _stored_adapter() -> Any:
    from pydantic import TypeAdapter

    return TypeAdapter(StoredSummary)


def _mark_flagged(verdict: Verdict, cells: list[Cell], baseline: str) -> None:
    """A comparison resting on a flagged figure carries the flags of both arms (its line says so)."""
    by_key = {c.key: c for c in cells}
    for cv in verdict.per_concurrency:
        if cv.metric != "tok/s":
            continue
        for comp in cv.comparisons:
            for name in (comp.variant, baseline):
                cell = by_key.get((name, cv.level))
                if cell is not None:
                    comp.flagged += [FlaggedArm(name, f.code) for f in cell.flags_on("tok/s")]


SYNTHETIC_TEXT = ("speculation judged on text truthput generated ({source}): how much of a draft is accepted "
                  "depends on the text, so this speed-up may not carry over to real prompts; measure it on real "
                  "text: prompt_source = \"sharegpt\" (the bundled sample), a JSONL of your own prompts, or a trace")


def _speculates(cell: Cell | None) -> int:
    """The draft length the cell's trials ran with (0: no speculation), as their counters say."""
    ks = [t.results.spec_decode.k or 0 for t in cell.trials if t.results.spec_decode is not None] if cell else []
    return max(ks, default=0)


def _caution_generated_text(verdict: Verdict, cells: list[Cell], baseline: str, prompt_source: str) -> None:
    """A comparison whose arms speculate differently, measured on generated text, says its outcome
    may not carry over (`synthetic_text`); whichever arm speculates."""
    from truthput.load.workload import is_generated_text

    if not is_generated_text(prompt_source):
        return
    by_key = {c.key: c for c in cells}
    said = SYNTHETIC_TEXT.format(source=prompt_source)
    for cv in verdict.per_concurrency:
        for comp in cv.comparisons:
            if _speculates(by_key.get((comp.variant, cv.level))) != _speculates(by_key.get((baseline, cv.level))):
                comp.cautions.append(Caution("synthetic_text", said))
    if any(c.cautions for c in verdict.comparisons()):
        verdict.notes.append(f"!synthetic_text: {said}")


CACHE_STATE_POINTS = 0.03
"""Prefix-cache hit rates of two arms further apart than this (and than three standard errors of
their per-start means, with two starts or more an arm) are different cache states."""


def start_hit_rates(cell: Cell | None) -> list[float]:
    """The cell's prefix-cache hit rate per server start (the mean of its ok trials' windows)."""
    by_start: dict[tuple[int, int], list[float]] = {}
    for t in cell.trials if cell is not None else []:
        fig = t.results.server_samples.prefix_cache_hit_rate
        v = fig.number() if fig is not None and t.status == "ok" else None
        if v is not None:
            by_start.setdefault((t.start_index, int(getattr(t, "start_id", None) or -1)), []).append(v)
    return [sum(v) / len(v) for v in by_start.values()]


def cache_state_differs(a: Sequence[float], b: Sequence[float]) -> bool:
    """Whether two arms' per-start hit rates differ beyond what their spread allows."""
    if not a or not b:
        return False
    ma, mb = sum(a) / len(a), sum(b) / len(b)
    if abs(ma - mb) <= CACHE_STATE_POINTS:
        return False
    if len(a) < 2 or len(b) < 2:
        return True

    def var(x: Sequence[float], m: float) -> float:
        return sum((v - m) ** 2 for v in x) / (len(x) - 1)

    return bool(abs(ma - mb) > 3 * (var(a, ma) / len(a) + var(b, mb) / len(b)) ** 0.5)


def _caution_cache_state(verdict: Verdict, cells: list[Cell], baseline: str,
                         changes: Mapping[str, list[str]]) -> None:
    """A comparison whose arms ran at different prefix-cache hit rates says so (`cache_state_differs`):
    part of the effect where the variant changes what the cache holds (the settings named), a doubt
    where it does not. Symmetric in the arms: the same test whichever is the baseline."""
    by_key = {c.key: c for c in cells}
    said_any = []
    for cv in verdict.per_concurrency:
        base = start_hit_rates(by_key.get((baseline, cv.level)))
        for comp in cv.comparisons:
            mine = start_hit_rates(by_key.get((comp.variant, cv.level)))
            if not cache_state_differs(base, mine):
                continue
            # the figures every view shows for these cells (`hit_rate_of`), not the test's per-start means
            shown = [by_key[(v, cv.level)].prefix_cache_hit_rate()[0] for v in (baseline, comp.variant)]
            rates = f"prefix-cache hit rate {baseline} {shown[0] or 0:.0%}, {comp.variant} {shown[1] or 0:.0%}"
            named = changes.get(comp.variant) or []
            said = (f"the arms ran at different cache states ({rates}): part of the effect, since {comp.variant} "
                    f"changes {', '.join(named)}, which sets what the prefix cache holds" if named else
                    f"the arms ran at different cache states ({rates}) though {comp.variant} changes nothing the "
                    "cache depends on: part of the difference may be the cache's, not the setting's (a warm-up, "
                    "a re-sent row, another client); [workload] cache = \"reset\" starts each window cold")
            comp.cautions.append(Caution("cache_state_differs", said))
            said_any.append(f"{comp.variant} {level_label(cv.level)}: {said}")
    verdict.notes += [f"!cache_state_differs: {s}" for s in dict.fromkeys(said_any)]


def _block_by_node(cells: list[Cell], values: dict[Any, Any], extra: dict[Any, Any],
                   placements: Mapping[int, Mapping[str, Any]]) -> Any:
    from truthput.analyze.blocks import NodeBlocks, remove_node_effects

    node_of = {sid: str(p.get("node_id") or p.get("node")) for sid, p in placements.items()}
    used = {sid for c in cells for sid in c.servers("tok/s")}
    classes = sorted({str(placements[s].get("hardware_class")) for s in used if s in placements})

    def labels(metric: str, keys: Any) -> dict[Any, list[str | None]]:
        return {c.key: [node_of.get(s) for s in c.servers(metric)] for c in cells if c.key in keys}

    values, factors, tests = remove_node_effects(values, labels("tok/s", values))
    extra = {m: (remove_node_effects(v, labels(m, v))[0], r) for m, (v, r) in extra.items()}
    return values, extra, NodeBlocks(len({node_of[s] for s in used if s in node_of}), classes, factors,
                                     [f"tok/s {t}" for t in tests])


def summarize(trials: Sequence[TrialLike], variants: Sequence[str], failed: Mapping[str, str], baseline: str,
              measure: MeasureSection, simulated: bool,
              guard_texts: Mapping[str, list[str]] | None = None,
              placements: Mapping[int, Mapping[str, Any]] | None = None,
              prompt_source: str = "synthetic", cache_changes: Mapping[str, list[str]] | None = None) -> RunSummary:
    """Cells, verdict and guard of a run from its trials (`failed`: variant -> why it failed).
    `placements` (start id -> where a cluster executor ran it): the verdict says how many nodes
    and hardware classes it rests on, and with several nodes the node is taken as a block."""
    failed = dict(failed)
    cells = build_cells(trials, variants, baseline, failed)
    texts = dict(guard_texts or {})
    guard: dict[str, GuardResult] = {}
    if baseline in texts:
        guard = {name: compare_outputs(texts[baseline], t) for name, t in texts.items() if name != baseline}
    m = measure
    rule = stopping_rule(m)
    values, rounds = metric_groups(cells, "tok/s")
    # a figure known to be wrong never decides a comparison: its cell is left out, and the verdict says why
    wrong = {c.key: c for c in cells if c.wrong and c.key in values}
    values = {k: v for k, v in values.items() if k not in wrong}
    rounds = {k: v for k, v in rounds.items() if k not in wrong}
    extra = {k: metric_groups(cells, k) for k in m.verdicts if k != "tok/s"}
    look, stopping = None, None
    if rule is not None:
        from truthput.analyze.stopping import fixed_design_starts

        look = max((len(v) for v in values.values()), default=None)
        stopping = StoppingInfo(method=rule.method, starts_used=look, first_look=rule.min_starts,
                                max_starts=rule.max_starts)
        if m.target_rel is not None:
            try:
                stopping.fixed_design_starts = fixed_design_starts(dict(values.items()), baseline, m.target_rel,
                                                                   confidence=m.confidence)
            except Exception as exc:  # not enough data to size a fixed design
                stopping.fixed_design_note = str(exc)
    blocks = None
    if placements:
        values, extra, blocks = _block_by_node(cells, values, extra, placements)
    groups = {"tok/s": (values, rounds), **extra}
    verdict = decide(groups, baseline, m, look=look, failed=failed, guard=guard, simulated=simulated)
    _mark_flagged(verdict, cells, baseline)
    _caution_generated_text(verdict, cells, baseline, prompt_source)
    _caution_cache_state(verdict, cells, baseline, cache_changes or {})
    verdict.notes += [f"{c.variant} {c.label}: not compared on tok/s: "
                      + ("its requests did other work than the baseline's" if c.wrong == ["unequal_work"]
                         else "its figure is known to be wrong")
                      + f" ({', '.join(c.wrong)}: see the flags)"
                      + (", so nothing at this level is compared with it" if c.variant == baseline else "")
                      for c in wrong.values()]
    if blocks is not None:
        verdict.notes.append(blocks.line())
    return RunSummary(cells=cells, verdict=verdict, failed=failed, guard=guard, guard_texts=texts,
                      stopping=stopping, values=start_values(groups))
