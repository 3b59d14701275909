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
    from truthput.run.trial import FAILED_ROWS_STORED, TrialRun, commit
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


def _cli(*args, cwd):
    import subprocess
    import sys
    return subprocess.run([sys.executable, "-m", "truthput", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=60)


def test_an_empty_or_foreign_sqlite_file_is_named_not_a_raw_sqlite_error(tmp_path):
    import sqlite3
    (tmp_path / "empty.db").write_bytes(b"")
    sqlite3.connect(tmp_path / "other.db").execute("CREATE TABLE notes(a)")
    for name, what in (("empty.db", "an empty file"), ("other.db", "an SQLite file with other tables (notes)")):
        for command in ("report", "runs", "audit"):
            done = _cli(command, "--store", name, cwd=tmp_path)
            assert done.returncode == 2, (command, done.stderr)
            line = done.stderr.strip()
            assert "\n" not in line and "Traceback" not in line and "OperationalError" not in line
            assert f"{name}: not a truthput results store ({what}" in line, line


def test_a_read_only_folder_is_named_as_the_reason_a_store_cannot_be_written():
    import os
    import shutil
    import subprocess
    import sys
    import tempfile
    if os.geteuid() == 0 and not shutil.which("setpriv"):
        pytest.skip("root writes anywhere, and setpriv is absent to run as another user")
    base = tempfile.mkdtemp(prefix="truthput-ro-", dir="/tmp")
    try:
        os.chmod(base, 0o755)
        folder = os.path.join(base, "ro")
        os.mkdir(folder)
        s = Store(os.path.join(folder, "r.db"))
        s.create_run("x", "sim", True, None, "", 1, {"hostname": "h"})
        s.close()
        for side in os.listdir(folder):
            if side.startswith("r.db-"):
                os.unlink(os.path.join(folder, side))
        os.chmod(os.path.join(folder, "r.db"), 0o666)
        os.chmod(folder, 0o555)
        prefix = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"] if os.geteuid() == 0 else []
        done = subprocess.run([*prefix, sys.executable, "-c",
                               "from truthput.store.db import Store\n"
                               "from truthput.errors import StoreError\n"
                               "try:\n    Store('ro/r.db')\nexcept StoreError as e:\n    print(e)"],
                              cwd=base, capture_output=True, text=True, timeout=60,
                              env={**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(
                                  __import__("truthput").__file__))})
    finally:
        os.chmod(os.path.join(base, "ro"), 0o755)
        shutil.rmtree(base)
    if "Permission denied" in done.stderr or "No module named" in done.stderr:
        pytest.skip(f"the other user cannot read this checkout: {done.stderr.strip()[-200:]}")
    assert "folder" in done.stdout and "is not writable" in done.stdout, (done.stdout, done.stderr)
