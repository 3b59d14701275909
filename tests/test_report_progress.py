"""Live progress: counts the runner's trial events once, shows the last headline figure with its
source (labelled simulated in a simulated run), estimates the time left from the pace, plain
lines off a terminal and a rich bar on one, and never reads event text as markup."""

from __future__ import annotations

import io
import types

from rich.console import Console

from truthput.events import Note, StartFailed, StartLaunching, TrialDone


def test_plain_lines_count_trials_and_time_left():
    from truthput.report.progress import LiveProgress

    buf = io.StringIO()
    p = LiveProgress(console=Console(file=buf, width=200), live=False)
    plan = types.SimpleNamespace(order=[("a", 0), ("b", 0)], levels=[1, 8], repeats=2, estimate_s=100.0)
    p.set_plan(plan)
    assert p.state.total_trials == 8 and p.state.remaining_s == 100.0
    p.handle(StartLaunching("a", 0, "sim"))
    assert (p.state.variant, p.state.start) == ("a", 1)
    p.handle(TrialDone("a", 0, 1, 0, 96.2, "server counter", True, "ok"))
    p.handle(TrialDone("a", 0, 1, 0, 96.2, "server counter", True, "ok"))  # the same trial again: not recounted
    p.trial_done("a", 0, 1, 0, 96.2, simulated=True)  # and through the hook: not recounted either
    assert p.state.done_trials == 1
    p.state.t0 -= 10.0
    p.handle(TrialDone("a", 0, 8, 0, None, "server counter", True, "failed"))
    assert p.state.done_trials == 2
    assert 30 < p.state.remaining_s < 40  # 10 s / 2 trials x 6 left
    assert p.state.last_tokps == 96.2 and "simulated" in p.state.tokps_text()
    text = buf.getvalue()
    assert "2/8 trials" in text and "s left" in text and "launching sim server" in text


def test_usage_headline_is_labelled_as_such():
    from truthput.report.progress import LiveProgress

    p = LiveProgress(console=Console(file=io.StringIO(), width=200), live=False)
    p.handle(TrialDone("a", 0, 2, 0, 50.0, "usage placed in time: no counter", False, "ok"))
    assert p.state.tokps_text() == "50.0 tok/s [usage placed in time: no counter]"


def test_event_text_is_never_markup():
    from truthput.report.progress import LiveProgress

    buf = io.StringIO()
    p = LiveProgress(console=Console(file=buf, width=300), live=False)
    p.handle(StartFailed("v[/bold]", 0, "invalid_config", "pinned in [server].port [/]"))
    p.handle(Note("a [red]line[/red] from the server"))
    p("plain [/] text")
    text = buf.getvalue()
    assert "v[/bold]: failed: invalid_config: pinned in [server].port [/]" in text
    assert "a [red]line[/red] from the server" in text and "plain [/] text" in text


def test_live_bar_on_a_terminal():
    from truthput.report.progress import LiveProgress

    buf = io.StringIO()
    con = Console(file=buf, force_terminal=True, width=160)
    with LiveProgress(console=con) as p:
        assert p.live
        p.set_plan(total_trials=4, estimate_s=20.0)
        p.start("nospec", 0)
        p.handle(TrialDone("nospec", 0, 8, 0, 252.0, "server counter", True, "ok"))
        assert p.state.done_trials == 1
    out = buf.getvalue()
    assert "1/4" in out and "252.0 tok/s [server counter, simulated]" in out


def test_a_round_added_by_the_stopping_rule_grows_the_total():
    """The plan's 8 trials done, the rule adds a round: the total grows with it (never "9/8")."""
    from truthput.events import RoundAdded
    from truthput.report.progress import LiveProgress

    buf = io.StringIO()
    p = LiveProgress(console=Console(file=buf, width=200), live=False)
    p.set_plan(types.SimpleNamespace(order=[("a", 0), ("b", 0)], levels=[1, 8], repeats=2, estimate_s=100.0))
    for k in range(8):
        p.handle(TrialDone("a" if k < 4 else "b", 0, (1, 8)[k % 2], k // 2, 96.0, "server counter", True, "ok"))
    p.handle(RoundAdded("stopping rule: adding start round 2", 16))
    p.handle(TrialDone("a", 1, 1, 0, 96.0, "server counter", True, "ok"))
    assert p.state.total_trials == 16 and "9/16 trials" in buf.getvalue() and "/8 trials" not in buf.getvalue()[-200:]
