"""Interference: another process busy on the host's CPU during the window, and on the GPU (a fake
NVML: no GPU here), flags the window's throughput figures; the server's own processes do not."""

from __future__ import annotations

import subprocess
import sys
import time
from types import SimpleNamespace

from truthput.engines.interference import HostLoad
from truthput.engines.telemetry import GpuSampler
from truthput.measure.model import TrialResults
from truthput.measure.validity import check_interference

BURN = "import time\nt = time.monotonic()\nwhile time.monotonic() - t < 20: pass\n"


MEASURE = """
import json, sys, time
from truthput.engines.interference import HostLoad
host = HostLoad(server_pgids={int(sys.argv[1])})
host.begin()
time.sleep(float(sys.argv[2]))
host.end()
print(json.dumps({k: getattr(host, k) for k in ("other_cores", "server_cores", "front_cores", "cores", "reason")}))
"""


def _measure(server_pgid: int, seconds: float = 1.5) -> HostLoad:
    """HostLoad over `seconds`, measured as truthput measures it: from a process in a session of
    its own (what it starts counts as truthput's own)."""
    import json

    out = subprocess.run([sys.executable, "-c", MEASURE, str(server_pgid), str(seconds)], capture_output=True,
                         text=True, timeout=60, start_new_session=True)
    assert out.returncode == 0, out.stderr[-2000:]
    return HostLoad(server_pgids={server_pgid}, **json.loads(out.stdout.strip().splitlines()[-1]))


def _cores_of(pid: int, during) -> tuple[float, object]:
    """The cores process `pid` used while `during()` ran (its /proc ticks), and what it returned."""
    import os

    def ticks() -> int:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return int(fields[11]) + int(fields[12])

    t0, k0 = time.monotonic(), ticks()
    out = during()
    return (ticks() - k0) / os.sysconf("SC_CLK_TCK") / (time.monotonic() - t0), out


def _child_of(pid: int, timeout: float = 10.0) -> int:
    """The pid of process `pid`'s one child, once it has started (from /proc's parent links)."""
    from truthput.engines.process import _children

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        children = _children(pid)
        if children:
            return children[0]
        time.sleep(0.05)
    raise AssertionError(f"process {pid} started no child within {timeout} s")


def test_a_stranger_burning_a_core_is_counted_and_the_server_is_not():
    """What each burner really used (its own /proc ticks) against what the window's host load says:
    the server's time goes to the server, a stranger's to "other processes", whatever else the host
    runs (the suite's other workers count as others too, so the figures are compared, not fixed)."""
    server = subprocess.Popen([sys.executable, "-c", BURN], start_new_session=True)
    try:
        time.sleep(0.2)
        server_used, as_server = _cores_of(server.pid, lambda: _measure(server.pid))
        stranger = subprocess.Popen([sys.executable, "-c", BURN], start_new_session=True)
        try:
            time.sleep(0.2)
            stranger_used, with_stranger = _cores_of(stranger.pid, lambda: _measure(server.pid))
        finally:
            stranger.kill()
            stranger.wait()
    finally:
        server.kill()
        server.wait()
    assert isinstance(as_server, HostLoad) and isinstance(with_stranger, HostLoad)
    assert as_server.server_cores is not None and as_server.server_cores >= 0.8 * server_used - 0.05
    # the host's /proc/stat and the stranger's own ticks are read at slightly different moments, and
    # on a saturated host (the suite's other workers) they drift apart by a few tenths of a core over
    # 1.5 s; what must hold is that the stranger's time lands in "other processes", not the server's
    assert with_stranger.other_cores is not None and with_stranger.other_cores >= 0.6 * stranger_used - 0.05
    assert with_stranger.server_cores is not None and with_stranger.server_cores < server_used + 0.3
    assert stranger_used > 0.2, "the stranger never ran (test premise)"
    res = TrialResults()
    res.throughput.counter_window.value = 100.0
    from truthput.measure.model import Figure

    res.interference.host_other_cores = Figure(value=with_stranger.other_cores, unit="cores", source="client_clock")
    res.interference.host_cores = with_stranger.cores
    check_interference(res)
    flagged = [f.code for f in res.throughput.counter_window.flags]
    assert flagged == (["host_interference"] if with_stranger.other_cores > 0.5 else [])


def test_the_servers_cpu_is_split_into_its_front_end_and_its_children():
    """A server whose started process idles while its child (an engine) burns a core: the server's
    processes used what the child really used (its own /proc ticks; on a saturated host that is less
    than a core), the front end (the started process alone) almost nothing."""
    front = ("import subprocess, sys, time\n"
             f"child = subprocess.Popen([sys.executable, '-c', {BURN!r}])\n"
             "time.sleep(20)\n")
    server = subprocess.Popen([sys.executable, "-c", front], start_new_session=True)
    try:
        child = _child_of(server.pid)
        time.sleep(0.3)
        child_used, host = _cores_of(child, lambda: _measure(server.pid))
    finally:
        import os
        import signal

        os.killpg(server.pid, signal.SIGKILL)
        server.wait()
    assert isinstance(host, HostLoad)
    assert child_used > 0.2, "the child never ran (test premise)"
    assert host.server_cores is not None and host.server_cores >= 0.8 * child_used - 0.05
    assert host.front_cores is not None and host.front_cores < 0.1


class FakeNVML:
    """FAKE pynvml (no GPU here): one GPU, scripted processes and clocks-event reasons."""

    NVML_CLOCK_SM = 1

    def __init__(self, pids, reasons_mask):
        self.pids, self.mask = pids, reasons_mask

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        pass

    def nvmlDeviceGetCount(self):
        return 1

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetName(self, h):
        return "FAKE GPU"

    def nvmlDeviceGetUtilizationRates(self, h):
        return SimpleNamespace(gpu=90)

    def nvmlDeviceGetMemoryInfo(self, h):
        return SimpleNamespace(used=1e9)

    def nvmlDeviceGetPowerUsage(self, h):
        return 300_000

    def nvmlDeviceGetClockInfo(self, h, kind):
        return 1500

    def nvmlDeviceGetTotalEnergyConsumption(self, h):
        raise RuntimeError("not supported")

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        return self.mask

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        return [SimpleNamespace(pid=p) for p in self.pids]


def _trial_with(pids, mask, server_pgid):
    from truthput.load.schedule import LoadResult
    from truthput.load.selfcheck import SelfCheck
    from truthput.measure.names import metric_names
    from truthput.run.trial import TrialRun, TrialSetup, _interference

    sampler = GpuSampler(interval_s=0.05, nvml=FakeNVML(pids, mask)).start()
    time.sleep(0.2)
    telemetry = sampler.stop()
    res = TrialResults()
    res.throughput.counter_window.value = 100.0
    load = LoadResult(records=[], t_start=0.0, t_window_start=0.0, t_window_end=1.0, t_end=1.0, never_settled=False,
                      selfcheck=SelfCheck(0.0, 0.0, 0.0, 0.0, False, None))
    run = TrialRun(results=res, load=load, scrapes=[], t0_wall=0.0, t0_mono=0.0, t_end=1.0)
    setup = TrialSetup(base_url="http://127.0.0.1:1", names=metric_names("vllm"), engine="vllm",
                       server_pgids={server_pgid})
    host = SimpleNamespace(other_cores=None, reason="not sampled in this test", cores=2)
    _interference(run, setup, host, telemetry)
    return res


def test_gpu_strangers_and_throttling_are_flagged_and_the_server_is_not():
    server = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(20)"], start_new_session=True)
    try:
        clean = _trial_with([server.pid], 0x1, server.pid)  # 0x1: GPU idle, not a slowdown
        shared = _trial_with([server.pid, 999_999], 0x1, server.pid)
        throttled = _trial_with([server.pid], 0x4 | 0x40, server.pid)
        container = _trial_with([123_456], 0x1, server.pid)  # pids of another namespace: not compared
    finally:
        server.kill()
        server.wait()
    assert clean.throughput.counter_window.flags == []
    assert [f.code for f in shared.throughput.counter_window.flags] == ["gpu_interference"]
    assert "999999" in shared.throughput.counter_window.flags[0].reason
    (flag,) = throttled.throughput.counter_window.flags
    assert flag.code == "gpu_throttled" and "power cap" in flag.reason and "thermal slowdown (HW)" in flag.reason
    assert container.throughput.counter_window.flags == [] and "another namespace" in container.interference.note


def test_tick_rounding_never_reports_more_cores_than_the_host_has(monkeypatch):
    """/proc ticks over a short window can sum past the host's cores (a process's ticks land at its
    exit): the figure is capped, and the flag reads 'all 2 CPU cores', never '2.24 of 2'."""
    import os

    from truthput.engines.interference import HostSample

    hz = os.sysconf("SC_CLK_TCK")
    samples = iter([HostSample(busy=0, ours=0, server=0), HostSample(busy=int(2.24 * hz), ours=0, server=0)])
    host = HostLoad(cores=2)
    monkeypatch.setattr(host, "_sample", lambda: next(samples))
    clock = iter([100.0, 101.0])
    monkeypatch.setattr(time, "monotonic", lambda: next(clock))
    host.begin()
    host.end()
    assert host.other_cores == 2.0
    res = TrialResults()
    res.interference.host_other_cores = __import__("truthput.measure.methods", fromlist=["figure"]).figure(
        host.other_cores, "cores", "client_clock")
    res.interference.host_cores = 2
    res.throughput.counter_window.value = 10.0
    check_interference(res)
    reasons = [f.reason for f in res.throughput.counter_window.flags]
    assert any("all 2 CPU cores" in r for r in reasons) and not any("2.24" in r for r in reasons), reasons


SAME_GROUP = """
import json, os, subprocess, sys, time
from truthput.engines.interference import HostLoad
# a job of the same shell script: the same process group as truthput, but not started by it (a
# double fork: its parent exits, so it is no descendant of this process)
subprocess.Popen([sys.executable, "-c", "import subprocess, sys; subprocess.Popen([sys.executable, '-c', "
                  + repr(sys.argv[1]) + "])"]).wait()
time.sleep(0.3)
mine = {int(p) for p in os.listdir("/proc") if p.isdigit()}
def ticks(pid):
    with open(f"/proc/{pid}/stat") as f:
        rest = f.read().rsplit(")", 1)[1].split()
    return int(rest[11]) + int(rest[12]), int(rest[2]), int(rest[1])
stranger = [p for p in mine if p != os.getpid() and ticks(p)[1] == os.getpgrp() and ticks(p)[2] != os.getpid()]
k0, t0 = ticks(stranger[0])[0], time.monotonic()
host = HostLoad(server_pgids=set())
host.begin()
time.sleep(1.5)
host.end()
used = (ticks(stranger[0])[0] - k0) / os.sysconf("SC_CLK_TCK") / (time.monotonic() - t0)
os.kill(stranger[0], 9)
print(json.dumps({"other": host.other_cores, "used": used}))
"""


def test_a_job_in_truthputs_process_group_that_truthput_did_not_start_is_another_user():
    """Two busy processes started by the same script as truthput (so in its process group) were
    read as truthput's own: `host_other_cores` 0.0 while they took both cores, and a llama.cpp A/B
    on that host was decided without a word of interference. truthput's own is what it started."""
    import json

    burn = "import time\nt = time.monotonic()\nwhile time.monotonic() - t < 10: pass\n"
    out = subprocess.run([sys.executable, "-c", SAME_GROUP, burn], capture_output=True, text=True, timeout=60,
                         start_new_session=True)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["used"] > 0.2, "the stranger never ran (test premise)"
    assert got["other"] >= 0.6 * got["used"] - 0.05, got
