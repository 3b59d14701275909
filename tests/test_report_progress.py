"""Live progress: counts the runner's trial lines once, shows the server-counter tok/s (labelled),
estimates the time left from the pace, plain lines off a terminal and a rich bar on one."""

from __future__ import annotations

import io
import types

from rich.console import Console


def test_plain_lines_count_trials_and_time_left():
    from truthput.report.progress import LiveProgress

    buf = io.StringIO()
    p = LiveProgress(console=Console(file=buf, width=200), live=False)
    plan = types.SimpleNamespace(order=[("a", 0), ("b", 0)], concurrency=[1, 8], repeats=2, estimate_s=100.0)
    p.set_plan(plan)
    assert p.state.total_trials == 8 and p.state.remaining_s == 100.0
    p("[bold]a[/bold] start 1: launching sim server")
    assert (p.state.variant, p.state.start) == ("a", 1)
    p("a start 1 c=1 trial 1: 96.2 tok/s server counter (simulated) ok")
    p("a start 1 c=1 trial 1: 96.2 tok/s \\[server counter, simulated] ok")  # same trial, newer wording: not recounted
    p.trial_done("a", 0, 1, 0, 96.2, simulated=True)  # and through the hook: not recounted either
    assert p.state.done_trials == 1
    p.state.t0 -= 10.0  # 10 s for one trial -> 7 left -> ~70 s
    p("a start 1 c=8 trial 1: no counter figure failed")
    assert p.state.done_trials == 2
    assert 30 < p.state.remaining_s < 40  # 10 s / 2 trials x 6 left
    assert p.state.last_tokps == 96.2 and "simulated" in p.state.tokps_text()
    text = buf.getvalue()
    assert "2/8 trials" in text and "s left" in text and "launching sim server" in text
    assert "[bold]" not in text  # markup rendered, not printed


def test_live_bar_on_a_terminal():
    from truthput.report.progress import LiveProgress

    buf = io.StringIO()
    con = Console(file=buf, force_terminal=True, width=160)
    with LiveProgress(console=con) as p:
        assert p.live
        p.set_plan(total_trials=4, estimate_s=20.0)
        p.start("nospec", 0)
        p("nospec start 1 c=8 trial 1: 252.0 tok/s server counter (simulated) ok")
        assert p.state.done_trials == 1
    out = buf.getvalue()
    assert "1/4" in out and "252.0 tok/s [server counter, simulated]" in out
