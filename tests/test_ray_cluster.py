"""`--executor ray` on a real local Ray cluster: a head and a second node, each started with
`ray start` on loopback with two logical GPUs, the simulator as engine.

Known truth: the same plan run locally and on the cluster has the same trials and the same verdict
(the simulator's figures are noise-free here and its speed does not depend on the node); killing
the second node's processes (its raylet and everything in its process group) mid-trial leaves no
simulator behind (the server dies with its actor), and the start's unfinished trials run again on
the head, each trial once in the store; a plan that needs more GPUs on one node than any node has
is refused before anything starts, naming the variant and what it lacks.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

pytest.importorskip("ray", reason="Ray is not installed (pip install 'truthput[ray]')")
pytestmark = pytest.mark.realengine  # a real cluster on loopback: run alone (.ci/run)

from tests.test_run_e2e import experiment_text  # noqa: E402

TRUTHPUT = [sys.executable, "-m", "truthput"]
RAY = str(Path(sys.executable).parent / "ray")
NODE_IP = "127.0.0.2"
"""Loopback, but not 127.0.0.1: Ray maps that onto the host's outward address, and these tests
talk to loopback only."""
NODE_GPUS = 2  # logical: Ray accounts them, nothing uses them (the simulator models its GPUs)
# fast node-death detection, so the driver hears of a killed node in seconds, not half a minute
RAY_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_health_check_period_ms": "500",
           "RAY_health_check_failure_threshold": "3", "RAY_health_check_initial_delay_ms": "0"}

VARIANTS = """
[[variant]]
name = "base"
[[variant]]
name = "tp1"
set = { "--tensor-parallel-size" = 1 }
[[variant]]
name = "nospec"
remove = ["--speculative-config", "--enable-prefix-caching"]
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Cluster:
    def __init__(self) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="rt", dir="/tmp"))  # short: Ray's socket paths
        self.port = _free_port()
        self.address = f"{NODE_IP}:{self.port}"
        self.env = {**os.environ, **RAY_ENV}
        self.second: subprocess.Popen | None = None

    def start(self) -> None:
        subprocess.run([RAY, "start", "--head", f"--port={self.port}", f"--node-ip-address={NODE_IP}",
                        "--num-cpus=2", f"--num-gpus={NODE_GPUS}", "--include-dashboard=false",
                        "--disable-usage-stats", f"--temp-dir={self.tmp}", "--object-store-memory=80000000"],
                       check=True, env=self.env, capture_output=True, timeout=180)
        self.add_second()

    def add_second(self) -> None:
        self.second = subprocess.Popen(
            [RAY, "start", f"--address={self.address}", f"--node-ip-address={NODE_IP}", "--num-cpus=2",
             f"--num-gpus={NODE_GPUS}", "--object-store-memory=80000000", "--block"],
            env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 120
        while self.alive_nodes() < 2:
            assert time.monotonic() < deadline, "the second Ray node did not join"
            time.sleep(1)

    def nodes(self) -> list[dict]:
        code = ("import json, ray; ray.init(address=%r, logging_level='ERROR', _node_ip_address=%r); "
                "print(json.dumps([{'id': n['NodeID'], 'alive': n['Alive'], "
                "'head': 'node:__internal_head__' in n['Resources']} for n in ray.nodes()]))") % (self.address, NODE_IP)
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=self.env)
        return json.loads(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else []

    def alive_nodes(self) -> int:
        return sum(1 for n in self.nodes() if n["alive"])

    def kill_second(self) -> None:
        """The node dies: its raylet and every process of its group, at once."""
        assert self.second is not None
        os.killpg(self.second.pid, signal.SIGKILL)
        self.second.wait(timeout=30)
        self.second = None

    def stop(self) -> None:
        if self.second is not None:
            self.kill_second()
        subprocess.run([RAY, "stop", "--force"], env=self.env, capture_output=True, timeout=120)
        shutil.rmtree(self.tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def cluster():
    c = Cluster()
    try:
        c.start()
        yield c
    finally:
        c.stop()


def _experiment(tmp_path: Path, variants: str = VARIANTS, duration: float = 1.0, starts: int = 2,
                concurrency: tuple[int, ...] = (1, 2)) -> Path:
    text = experiment_text(variants, concurrency=concurrency, duration=duration, starts=starts).replace(
        "output_guard = true", "output_guard = false")
    path = tmp_path / "exp.toml"
    path.write_text(text)
    return path


def _truthput(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([*TRUTHPUT, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **RAY_ENV})


def _trials(db: Path) -> list[tuple]:
    con = sqlite3.connect(db)
    rows = con.execute("SELECT variant, start_index, concurrency, trial_index, status FROM trials "
                       "ORDER BY variant, start_index, concurrency, trial_index").fetchall()
    con.close()
    return rows


def _verdict(db: Path) -> list[tuple]:
    con = sqlite3.connect(db)
    (summary,) = con.execute("SELECT summary_json FROM runs").fetchone()
    con.close()
    out = []
    for cv in json.loads(summary)["verdict"]["per_concurrency"]:
        for comp in cv["comparisons"]:
            out.append((cv["level"], cv["metric"], comp["variant"], comp["outcome"]))
    return sorted(out, key=str)


def _placements(db: Path) -> list[dict]:
    con = sqlite3.connect(db)
    con.row_factory = sqlite3.Row
    rows = con.execute("SELECT * FROM starts ORDER BY id").fetchall()
    con.close()
    return [dict(r) | {"placement": (json.loads(r["info_json"]) if r["info_json"] else {}).get("placement")}
            for r in rows]


def test_a_plan_run_on_the_cluster_has_the_trials_and_verdict_of_a_local_run(cluster, tmp_path):
    # 3 starts: with 2, a 30% effect can stay undecided by chance; one level keeps it short
    exp = _experiment(tmp_path, starts=3, concurrency=(2,))
    local, on_ray = tmp_path / "local.db", tmp_path / "ray.db"
    a = _truthput("run", str(exp), "--store", str(local), "--reports", str(tmp_path / "ra"))
    assert a.returncode == 0, a.stderr[-3000:]
    t0 = time.monotonic()
    b = _truthput("run", str(exp), "--store", str(on_ray), "--reports", str(tmp_path / "rb"),
                  "--executor", "ray", "--address", cluster.address)
    print(f"ray run: {time.monotonic() - t0:.1f} s")
    assert b.returncode == 0, b.stderr[-3000:]
    assert _trials(local) == _trials(on_ray) and len(_trials(on_ray)) == 3 * 3
    assert all(t[-1] == "ok" for t in _trials(on_ray))
    assert _verdict(local) == _verdict(on_ray)
    assert {o for *_, o in _verdict(on_ray)} <= {"slower", "faster"}  # clear differences: decided either way
    starts = _placements(on_ray)
    nodes = {s["placement"]["node_id"] for s in starts}
    assert len(nodes) == 2, "both nodes served starts"
    for s in starts:
        p = s["placement"]
        assert p["executor"] == "ray" and p["gpus"] == (1 if s["variant"] == "tp1" else 2)
        assert p["hardware_class"] == "logical (no NVML), driver none"
    assert "placement: the measurements rest on 2 node(s) of 1 hardware class(es)" in b.stdout
    assert not [s for s in starts if s["status"] != "stopped"]


TUNE = """
[tune]
level = 4
candidates = 2
rounds = 1

[[tune.param]]
flag = "--tensor-parallel-size"
values = [1, 2]

[[tune.param]]
flag = "--spec-tokens"
values = ["off", 1, 3]
"""


def test_a_tune_on_the_cluster_measures_on_both_nodes_what_a_local_tune_measures(cluster, tmp_path):
    """`truthput tune --executor ray`: the same screen proposes the same candidates, the round's
    starts run on both nodes, and each measured configuration's tok/s is the local tune's."""
    exp = _experiment(tmp_path, variants='[[variant]]\nname = "base"\n', concurrency=(4,))
    exp.write_text(exp.read_text() + TUNE)
    docs = {}
    for where, extra in (("local", []), ("ray", ["--executor", "ray", "--address", cluster.address])):
        out = _truthput("tune", str(exp), "--store", str(tmp_path / f"{where}.db"), "--reports",
                        str(tmp_path / where), *extra)
        assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
        docs[where] = json.loads(next((tmp_path / where).glob("*.json")).read_text())
    local, on_ray = docs["local"], docs["ray"]
    assert [r["candidates"] for r in local["rounds"]] == [r["candidates"] for r in on_ray["rounds"]]
    assert len(on_ray["rounds"][0]["candidates"]) == 2
    figures = {r["config"]: r["server"] for r in local["measured"]}
    assert set(figures) == {r["config"] for r in on_ray["measured"]}
    # the simulator runs in real time: on a host others load it runs slower, and truthput says so
    # (`host_interference` on the trials); the figures are compared where neither run says so
    loaded = [_host_interference(tmp_path / f"{where}.db") for where in ("local", "ray")]
    for r in on_ray["measured"]:
        assert r["server"] == pytest.approx(figures[r["config"]], rel=0.1) or any(loaded), (r, figures)
    starts = _placements(tmp_path / "ray.db")
    assert len({s["placement"]["node_id"] for s in starts}) == 2, "both nodes served the round's starts"
    assert not [s for s in starts if s["status"] != "stopped"]


def _host_interference(db: Path) -> bool:
    """Whether any trial in the store was flagged for other processes using the host's CPU."""
    con = sqlite3.connect(db)
    try:
        return any("host_interference" in (text or "") for (text,) in con.execute("SELECT results_json FROM trials"))
    finally:
        con.close()


def test_plan_refuses_what_the_cluster_cannot_place_and_names_it(cluster, tmp_path):
    variants = VARIANTS + '\n[[variant]]\nname = "tp4"\nset = { "--tensor-parallel-size" = 4 }\n'
    exp = _experiment(tmp_path, variants)
    text = exp.read_text().replace("count = 2", "count = 4")
    exp.write_text(text)
    ok = _truthput("plan", str(exp), "--executor", "local")
    assert ok.returncode == 0, ok.stderr
    out = _truthput("plan", str(exp), "--executor", "ray", "--address", cluster.address)
    assert out.returncode != 0
    assert "variant 'tp4' needs 4 GPU(s) on one node: the largest matching node has 2" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr
    fits = _truthput("plan", str(_experiment(tmp_path)), "--executor", "ray", "--address", cluster.address)
    assert fits.returncode == 0, fits.stderr
    assert "2 node(s) of class 'logical (no NVML), driver none'" in fits.stdout


def _sim_alive(pid: int) -> bool:
    try:
        return b"truthput.sim" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def test_a_node_killed_mid_trial_leaves_no_server_and_its_trials_run_again_on_the_head(cluster, tmp_path):
    exp = _experiment(tmp_path, duration=2.0, starts=1)
    db = tmp_path / "kill.db"
    head = next(n["id"] for n in cluster.nodes() if n["head"])
    proc = subprocess.Popen([*TRUTHPUT, "run", str(exp), "--store", str(db), "--reports", str(tmp_path / "r"),
                             "--executor", "ray", "--address", cluster.address],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **RAY_ENV})
    try:
        victim = None
        deadline = time.monotonic() + 120
        while victim is None:
            assert time.monotonic() < deadline and proc.poll() is None, "no start became ready on the second node"
            time.sleep(0.3)
            if not db.exists():
                continue
            try:
                starts = _placements(db)
            except sqlite3.OperationalError:
                continue
            victim = next((s for s in starts if s["status"] == "ready" and s["pid"]
                           and s["placement"] and s["placement"]["node_id"] != head), None)
        assert _sim_alive(victim["pid"])
        time.sleep(1.5)  # its first trial's window is open
        cluster.kill_second()
        killed = time.monotonic()
        gone_by = time.monotonic() + 10
        while _sim_alive(victim["pid"]) and time.monotonic() < gone_by:
            time.sleep(0.2)
        assert not _sim_alive(victim["pid"]), "the killed node's simulator outlived its actor"
        print(f"the killed node's simulator gone {time.monotonic() - killed:.2f} s after the kill")
        out, err = proc.communicate(timeout=240)
        print(f"run ended {time.monotonic() - killed:.1f} s after the kill")
    finally:
        if proc.poll() is None:
            proc.kill()
        if cluster.second is None:
            cluster.add_second()
    assert proc.returncode == 0, err[-3000:]
    starts = _placements(db)
    lost = [s for s in starts if s["status"] == "lost"]
    assert [s["id"] for s in lost] == [victim["id"]] and lost[0]["failure_reason"].startswith("lost: node died")
    again = [s for s in starts if s["variant"] == victim["variant"] and s["start_index"] == victim["start_index"]
             and s["id"] != victim["id"]]
    assert again and again[-1]["status"] == "stopped" and again[-1]["placement"]["node_id"] == head
    trials = _trials(db)
    assert len(trials) == len(set(t[:4] for t in trials)) == 3 * 2  # every trial once
    assert all(t[-1] == "ok" for t in trials)
    assert "lost: node died" in err


def test_load_from_two_nodes_counts_what_the_server_counted_and_recovers_a_known_clock_skew(cluster, tmp_path):
    """Two load workers, one per node, against the simulator on loopback (both nodes are on this
    host); worker 1 reports every time 2.5 s off, as another machine's clock would be."""
    port = _free_port()
    server = subprocess.Popen([*TRUTHPUT, "sim", "serve", "--sim-gpu", "H100 SXM", "--sim-model", "llama-3.1-8b",
                               "--port", str(port), "--noise", "0", "--sim-startup-s", "0.1", "/models/llama"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    skew = 2.5
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "the simulator did not start"
                time.sleep(0.1)
        db = tmp_path / "load.db"
        out = _truthput("load", f"http://127.0.0.1:{port}", "-c", "4", "--duration", "2", "--output-tokens", "32",
                        "--input-tokens", "16", "--executor", "ray", "--address", cluster.address, "--workers", "2",
                        "--inject-clock-skew", f"1:{skew}", "--store", str(db))
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert out.returncode == 0, out.stderr[-3000:]
    con = sqlite3.connect(db)
    (results_json, t0, t_end) = con.execute("SELECT results_json, t0_mono, t_end FROM trials").fetchone()
    reqs = con.execute("SELECT idx, t_start, t_end, completion_tokens FROM requests").fetchall()
    con.close()
    results = json.loads(results_json)
    integrity = results["integrity"]
    assert integrity["holds"] is True
    assert integrity["counter_delta"]["value"] == integrity["usage_sum_ok"]["value"] == 32 * len(reqs)
    assert len({r[0] for r in reqs}) == len(reqs)  # each request once
    # every request, worker 1's included, lies inside the trial on the driver's clock once corrected
    assert all(t0 - 0.05 <= r[1] <= r[2] <= t_end + 0.05 for r in reqs)
    notes = results["client"]["notes"]
    offsets = {}
    for n in notes:
        if "clock offset" in n:
            k = int(n.split()[1])
            value = float(n.split("clock offset ")[1].split(" ms")[0])
            unc = float(n.split("± ")[1].split(" ms")[0])
            offsets[k] = (value / 1e3, unc / 1e3)
    assert set(offsets) == {0, 1}, notes
    assert abs(offsets[0][0]) <= offsets[0][1] + 1e-4
    print(f"recovered clock offsets (s, ± s): {offsets}")
    assert abs(offsets[1][0] - skew) <= offsets[1][1] + 1e-4, offsets
    assert "clock offset" in out.stderr + out.stdout


def test_no_cluster_at_the_address_is_one_line_and_starts_nothing(tmp_path):
    out = _truthput("plan", str(_experiment(tmp_path)), "--executor", "ray", "--address", f"{NODE_IP}:{_free_port()}",
                    timeout=60)
    assert out.returncode == 2
    (line,) = out.stderr.strip().splitlines()
    assert "no Ray cluster there" in line and "ray start --head" in line
