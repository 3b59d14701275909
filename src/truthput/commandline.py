"""What the commands share (not a command): option help texts, the executor an option names, and
how a stop signal stops a long command (the first cancels it gracefully, a second kills servers)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from truthput.run.executors.base import Executor

ENGINE_HELP = "Run on this engine instead of the file's [server].engine (e.g. 'sim': the embedded simulator)."
STORE_HELP = "Results store (SQLite)."
EXECUTOR_HELP = ("Where server starts run: 'local' (this machine, one after another) or 'ray' (nodes of a Ray "
                 "cluster, in parallel; pip install 'truthput[ray]').")
ADDRESS_HELP = "With --executor ray: the cluster ('auto', the default: the one this machine is in; or HOST:PORT)."


def make_executor(kind: str, address: str | None) -> Executor:
    """The executor the --executor option names."""
    from truthput.errors import InputError

    if kind == "local":
        if address:
            raise InputError("--address is for --executor ray")
        from truthput.run.executors.local import LocalExecutor

        return LocalExecutor()
    if kind == "ray":
        from truthput.run.executors.ray_cluster import RayExecutor

        return RayExecutor(address=address)
    raise InputError(f"--executor {kind!r}: expected 'local' or 'ray'")


def stop_signals() -> list[int]:
    """The signals that stop a run: SIGTERM, and SIGHUP unless it was inherited as ignored (so
    `nohup truthput run ...` keeps running when its terminal closes)."""
    import signal

    sigs: list[int] = [signal.SIGTERM]
    if signal.getsignal(signal.SIGHUP) != signal.SIG_IGN:
        sigs.append(signal.SIGHUP)
    return sigs


def stop_task(task: asyncio.Task[Any] | None, signum: int, received: list[int]) -> None:
    """The first stop signal cancels the run (servers are stopped gracefully, the run is marked
    interrupted); a second one during that teardown kills every server's process group at once,
    and the teardown goes on recording the state."""
    import signal
    import sys

    first = not received
    received.append(signum)
    if first:
        if task is not None:
            task.cancel()
        return
    if len(received) == 2:
        from truthput.engines.process import kill_all_servers

        n = kill_all_servers()
        print(f"truthput: second {signal.Signals(signum).name}: killed {n} server process group(s) with SIGKILL; "
              "recording the run's state", file=sys.stderr, flush=True)
