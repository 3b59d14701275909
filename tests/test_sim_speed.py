"""The simulator is fast enough to be every test's and demo's engine: hundreds of concurrent
streams, and well over 10,000 streamed tokens per second of its own (single-threaded) CPU time.

Server CPU time is read from /proc so the figure does not depend on how busy the shared cores
are with the client; wall-clock throughput is printed for the report.
"""

from __future__ import annotations

from truthput.sim.bench import measure


def test_256_streams_served_at_over_10k_tokens_per_server_cpu_second():
    m = measure(streams=256, max_tokens=100)
    assert m["tokens"] == 256 * 100  # every stream complete; client usage == server counter (checked inside)
    per_cpu_s = m["tokens"] / m["server_cpu_s"]
    print(f"\n256 streams: {m['tokens'] / m['wall_s']:,.0f} tok/s wall, {per_cpu_s:,.0f} tok per server CPU s")
    assert per_cpu_s > 10_000
