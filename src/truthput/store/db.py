"""The results store: SQLite (stdlib sqlite3, WAL).

Principle 2, nothing is lost: every finished trial is committed (with its requests, raw scrapes and
figures) in one transaction before the next trial starts, so a killed run resumes where it stopped.
"""

from __future__ import annotations

import os
import secrets
import sqlite3
import sys
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from importlib import resources
from pathlib import Path
from array import array
from typing import Any, Iterable, Sequence
from urllib.parse import quote

import orjson

from truthput.errors import StoreError
from truthput.store.rows import EventRow, LogLine, RequestRow, RunRow, ScrapeRow, StartRow, TelemetryRow, \
    VariantRow, from_row
from truthput.measure.model import TrialResults
from truthput.experiment.levels import Level, Rate, level_label, level_of
from truthput.experiment.file import Experiment

SCHEMA_VERSION = 3
"""3: trials have a `rate` column (an open loop's offered requests/s; 0 for a closed loop) and
their key includes it; 2: trial results are the typed results model's documents
(`truthput.measure.model`, results schema 2). Version 1 stores hold results schema 1, converted
when read. An older store is read as it is; opened for writing, its trials table is rebuilt with
the rate column (every row a closed loop, or an open loop named in its results) and it is marked
version 3."""


def _dumps(obj: Any) -> str:
    """Compact JSON; orjson because a trial can hold hundreds of thousands of chunk timestamps.

    NaN/inf become null (strict JSON, so any reader can load the store's documents).
    """
    return orjson.dumps(obj, default=str, option=orjson.OPT_SERIALIZE_NUMPY).decode()


def encode_chunks(times: Sequence[float], running: Sequence[int], texts: Sequence[str]) -> str:
    """A request's chunks as three columns, `{"t": [...], "running": [...], "text": [...]}`.

    Columns, not `[[t, running, text], ...]` rows: half the serialisation cost (no tuple per
    chunk), and this runs over every chunk of every trial before the next trial may start.
    """
    return orjson.dumps({"t": _packed(times, "d"), "running": _packed(running, "q"), "text": texts},
                        option=orjson.OPT_SERIALIZE_NUMPY).decode()


def _packed(values: Sequence[Any], typecode: str) -> Any:
    """A packed `array` as a zero-copy numpy view (orjson writes it without a Python object per
    value); anything else as it is."""
    if type(values) is array and values.typecode == typecode and len(values):
        import numpy as np

        return np.frombuffer(values, dtype=np.float64 if typecode == "d" else np.int64)
    return values if isinstance(values, list) else list(values)


def decode_chunks(text: str | bytes | None) -> tuple[list[float], list[int], list[str]]:
    """(arrival times, running token counts, texts) of a stored request, whichever layout it has:
    columns (this version) or rows `[[t, running, text], ...]` (stores written before it)."""
    if not text:
        return [], [], []
    doc = orjson.loads(text)
    if isinstance(doc, dict):
        return list(doc.get("t", [])), list(doc.get("running", [])), list(doc.get("text", []))
    return ([c[0] for c in doc], [c[1] if len(c) > 1 and c[1] is not None else -1 for c in doc],
            [c[2] if len(c) > 2 else "" for c in doc])


@dataclass
class StoredTrial:
    """One trial row as stored, its figures read back into the results model."""

    id: int
    run_id: str
    variant: str
    start_id: int | None
    start_index: int
    concurrency: int
    trial_index: int
    status: str
    t0_wall: float
    t0_mono: float
    window_start: float | None
    window_end: float | None
    t_end: float | None
    error: str | None
    results: TrialResults
    rate: float | None = None
    """An open loop's offered requests/s (None: a closed loop of `concurrency` streams)."""

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def level(self) -> Level:
        return level_of(self)

    @property
    def window(self) -> tuple[float, float] | None:
        if self.window_start is None or self.window_end is None:
            return None
        return (self.window_start, self.window_end)

    def where(self) -> str:
        """How a person names this trial."""
        return f"{self.variant} {level_label(self.level)} start {self.start_index + 1} trial {self.trial_index + 1}"


@dataclass(frozen=True)
class TrialKey:
    variant: str
    start_index: int
    level: Level
    """Streams (closed loop) or a `Rate` (open loop)."""
    trial_index: int

    @property
    def columns(self) -> tuple[int, float]:
        """(concurrency, rate) as stored: the one that does not apply is 0."""
        if isinstance(self.level, Rate):
            return 0, float(self.level)
        return int(self.level), 0.0


MAX_STORED_SCRAPE_LINE = 64 << 10
"""A /metrics line longer than this (64 KiB; a real one is under 1 KiB) is left out of the stored
text, with a comment saying so: a hostile endpoint cannot grow the store by megabytes a scrape."""


def stored_scrape_text(text: str | None) -> str | None:
    if text is None or len(text) <= MAX_STORED_SCRAPE_LINE:
        return text
    lines = text.split("\n")
    kept = [ln for ln in lines if len(ln) <= MAX_STORED_SCRAPE_LINE]
    if len(kept) == len(lines):
        return text
    return "\n".join(kept) + f"\n# truthput: {len(lines) - len(kept)} line(s) over 64 KiB not stored\n"


class Store:
    """A thin, typed wrapper over the SQLite file. One connection, used from one thread at a time."""

    def __init__(self, path: str | Path, read_only: bool = False, full_check: bool = False) -> None:
        """Open (or, unless `read_only`, create) the store. A read-only open never writes (an
        archived, read-only file opens as it is); every open runs SQLite's quick integrity check,
        so a damaged page is reported here, not as a wrong figure later."""
        self.path = str(path)
        self.read_only = read_only
        self._damaged: set[int] = set()
        self._experiments: dict[str, tuple[Experiment | None, str | None]] = {}
        if read_only and not Path(self.path).exists():
            raise StoreError(f"{self.path}: no results store here (give --store PATH)")
        try:
            if read_only:
                # a file this user cannot write (an archive) is read as immutable: no lock files either
                uri = "file:" + quote(os.path.abspath(self.path)) + "?mode=ro" + (
                    "" if os.access(self.path, os.W_OK) else "&immutable=1")
                self.conn = sqlite3.connect(uri, uri=True, timeout=30.0, check_same_thread=False)
            else:
                self.conn = sqlite3.connect(self.path, timeout=30.0, check_same_thread=False)
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path}: cannot open results store: {exc}{self._folder_note()}") from None
        self.conn.row_factory = sqlite3.Row
        self._lock = threading.Lock()
        try:
            self._check_version()
            if not read_only:
                schema = resources.files("truthput.store").joinpath("schema.sql").read_text()
                self.conn.executescript(schema)
                self._add_rate_column()
                self.conn.execute("INSERT OR IGNORE INTO meta(key, value) VALUES ('schema_version', ?)",
                                  (str(SCHEMA_VERSION),))
                self.conn.commit()
            self._quick_check(full_check)
            if read_only:
                self._check_has_tables()
        except sqlite3.OperationalError as exc:
            if "readonly" in str(exc) or "read-only" in str(exc):
                raise StoreError(f"{self.path}: the results store is read-only here{self._folder_note()}; commands "
                                 "that only read (report, audit, compare, unit) open it as it is") from None
            if not read_only and self._folder_note():
                raise StoreError(f"{self.path}: cannot write the results store ({exc}){self._folder_note()}") from None
            raise StoreError(f"{self.path}: not a truthput results store ({exc})") from None
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"{self.path}: not a truthput results store ({exc})") from None
        self.schema_version = self._stored_version() or SCHEMA_VERSION
        self.has_rate = any(r[1] == "rate" for r in self.conn.execute("PRAGMA table_info(trials)").fetchall())
        """Whether the trials table has the rate column (a version 1-2 store opened read-only has not)."""

    def _add_rate_column(self) -> None:
        """Rebuild a version 1-2 trials table with the rate column and the key that includes it
        (SQLite cannot change a table's UNIQUE constraint in place); row ids, and so every
        request, scrape and telemetry row that points at them, stay as they were."""
        cols = [r[1] for r in self.conn.execute("PRAGMA table_info(trials)").fetchall()]
        if "rate" in cols:
            return
        schema = resources.files("truthput.store").joinpath("schema.sql").read_text()
        start = schema.index("CREATE TABLE IF NOT EXISTS trials")
        create = schema[start:schema.index(");", start) + 2].replace("IF NOT EXISTS trials", "trials_rebuilt")
        with self.conn:
            self.conn.execute(create)
            self.conn.execute(f"INSERT INTO trials_rebuilt({', '.join(cols)}) SELECT {', '.join(cols)} FROM trials")
            self.conn.execute("DROP TABLE trials")
            self.conn.execute("ALTER TABLE trials_rebuilt RENAME TO trials")
        for row in self.conn.execute("SELECT id, results_json FROM trials WHERE instr(results_json, '\"mode\":\"open\"')"
                                     ).fetchall():
            load = (orjson.loads(row[1]) or {}).get("load") or {}
            if load.get("mode") == "open" and load.get("level"):
                self.conn.execute("UPDATE trials SET rate=?, concurrency=0 WHERE id=?", (float(load["level"]), row[0]))
        self.conn.execute("UPDATE meta SET value=? WHERE key='schema_version'", (str(SCHEMA_VERSION),))
        self.conn.commit()

    def _folder_note(self) -> str:
        """SQLite writes a journal beside the store, so a writable file in a read-only folder
        cannot be written either; say so rather than blame the file."""
        folder = os.path.dirname(os.path.abspath(self.path))
        if os.path.isdir(folder) and not os.access(folder, os.W_OK):
            return f" (its folder {folder} is not writable, and SQLite writes its journal there)"
        return ""

    def _check_has_tables(self) -> None:
        """A read-only open of an empty or foreign SQLite file would otherwise fail later, at the
        first query, with SQLite's own words (no such table): say what the file is instead."""
        names = {r[0] for r in self.conn.execute("SELECT name FROM sqlite_master WHERE type='table'").fetchall()}
        if "runs" not in names:
            what = "an empty file" if not names else f"an SQLite file with other tables ({', '.join(sorted(names)[:4])})"
            raise StoreError(f"{self.path}: not a truthput results store ({what}: no runs table); "
                             "give the store a run wrote with --store PATH")

    def _quick_check(self, full: bool = False) -> None:
        pragma = "integrity_check" if full else "quick_check"
        rows = [r[0] for r in self.conn.execute(f"PRAGMA {pragma}").fetchall()]
        if rows != ["ok"]:
            raise StoreError(f"{self.path}: the results store is damaged (SQLite {pragma}: "
                             f"{'; '.join(map(str, rows[:3]))}); restore it from a copy, or read what is left "
                             "with the sqlite3 shell's .recover")

    def _stored_version(self) -> int | None:
        try:
            row = self.conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        except sqlite3.OperationalError:  # no meta table: a new store
            return None
        return int(row[0]) if row and str(row[0]).isdigit() else None

    def _check_version(self) -> None:
        """Refuse a store written by a newer truthput (its tables may mean something else)."""
        version = self._stored_version()
        if version is not None and version > SCHEMA_VERSION:
            raise StoreError(f"{self.path}: results store schema {version} is newer than this truthput reads "
                             f"({SCHEMA_VERSION}): upgrade truthput")

    def _mark_current(self) -> None:
        """A store written to by this version holds this version's documents from now on."""
        if self.schema_version < SCHEMA_VERSION:
            self.conn.execute("UPDATE meta SET value=? WHERE key='schema_version'", (str(SCHEMA_VERSION),))
            self.schema_version = SCHEMA_VERSION

    def close(self) -> None:
        self.conn.close()

    def lock_run(self, run_id: str) -> Any:
        """Hold an exclusive lock on a run for this process's lifetime (or until the returned file
        is closed): a second truthput running or resuming the same run fails with one line instead
        of both writing its trials. One lock file per store (`<store>.lock`), one byte per run in it."""
        import fcntl
        import hashlib

        handle = open(f"{self.path}.lock", "a+")
        offset = int.from_bytes(hashlib.sha256(run_id.encode()).digest()[:4], "big")
        try:
            fcntl.lockf(handle, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, offset, 0)
        except OSError:
            handle.close()
            raise StoreError(f"run {run_id} in {self.path} is being run or resumed by another truthput right now "
                             "(wait for it, or stop it first)") from None
        return handle

    # ---- runs -------------------------------------------------------------------------------
    def create_run(self, name: str, engine: str, simulated: bool, experiment_path: str | None,
                   experiment_toml: str, seed: int | None, machine: dict[str, Any]) -> str:
        stamp = datetime.now(timezone.utc)
        safe = "".join(ch if ch.isalnum() or ch in "-_" else "-" for ch in name)[:40]
        run_id = f"{stamp:%Y%m%d-%H%M%S}-{safe}-{secrets.token_hex(2)}"
        with self._lock, self.conn:
            self.conn.execute(
                "INSERT INTO runs(id, name, created_at, status, engine, simulated, experiment_path, experiment_toml, seed, machine_json)"
                " VALUES (?,?,?,?,?,?,?,?,?,?)",
                (run_id, name, stamp.isoformat(), "running", engine, int(simulated), experiment_path,
                 experiment_toml, seed, _dumps(machine)),
            )
        return run_id

    def resolve_run(self, run_id: str) -> str:
        """`latest` (or a unique prefix) -> the full run id; a clear error when there is none.

        `latest` is the newest run in the store, whatever its status, in every command: what
        `run --resume latest` continues is what `report latest` shows (a run that failed or is
        still going says so in its report)."""
        if run_id == "latest":
            row = self.conn.execute("SELECT id FROM runs ORDER BY created_at DESC, rowid DESC LIMIT 1").fetchone()
            if row is None:
                raise StoreError(f"{self.path}: no runs in this store yet")
            return str(row["id"])
        row = self.conn.execute("SELECT id FROM runs WHERE id = ?", (run_id,)).fetchone()
        if row:
            return str(row["id"])
        rows = self.conn.execute("SELECT id FROM runs WHERE id LIKE ?", (run_id + "%",)).fetchall()
        if len(rows) == 1:
            return str(rows[0]["id"])
        if not rows:
            raise StoreError(f"{self.path}: no run {run_id!r} (try `latest`)")
        raise StoreError(f"{self.path}: {run_id!r} matches {len(rows)} runs; give more of the id")

    def run(self, run_id: str) -> RunRow:
        row = self.conn.execute("SELECT * FROM runs WHERE id = ?", (self.resolve_run(run_id),)).fetchone()
        return from_row(RunRow, row)

    def runs(self) -> list[RunRow]:
        return [from_row(RunRow, r) for r in self.conn.execute("SELECT * FROM runs ORDER BY created_at").fetchall()]

    def set_run_status(self, run_id: str, status: str, summary: str | dict[str, Any] | None = None) -> None:
        """The run's status, and (when it ends) its summary: an experiment's
        `analyze.summary.StoredSummary` as its JSON, a load run's trials as a dict."""
        with self._lock, self.conn:
            finished = datetime.now(timezone.utc).isoformat() if status != "running" else None
            if summary is None:
                self.conn.execute("UPDATE runs SET status=?, finished_at=? WHERE id=?", (status, finished, run_id))
            else:
                self.conn.execute("UPDATE runs SET status=?, finished_at=?, summary_json=? WHERE id=?",
                                  (status, finished, summary if isinstance(summary, str) else _dumps(summary),
                                   run_id))

    def mark_simulated(self, run_id: str) -> None:
        with self._lock, self.conn:
            self.conn.execute("UPDATE runs SET simulated=1 WHERE id=?", (run_id,))

    def event(self, run_id: str, kind: str, message: str) -> None:
        with self._lock, self.conn:
            self.conn.execute("INSERT INTO events(run_id, t_wall, kind, message) VALUES (?,?,?,?)",
                              (run_id, time.time(), kind, message))

    # ---- variants ---------------------------------------------------------------------------
    def put_variant(self, run_id: str, name: str, position: int, is_baseline: bool, argv: Sequence[str],
                    diff: Any, env: dict[str, str]) -> None:
        with self._lock, self.conn:
            self.conn.execute(
                "INSERT OR REPLACE INTO variants(run_id, name, position, is_baseline, argv_json, diff_json, env_json)"
                " VALUES (?,?,?,?,?,?,?)",
                (run_id, name, position, int(is_baseline), _dumps(list(argv)), _dumps(diff), _dumps(env)),
            )

    def variants(self, run_id: str) -> list[VariantRow]:
        return [from_row(VariantRow, r) for r in
                self.conn.execute("SELECT * FROM variants WHERE run_id=? ORDER BY position", (run_id,)).fetchall()]

    # ---- server starts ----------------------------------------------------------------------
    def begin_start(self, run_id: str, variant: str, start_index: int, argv: Sequence[str], port: int | None) -> int:
        with self._lock, self.conn:
            cur = self.conn.execute(
                "INSERT INTO starts(run_id, variant, start_index, status, argv_json, port, started_at) VALUES (?,?,?,?,?,?,?)",
                (run_id, variant, start_index, "starting", _dumps(list(argv)), port, time.time()),
            )
            return int(cur.lastrowid or 0)

    def update_start(self, start_id: int, **fields: Any) -> None:
        if not fields:
            return
        for key in ("info_json",):
            if key in fields and not isinstance(fields[key], str):
                fields[key] = _dumps(fields[key])
        cols = ", ".join(f"{k}=?" for k in fields)
        with self._lock, self.conn:
            self.conn.execute(f"UPDATE starts SET {cols} WHERE id=?", (*fields.values(), start_id))

    def merge_start_info(self, start_id: int, info: dict[str, Any]) -> None:
        """Add `info`'s keys to the start's info document, keeping those already there (the spawned
        process's identity is written as the server spawns, its placement and readiness later)."""
        with self._lock, self.conn:
            row = self.conn.execute("SELECT info_json FROM starts WHERE id=?", (start_id,)).fetchone()
            merged = {**(orjson.loads(row[0]) if row and row[0] else {}), **info}
            self.conn.execute("UPDATE starts SET info_json=? WHERE id=?", (_dumps(merged), start_id))

    def failed_variants(self, run_id: str) -> dict[str, str]:
        """Variant -> '<failure class>: <reason>' of its failed server starts (the last one wins)."""
        return {s.variant: f"{s.failure_class}: {s.failure_reason}" for s in self.starts(run_id)
                if s.status == "failed" and s.failure_class}

    def starts(self, run_id: str) -> list[StartRow]:
        return [from_row(StartRow, r) for r in
                self.conn.execute("SELECT * FROM starts WHERE run_id=? ORDER BY id", (run_id,)).fetchall()]

    def add_logs(self, start_id: int, first_seq: int, lines: Iterable[tuple[float, str, str]]) -> int:
        rows = [(start_id, first_seq + i, t, stream, line) for i, (t, stream, line) in enumerate(lines)]
        if rows:
            with self._lock, self.conn:
                self.conn.executemany(
                    "INSERT OR REPLACE INTO server_logs(start_id, seq, t_mono, stream, line) VALUES (?,?,?,?,?)", rows)
        return first_seq + len(rows)

    def logs(self, start_id: int) -> list[LogLine]:
        return [from_row(LogLine, r) for r in
                self.conn.execute("SELECT * FROM server_logs WHERE start_id=? ORDER BY seq", (start_id,)).fetchall()]

    # ---- trials -----------------------------------------------------------------------------
    def commit_trial(self, run_id: str, variant: str, start_id: int | None, key: TrialKey, status: str,
                     t0_wall: float, t0_mono: float, window: tuple[float | None, float | None], t_end: float,
                     results: TrialResults, records: Sequence[Any], scrapes: Sequence[Any],
                     telemetry: Sequence[tuple[float, int, float | None, float | None, float | None, float | None]] = (),
                     error: str | None = None) -> int:
        """Write one finished trial and everything it saw, atomically."""
        with self._lock, self.conn:
            self._mark_current()
            cur = self.conn.execute(
                "INSERT INTO trials(run_id, variant, start_id, start_index, concurrency, rate, trial_index, status,"
                " t0_wall, t0_mono, window_start, window_end, t_end, results_json, error)"
                " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (run_id, variant, start_id, key.start_index, *key.columns, key.trial_index, status, t0_wall, t0_mono,
                 window[0], window[1], t_end, _dumps(results.to_json_dict()), error),
            )
            trial_id = int(cur.lastrowid or 0)
            self.conn.executemany(
                "INSERT INTO requests(trial_id, idx, t_start, t_first, t_end, status, http_status, error, prompt_tokens,"
                " completion_tokens, finish_reason, n_chunks, chunks_json) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
                [
                    (trial_id, r.idx, r.t_start, r.t_first, r.t_end, r.status, r.http_status, r.error, r.prompt_tokens,
                     r.completion_tokens, r.finish_reason, len(r.chunk_times),
                     encode_chunks(r.chunk_times, r.chunk_tokens, r.chunk_texts))
                    for r in records
                ],
            )
            self.conn.executemany(
                "INSERT INTO scrapes(trial_id, phase, t_mono, text, error) VALUES (?,?,?,?,?)",
                [(trial_id, s.phase, s.t_mono, stored_scrape_text(s.text), s.error) for s in scrapes],
            )
            if telemetry:
                self.conn.executemany(
                    "INSERT INTO telemetry(trial_id, t_mono, gpu, util_pct, mem_used_bytes, power_w, sm_clock_mhz)"
                    " VALUES (?,?,?,?,?,?,?)", [(trial_id, *row) for row in telemetry])
        return trial_id

    def done_trials(self, run_id: str) -> set[TrialKey]:
        if not self.has_rate:  # an older store: an open loop's rate is only in its results
            return {TrialKey(t.variant, t.start_index, t.level, t.trial_index) for t in self.trial_results(run_id)}
        rows = self.conn.execute("SELECT variant, start_index, concurrency, rate, trial_index FROM trials "
                                 "WHERE run_id=?", (run_id,)).fetchall()
        return {TrialKey(r["variant"], r["start_index"], Rate(r["rate"]) if r["rate"] else int(r["concurrency"]),
                         r["trial_index"]) for r in rows}

    def _trial_rows(self, run_id: str) -> list[sqlite3.Row]:
        return self.conn.execute(
            "SELECT * FROM trials WHERE run_id=? ORDER BY (SELECT position FROM variants v WHERE v.run_id = trials.run_id"
            " AND v.name = trials.variant), variant, concurrency, "
            + ("rate, " if self.has_rate else "") + "start_index, trial_index", (run_id,)
        ).fetchall()

    def trial_results(self, run_id: str) -> list[StoredTrial]:
        """The run's trials with their figures in the results model (older documents converted)."""
        out = []
        for row in self._trial_rows(run_id):
            try:
                doc = orjson.loads(row["results_json"]) if row["results_json"] else {}
                results = TrialResults.from_stored(doc)
            except StoreError:
                raise  # a newer schema: the whole store is for a newer truthput
            except Exception as exc:  # one damaged row must not make the run unreadable
                self._report_damaged(row, exc)
                continue
            out.append(StoredTrial(
                id=row["id"], run_id=row["run_id"], variant=row["variant"], start_id=row["start_id"],
                start_index=row["start_index"], concurrency=row["concurrency"], trial_index=row["trial_index"],
                status=row["status"], t0_wall=row["t0_wall"], t0_mono=row["t0_mono"],
                window_start=row["window_start"], window_end=row["window_end"], t_end=row["t_end"],
                error=row["error"], results=results,
                rate=(row["rate"] or None) if "rate" in row.keys() else None))
        return out

    def _report_damaged(self, row: Any, exc: Exception) -> None:
        """Say once, on stderr, which stored trial was left out and why (the rest stays readable)."""
        if row["id"] in self._damaged:
            return
        self._damaged.add(row["id"])
        why = str(exc).splitlines()[0][:160] if str(exc) else exc.__class__.__name__
        print(f"truthput: warning: {self.path}: trial {row['id']} of run {row['run_id']} ({row['variant']}, "
              f"level {row['concurrency']}) has unreadable results ({why}); left out", file=sys.stderr)

    def experiment(self, run_id: str) -> tuple[Experiment | None, str | None]:
        """The run's stored experiment, parsed once per open store, with the simulator's target it
        ran on applied (None and why where it no longer parses: a `load` run's options, an older
        schema)."""
        from truthput.errors import TruthputError
        from truthput.experiment.file import parse_experiment

        run_id = self.resolve_run(run_id)
        if run_id not in self._experiments:
            run = self.run(run_id)
            try:
                exp: Experiment | None = parse_experiment(run.experiment_toml or "",
                                                          run.experiment_path or "stored experiment")
                why = None
            except TruthputError as exc:
                exp, why = None, str(exc)
            except Exception as exc:  # a schema that changed since the run
                exp, why = None, f"stored experiment no longer parses: {exc}"
            if exp is not None:
                self.apply_sim_target(run_id, exp)
            self._experiments[run_id] = (exp, why)
        return self._experiments[run_id]

    def apply_sim_target(self, run_id: str, exp: Any) -> None:
        """Apply the GPU and model a run was simulated on (`run --sim-gpu/--sim-model`, kept as the
        run's `sim_target` event) to its stored experiment, for a resume and for its reports."""
        for (message,) in self.conn.execute("SELECT message FROM events WHERE run_id=? AND kind='sim_target'",
                                            (run_id,)).fetchall():
            target = orjson.loads(message)
            exp.simulate_on(target.get("gpu"), target.get("model"))

    def requests(self, trial_id: int) -> list[RequestRow]:
        return [from_row(RequestRow, r) for r in
                self.conn.execute("SELECT * FROM requests WHERE trial_id=? ORDER BY idx", (trial_id,)).fetchall()]

    def scrapes(self, trial_id: int) -> list[ScrapeRow]:
        return [from_row(ScrapeRow, r) for r in
                self.conn.execute("SELECT * FROM scrapes WHERE trial_id=? ORDER BY t_mono", (trial_id,)).fetchall()]

    def events(self, run_id: str) -> list[EventRow]:
        return [from_row(EventRow, r) for r in
                self.conn.execute("SELECT * FROM events WHERE run_id=? ORDER BY t_wall", (run_id,)).fetchall()]

    def telemetry(self, run_id: str) -> list[TelemetryRow]:
        """Every NVML sample of the run's trials."""
        return [from_row(TelemetryRow, r) for r in self.conn.execute(
            "SELECT telemetry.* FROM telemetry JOIN trials ON trials.id = telemetry.trial_id WHERE trials.run_id = ?",
            (run_id,)).fetchall()]
