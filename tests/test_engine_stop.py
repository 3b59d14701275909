"""A server's stop is not cut short by a cancellation (a stop signal that lands mid-teardown).

The server here is a real process: a tiny HTTP server that answers /health and, on SIGTERM, takes
a second to exit, as engines that drain requests or free device memory do."""

from __future__ import annotations

import asyncio
import os
import sys
import textwrap

import pytest

from truthput.engines.base import stop_whatever_happens
from truthput.engines.ports import free_port
from truthput.engines.process import ProcessEngine

SLOW_TO_STOP = textwrap.dedent("""
    import http.server, signal, sys, time
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
        def log_message(self, *a):
            pass
    server = http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H)
    def drain(*_):
        time.sleep(1.0)
        sys.exit(0)
    signal.signal(signal.SIGTERM, drain)
    server.serve_forever()
""")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_cancel_during_a_stop_waits_for_the_server_to_exit_then_propagates(tmp_path):
    script = tmp_path / "slow_to_stop.py"
    script.write_text(SLOW_TO_STOP)
    port = free_port("127.0.0.1")

    async def go() -> tuple[int, bool]:
        engine = ProcessEngine("command", [sys.executable, str(script), str(port)], "127.0.0.1", port,
                               ready_paths=("/health",), ready_timeout_s=30, stop_grace_s=10)
        assert (await engine.start()).ok
        assert engine.pid is not None
        stopping = asyncio.create_task(stop_whatever_happens(engine))
        await asyncio.sleep(0.3)  # SIGTERM is sent; the server is draining
        assert _alive(engine.pid)
        stopping.cancel()
        with pytest.raises(asyncio.CancelledError):
            await stopping
        return engine.pid, _alive(engine.pid)

    pid, alive_after = asyncio.run(go())
    assert not alive_after, f"the server (pid {pid}) outlived a stop that was cancelled"
    assert not os.path.exists(f"/proc/{pid}")  # and it was reaped, not left a zombie
