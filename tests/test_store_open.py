"""Opening the results store: read-only opens never write, nothing is created for a failed command,
a damaged file is reported when it is opened (real SQLite files, real damage)."""

from __future__ import annotations

import hashlib

import pytest

from truthput.errors import StoreError
from truthput.store.db import Store


def _store_with_rows(path) -> str:
    s = Store(path)
    run_id = s.create_run("x", "sim", True, None, "", 1, {"hostname": "h"})
    for i in range(3000):
        s.event(run_id, "note", f"event {i} " + "x" * 200)
    s.close()
    return run_id


def test_read_only_open_reads_and_never_writes(tmp_path):
    db = tmp_path / "r.db"
    run_id = _store_with_rows(db)
    for side in db.parent.glob("r.db-*"):
        side.unlink()  # a closed store: the WAL checkpointed into the file
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    ro = Store(db, read_only=True)
    assert ro.resolve_run("latest") == run_id
    with pytest.raises(Exception):
        ro.event(run_id, "note", "a write through a read-only open")
    ro.close()
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before


def test_read_only_open_of_a_missing_store_creates_nothing(tmp_path):
    with pytest.raises(StoreError, match="no results store here"):
        Store(tmp_path / "none.db", read_only=True)
    assert not (tmp_path / "none.db").exists()


def test_a_damaged_page_is_reported_on_open(tmp_path):
    db = tmp_path / "d.db"
    _store_with_rows(db)
    for side in db.parent.glob("d.db-*"):
        side.unlink()
    data = bytearray(db.read_bytes())
    page = 4096
    assert len(data) > 20 * page
    data[10 * page:10 * page + 8] = b"\x00" * 8  # the page header of a b-tree page (its type byte, cell count)
    db.write_bytes(bytes(data))
    with pytest.raises(StoreError, match="damaged|malformed"):
        Store(db, read_only=True)
    with pytest.raises(StoreError, match="damaged|malformed"):
        Store(db, read_only=True, full_check=True)


def test_the_full_check_passes_a_sound_store(tmp_path):
    db = tmp_path / "ok.db"
    _store_with_rows(db)
    Store(db, read_only=True, full_check=True).close()


def test_failed_requests_beyond_the_cap_are_counted_not_stored(tmp_path):
    """A trial with 500 failed requests stores 200 of them as rows and the rest as a count; the
    trial's ok requests are all stored."""
    from truthput.load.records import RequestRecord
    from truthput.load.schedule import LoadResult
    from truthput.load.selfcheck import SelfCheck
    from truthput.measure.model import TrialResults
    from truthput.pipeline.trial import FAILED_ROWS_STORED, TrialRun, commit
    from truthput.store.db import TrialKey

    recs = [RequestRecord(idx=i, t_start=float(i), t_end=float(i) + 0.5, completion_tokens=4) for i in range(50)]
    recs += [RequestRecord(idx=50 + i, t_start=float(i), t_end=float(i), status="error", error="HTTP 500")
             for i in range(500)]
    load = LoadResult(records=recs, t_start=0.0, t_window_start=1.0, t_window_end=2.0, t_end=3.0,
                      never_settled=False, selfcheck=SelfCheck(0.0, 0.0, 0.0, 0.0, False, None))
    run = TrialRun(results=TrialResults(), load=load, scrapes=[], t0_wall=0.0, t0_mono=0.0, t_end=3.0,
                   status="failed", error="request_errors")
    store = Store(tmp_path / "f.db")
    run_id = store.create_run("x", "sim", True, None, "", 1, {})
    trial_id = commit(store, run_id, "v", None, TrialKey("v", 0, 1, 0), run)
    rows = store.requests(trial_id)
    assert sum(1 for r in rows if r.status == "ok") == 50
    assert sum(1 for r in rows if r.status != "ok") == FAILED_ROWS_STORED == 200
    (t,) = store.trial_results(run_id)
    assert t.results.requests.failed_not_stored == 300


def _version_2_store(path) -> tuple[str, list[int]]:
    """A store as truthput wrote it before trials had a rate column: made with this version, then
    its trials table put back to the version 2 layout (same columns less `rate`, the old key)."""
    import sqlite3
    import time

    from truthput.measure.model import LoadLevel, TrialResults
    from truthput.store.db import TrialKey

    s = Store(path)
    run_id = s.create_run("old", "sim", True, None, "", 1, {"hostname": "h"})
    ids = []
    for k, level in enumerate((1, 4)):
        ids.append(s.commit_trial(run_id, "v", None, TrialKey("v", 0, level, 0), "ok", time.time(), 0.0, (0.0, 1.0),
                                  1.0, TrialResults(), [], []))
    # an open-loop `truthput load` trial of version 2: concurrency held the in-flight cap, the rate
    # was only in its results
    res = TrialResults()
    res.load = LoadLevel(mode="open", level=2.5, unit="req/s")
    ids.append(s.commit_trial(run_id, "load", None, TrialKey("load", 0, 3, 7), "ok", time.time(), 0.0, (0.0, 1.0),
                              1.0, res, [], []))
    s.close()
    con = sqlite3.connect(path)
    cols = [r[1] for r in con.execute("PRAGMA table_info(trials)") if r[1] != "rate"]
    con.executescript(f"""
        CREATE TABLE trials_v2 AS SELECT {', '.join(cols)} FROM trials;
        DROP TABLE trials;
        ALTER TABLE trials_v2 RENAME TO trials;
        CREATE UNIQUE INDEX trials_key ON trials(run_id, variant, start_index, concurrency, trial_index);
        UPDATE meta SET value = '2' WHERE key = 'schema_version';
    """)
    con.commit()
    con.close()
    return run_id, ids


def test_a_version_2_store_reads_as_it_is_and_gains_the_rate_column_when_written(tmp_path):
    from truthput.experiment.levels import Rate

    db = tmp_path / "old.db"
    run_id, ids = _version_2_store(db)
    ro = Store(db, read_only=True)
    levels = {t.id: t.level for t in ro.trial_results(run_id)}
    ro.close()
    assert levels == {ids[0]: 1, ids[1]: 4, ids[2]: Rate(2.5)}
    rw = Store(db)
    assert rw.schema_version == 3
    trials = {t.id: t for t in rw.trial_results(run_id)}
    assert {i: t.level for i, t in trials.items()} == levels  # the same trials, the same ids
    assert trials[ids[2]].rate == 2.5 and trials[ids[2]].concurrency == 0
    assert trials[ids[0]].rate is None
    rw.close()


def test_a_damaged_results_row_is_reported_and_the_rest_stays_readable(tmp_path):
    """One trial's stored results cut short (invalid JSON) and another's of the wrong shape: every
    command that reads the run names each damaged trial once on stderr, leaves it out, and shows
    the rest (exit 0)."""
    import sqlite3
    import subprocess
    import sys

    from report_fixture import restore_quickstart_db

    db = restore_quickstart_db(tmp_path / "q.db")
    conn = sqlite3.connect(db)
    ids = [i for (i,) in conn.execute("SELECT id FROM trials WHERE status='ok' ORDER BY id")]
    conn.execute("UPDATE trials SET results_json = substr(results_json, 1, 200) WHERE id=?", (ids[0],))
    conn.execute("UPDATE trials SET results_json = '{\"throughput\": 7}' WHERE id=?", (ids[1],))
    conn.commit()
    conn.close()
    for args in (["report", "latest"], ["report", "latest", "--json", str(tmp_path / "r.json")], ["audit"],
                 ["compare", "latest", "latest"], ["runs"]):
        proc = subprocess.run([sys.executable, "-m", "truthput", *args, "--store", str(db)], capture_output=True,
                              text=True, timeout=120, cwd=tmp_path)
        assert proc.returncode == 0, (args, proc.stderr[-1500:])
        assert "Traceback" not in proc.stderr
        if args[0] != "runs":
            for tid in ids[:2]:
                assert proc.stderr.count(f"trial {tid} of run") == 1, (args, proc.stderr)
            assert "unreadable results" in proc.stderr
