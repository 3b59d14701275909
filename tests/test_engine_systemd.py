"""The systemd engine against RECORDED systemd behaviour (these machines do not run systemd as PID 1).

tests/fixtures/systemd/fake_systemctl and fake_journalctl are FAKES that print what systemd 252 prints
for the commands truthput uses (sources in tests/fixtures/systemd/README.md) and really launch the
unit's ExecStart= -- here the embedded simulator, a real HTTP server with real counters. Known truth:
with ignore_eos every request emits exactly output_tokens tokens, so a trial's counter delta equals
n_requests * output_tokens; the unit that was started must carry the variant's exact argv and
Restart=no; a unit whose process prints a CUDA OOM and exits 1 is an `oom` failure.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from truthput.engines.ports import free_port, port_is_listening
from truthput.engines.systemd import SystemdEngine, UnitStatus, render_variant_unit, unit_name
from truthput.errors import EngineError
from simhelpers import run_experiment
from truthput.experiment.file import parse_experiment
from truthput.experiment.unit import parse_unit
from truthput.store.db import Store

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "tests" / "fixtures" / "systemd"
SERVER = str(FIX / "vllm_like_server.py")
SIM = [sys.executable, "-m", "truthput.sim", "serve"]
SIM_FLAGS = ["--model", "m", "--max-num-seqs", "16", "--sim-gpu", "H100 SXM", "--sim-model", "llama-3.1-8b",
             "--noise", "0", "--sim-startup-s", "0.05"]

UNIT_TEXT = """\
[Unit]
Description=vLLM under test (truthput systemd engine)
After=network.target

[Service]
Type=simple
Environment=VLLM_LOG_STATS_INTERVAL=0.5
ExecStart=/usr/bin/false
Restart=on-failure
RestartSec=10
TimeoutStopSec=20
SyslogIdentifier=vllm-test

[Install]
WantedBy=multi-user.target
"""


VARIANT_BASE = """
[[variant]]
name = "base"
"""


@pytest.fixture
def fake_systemd(tmp_path, monkeypatch):
    """Point the engine at the recorded stand-ins; stop anything the fake still supervises afterwards."""
    units = tmp_path / "units"
    state = tmp_path / "fake-state"
    units.mkdir()
    monkeypatch.setenv("TRUTHPUT_SYSTEMCTL", f"{sys.executable} {FIX / 'fake_systemctl'}")
    monkeypatch.setenv("TRUTHPUT_JOURNALCTL", f"{sys.executable} {FIX / 'fake_journalctl'}")
    monkeypatch.setenv("TRUTHPUT_SYSTEMD_UNIT_DIR", str(units))
    monkeypatch.setenv("FAKE_SYSTEMD_STATE", str(state))
    yield units, state
    for f in (state / "units").glob("*.json") if (state / "units").exists() else []:
        st = json.loads(f.read_text())
        for pid in (st.get("supervisor"), st.get("MainPID")):
            if pid:
                try:
                    os.killpg(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass


def calls(state: Path) -> list[list[str]]:
    lines = (state / "calls.jsonl").read_text().splitlines()
    return [[a for a in json.loads(line)["argv"] if a != "--no-ask-password"] for line in lines]


def experiment(variants: str, command: list[str], unit_text: str = UNIT_TEXT, extra: str = "") -> str:
    return f"""
[experiment]
name = "sd"
baseline = "base"
seed = 1
[server]
engine = "systemd"
command = {json.dumps(command)}
env = {{ VLLM_LOG_STATS_INTERVAL = "0.5" }}
ready_timeout_s = 30
stop_grace_s = 10
{extra}
[server.systemd_unit]
text = '''
{unit_text}'''
{variants}
[workload]
concurrency = [2]
duration_s = 0.5
warmup_s = 0
input_tokens = 32
output_tokens = 16
ignore_eos = true
[measure]
starts = 1
sequential = false
repeats = 1
output_guard = false
"""


def _run(text: str, db: Path) -> str:
    exp = parse_experiment(text, "sd.toml")
    return asyncio.run(run_experiment(exp, text, "sd.toml", Store(db), progress=lambda m: None))


def test_run_experiment_on_recorded_systemd(fake_systemd, tmp_path):
    units, state = fake_systemd
    variants = """
[[variant]]
name = "base"
[[variant]]
name = "seqs4"
set = { "--max-num-seqs" = 4 }
[[variant]]
name = "oom"
env = { FAKE_SERVER_FAIL = "oom" }
"""
    db = tmp_path / "r.db"
    run_id = _run(experiment(variants, [sys.executable, SERVER, *SIM_FLAGS]), db)
    store = Store(db)
    assert store.run(run_id).status == "done"

    # counter figures from a real server, and the whole-trial identity
    trials = {t.variant: t for t in store.trial_results(run_id)}
    assert set(trials) == {"base", "seqs4"}
    for t in trials.values():
        assert t.status == "ok"
        reqs = store.requests(t.id)
        assert reqs and all(q.completion_tokens == 16 for q in reqs)
        integ = t.results.to_json_dict()["integrity"]
        assert integ["holds"] is True
        assert integ["counter_delta"]["value"] == 16 * len(reqs)
        assert integ["counter_delta"]["source"] == "server_counter"
        assert t.results.to_json_dict()["throughput"]["counter_window"]["source"] == "server_counter"

    starts = {s.variant: s for s in store.starts(run_id)}
    # the OOM unit is a recorded failure with the right class, not a crashed run
    bad = starts["oom"]
    assert bad.status == "failed" and bad.failure_class == "oom"
    assert "CUDA out of memory" in bad.failure_line
    assert "Result=exit-code" in bad.failure_reason and "ExecMainStatus=1" in bad.failure_reason

    # what systemd was asked to start: Restart=no, no RestartSec=, the variant's exact argv and env
    started = {p.name: p.read_text() for p in (state / "started").iterdir()}
    assert len(started) == 3
    for variant, row in starts.items():
        launched = row.argv
        (name, text), = [(n, t) for n, t in started.items() if f"--port {row.port}\n" in t]
        unit = parse_unit(text, name)
        assert unit.exec_start_argv() == launched
        assert unit.get("Service", "Restart") == "no"
        assert unit.get("Service", "RestartSec") is None
        assert unit.get("Service", "TimeoutStopSec") == "20" and unit.get("Install", "WantedBy") == "multi-user.target"
        expected_env = {"VLLM_LOG_STATS_INTERVAL": "0.5", **({"FAKE_SERVER_FAIL": "oom"} if variant == "oom" else {})}
        assert unit.environment() == expected_env
        if variant == "seqs4":
            assert launched[launched.index("--max-num-seqs") + 1] == "4"
        # the journal reached the store: systemd's own line and the server's
        logs = [(r.stream, r.line) for r in store.logs(row.id)]
        assert ("journal", f"Started {name} - vLLM under test (truthput systemd engine).") in logs
        assert ("unit", "Restart=no") in logs

    # removed afterwards, with a daemon-reload around each start
    assert not list(units.glob("*.service"))
    seq = calls(state)
    for name in started:
        verbs = [c[0] for c in seq if name in c or c == ["daemon-reload"]]
        i_start = next(i for i, c in enumerate(seq) if c == ["start", name])
        i_stop = next(i for i, c in enumerate(seq) if c == ["stop", name])
        assert seq[i_start - 1] == ["daemon-reload"]
        assert i_stop > i_start and ["daemon-reload"] in seq[i_stop:]
        assert "show" in verbs
    assert not any(port_is_listening(s.port) for s in starts.values())


def _engine(units: Path, argv: list[str], env: dict[str, str], port: int, **kw) -> SystemdEngine:
    name = unit_name("test", port)
    text = render_variant_unit(UNIT_TEXT, None, argv, env, name)
    return SystemdEngine(name, text, "127.0.0.1", port, unit_dir=units, ready_timeout_s=30, stop_grace_s=10, **kw)


def test_restart_behind_truthputs_back_is_reported(fake_systemd, tmp_path):
    """A top-level drop-in (<unit dir>/service.d/*.conf) overrides the Restart=no truthput wrote:
    the first start OOMs, systemd restarts it, the second serves; NRestarts=1 is reported."""
    units, state = fake_systemd
    (units / "service.d").mkdir()
    (units / "service.d" / "50-restart.conf").write_text("[Service]\nRestart=on-failure\nRestartSec=100ms\n")
    port = free_port()
    argv = [sys.executable, SERVER, *SIM_FLAGS, "--host", "127.0.0.1", "--port", str(port)]
    engine = _engine(units, argv, {"FAKE_SERVER_FAIL_ONCE": str(tmp_path / "failed-once")}, port)

    async def go():
        out = await engine.start()
        crashed = engine.crashed()
        await engine.stop()
        return out, crashed

    out, crashed = asyncio.run(go())
    assert out.ok, out.reason
    assert out.info["restarts"] == 1
    assert out.info["systemd_status"]["restart"] == "on-failure"
    assert "restarted 1 time(s)" in out.info["warning"]
    assert crashed is None  # no further restart after readiness
    log = engine.recent_log(200)
    assert f"{engine.name}: Scheduled restart job, restart counter is at 1." in log
    assert any("CUDA out of memory" in line for line in log)
    assert not engine.unit_path.exists()


def test_crash_under_load_is_classified(fake_systemd):
    units, state = fake_systemd
    port = free_port()
    argv = [*SIM, *SIM_FLAGS, "--host", "127.0.0.1", "--port", str(port)]
    engine = _engine(units, argv, {}, port, user=True)

    async def go():
        out = await engine.start()
        assert out.ok, out.reason
        os.kill(out.pid, signal.SIGKILL)
        for _ in range(100):
            await asyncio.sleep(0.05)
            if not engine.is_running():
                break
        crashed = engine.crashed()
        await engine.stop()
        return crashed

    crashed = asyncio.run(go())
    assert crashed is not None
    assert crashed.failure_kind == "oom"  # SIGKILL outside teardown: likely the OOM killer
    assert "Result=signal" in crashed.reason and "ExecMainStatus=9" in crashed.reason
    lines = (state / "calls.jsonl").read_text().splitlines()
    assert lines and all(json.loads(line)["argv"][0] == "--user" for line in lines)  # systemctl --user ...


def test_unit_directory_defaults(monkeypatch, tmp_path):
    from truthput.engines.systemd import default_unit_dir

    monkeypatch.delenv("TRUTHPUT_SYSTEMD_UNIT_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert default_unit_dir(user=False) == Path("/etc/systemd/system")
    assert default_unit_dir(user=True) == tmp_path / ".config" / "systemd" / "user"
    monkeypatch.setenv("TRUTHPUT_SYSTEMD_UNIT_DIR", "/srv/units")
    assert default_unit_dir(user=True) == Path("/srv/units")


def test_exec_failure_is_systemd_status_203(fake_systemd, monkeypatch):
    units, state = fake_systemd
    monkeypatch.setenv("TRUTHPUT_SYSTEMD_ANALYZE", "none")  # let "systemd" itself find out
    port = free_port()
    engine = _engine(units, ["/nonexistent/python", "-m", "vllm", "--port", str(port)], {}, port)
    out = asyncio.run(engine.start())
    assert not out.ok
    assert out.failure_kind == "invalid_config"
    assert "203/EXEC" in out.reason
    assert "Failed to locate executable /nonexistent/python" in out.root_cause_line
    assert not engine.unit_path.exists()


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed here")
def test_verify_preflight_rejects_a_unit_systemd_would_refuse(fake_systemd):
    units, state = fake_systemd
    port = free_port()
    engine = _engine(units, ["/nonexistent/python", "-m", "vllm", "--port", str(port)], {}, port)
    out = asyncio.run(engine.start())
    assert out.failure_kind == "invalid_config"
    assert "Command /nonexistent/python is not executable" in out.root_cause_line
    assert not engine.unit_path.exists()
    assert not (state / "calls.jsonl").exists()  # systemd was never asked


def test_port_in_use_never_writes_a_unit(fake_systemd):
    import socket

    units, state = fake_systemd
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        engine = _engine(units, [*SIM, "--port", str(port)], {}, port)
        out = asyncio.run(engine.start())
    assert out.failure_kind == "port_in_use" and str(port) in out.reason
    assert not list(units.glob("*.service")) and not (state / "calls.jsonl").exists()


def test_missing_systemctl_and_unwritable_dir_are_one_line_errors(tmp_path, monkeypatch):
    monkeypatch.setenv("TRUTHPUT_SYSTEMCTL", str(tmp_path / "no-such-systemctl"))
    port = free_port()
    engine = _engine(tmp_path / "units", [*SIM, "--port", str(port)], {}, port)
    with pytest.raises(EngineError, match=r"cannot run .*no-such-systemctl.* TRUTHPUT_SYSTEMCTL"):
        asyncio.run(engine.start())
    assert not engine.unit_path.exists()
    ro = tmp_path / "ro"
    ro.write_text("a file, not a directory")
    engine = _engine(ro, [*SIM, "--port", str(port)], {}, port)
    with pytest.raises(EngineError, match=r"cannot write unit .*ro/truthput-test-"):
        asyncio.run(engine.start())


def test_unit_status_from_recorded_show_output():
    """`systemctl show -p ...` texts as systemd 252 prints them (README.md in fixtures/systemd)."""
    failed = UnitStatus.from_show((FIX / "show_failed_oom_kill.txt").read_text())
    assert failed.stopped and failed.result == "oom-kill" and failed.exit_code == -9
    running = UnitStatus.from_show((FIX / "show_running_restarted.txt").read_text())
    assert not running.stopped and running.n_restarts == 2 and running.main_pid == 48213
    assert running.exit_code is None  # a new main process: systemd zeroed ExecMainCode/ExecMainStatus


def test_unit_names_are_valid_and_run_specific():
    name = unit_name("20261130-1012-ab12", "spec 3/mtp", 0)
    assert name == "truthput-20261130-1012-ab12-spec-3-mtp-0.service"
    assert len(unit_name("x" * 400)) <= 255


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed here")
def test_rendered_units_pass_systemd_analyze_verify(tmp_path):
    """systemd's own parser reads the units truthput writes without a warning, the seed's included."""
    seed = (ROOT / "tests" / "fixtures" / "units" / "gwen-original-config.service").read_text()
    seed = seed.replace("User=alex", "User=root").replace("Group=alex", "Group=root")  # no user alex here
    argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", "/models/qwen",
            "--default-chat-template-kwargs", '{"enable_thinking": false}', "--served-model-name", "50%-off $HOME",
            "--host", "127.0.0.1", "--port", "8123"]
    for i, (text, env) in enumerate([(seed, {"CUDA_VISIBLE_DEVICES": "0,1", "NOTE": "a b"}), (None, {})]):
        rendered = render_variant_unit(text, None, argv, env, "verify")
        path = tmp_path / unit_name("verify", i)
        path.write_text(rendered)
        done = subprocess.run(["systemd-analyze", "verify", str(path)], capture_output=True, text=True, timeout=60)
        problems = [ln for ln in done.stderr.splitlines() if str(path) in ln or "Unknown" in ln or "Failed" in ln]
        assert done.returncode == 0 and not problems, done.stderr
        assert parse_unit(rendered, str(path)).exec_start_argv() == argv
        assert parse_unit(rendered, str(path)).get("Service", "Restart") == "no"


def test_cancel_during_a_trial_stops_the_unit_and_removes_it(fake_systemd, tmp_path):
    """Ctrl-C (task cancellation) mid-trial: the runner's teardown stops the unit, the port closes,
    the unit file is gone and daemon-reload ran after its removal."""
    units, state = fake_systemd
    text = experiment(VARIANT_BASE, [*SIM, *SIM_FLAGS]).replace("duration_s = 0.5", "duration_s = 20.0")
    exp = parse_experiment(text, "sd.toml")

    async def go():
        task = asyncio.create_task(run_experiment(exp, text, "sd.toml", Store(tmp_path / "r.db"), progress=lambda m: None))
        for _ in range(300):
            await asyncio.sleep(0.1)
            if any(f.read_text().count('"MainPID": 0') == 0 for f in (state / "units").glob("*.json")) \
                    if (state / "units").exists() else False:
                break
        await asyncio.sleep(1.5)  # inside the 20 s trial
        task.cancel()
        try:
            await task
        except (asyncio.CancelledError, KeyboardInterrupt):
            pass

    asyncio.run(go())
    (unit_state,) = [json.loads(f.read_text()) for f in (state / "units").glob("*.json")]
    assert unit_state["ActiveState"] == "inactive" and unit_state["supervisor"] == 0
    assert not list(units.glob("*.service"))
    (name,) = [p.name for p in (state / "started").iterdir()]
    seq = calls(state)
    i_stop = seq.index(["stop", name])
    assert ["daemon-reload"] in seq[i_stop:]
    (start_row,) = Store(tmp_path / "r.db").starts(Store(tmp_path / "r.db").runs()[0].id)
    assert not port_is_listening(start_row.port)


def test_atexit_net_stops_without_an_event_loop(fake_systemd):
    units, state = fake_systemd
    port = free_port()
    engine = _engine(units, [*SIM, *SIM_FLAGS, "--host", "127.0.0.1", "--port", str(port)], {}, port)

    async def go():
        out = await engine.start()
        assert out.ok and port_is_listening(port)
        engine.stop_sync()  # blocking: what the atexit hook runs for every unit still installed
        await engine._stop_journal()  # only so that this test's event loop closes its pipes

    asyncio.run(go())
    assert not engine.unit_path.exists() and not port_is_listening(port)
    assert engine.status_sync().active_state == "inactive"


def test_restart_under_load_is_a_crash_because_counters_reset(fake_systemd):
    """With a drop-in Restart=always, a server killed mid-trial comes back by itself: the unit is
    active again, but NRestarts and MainPID changed, so the trial's counter deltas are void."""
    units, _state = fake_systemd
    (units / "service.d").mkdir()
    (units / "service.d" / "50-restart.conf").write_text("[Service]\nRestart=always\nRestartSec=50ms\n")
    port = free_port()
    engine = _engine(units, [*SIM, *SIM_FLAGS, "--host", "127.0.0.1", "--port", str(port)], {}, port)

    async def go():
        out = await engine.start()
        assert out.ok and out.info["restarts"] == 0
        os.kill(out.pid, signal.SIGKILL)
        for _ in range(100):
            await asyncio.sleep(0.05)
            st = await engine.status()
            if st.n_restarts == 1 and st.active_state == "active":
                break
        crashed = engine.crashed()
        await engine.stop()
        return out.pid, crashed

    old_pid, crashed = asyncio.run(go())
    assert crashed is not None and crashed.failure_kind == "crash_under_load"
    assert "restarted under load (NRestarts 0 -> 1" in crashed.reason and f"MainPID {old_pid} ->" in crashed.reason
    assert crashed.info["restarts"] == 1
