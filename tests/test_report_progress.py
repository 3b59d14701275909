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
    assert p.state.total_trials == 8 and 99.0 < p.state.remaining_s <= 100.0
    p.handle(StartLaunching("a", 0, "sim"))
    assert (p.state.variant, p.state.start) == ("a", 1)
    p.handle(TrialDone("a", 0, 1, 0, 96.2, "server counter", True, "ok"))
    p.handle(TrialDone("a", 0, 1, 0, 96.2, "server counter", True, "ok"))  # the same trial again: not recounted
    assert p.state.done_trials == 1
    p.state.t0 -= 10.0
    p.handle(TrialDone("a", 0, 8, 0, None, "server counter", True, "failed"))
    assert p.state.done_trials == 2
    assert 30 < p.state.remaining_s < 40  # 10 s / 2 trials x 6 left
    assert p.state.last_tokps == 96.2 and "simulated" in p.state.tokps_text()
    text = buf.getvalue()
    assert "2/8 trials" in text and "launching sim server" in text
    assert " elapsed, 2/8 trials, about 0:00:3" in text  # each figure labelled; H:MM:SS


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


def test_time_left_is_known_from_the_first_second_and_counts_down_before_the_first_trial():
    """Before any trial finishes, the plan's estimate less the time gone (never "-:--:--")."""
    from truthput.report.progress import LiveProgress

    p = LiveProgress(console=Console(file=io.StringIO(), width=200), live=False)
    p.set_plan(total_trials=40, estimate_s=3600.0)
    p.state.t0 -= 600.0
    assert 2990 < p.state.remaining_s < 3010
    assert "0:10:00 elapsed, 0/40 trials, about 0:50:00 left" in p.state.counts_text()


def test_the_running_trial_is_shown_during_its_window_and_a_long_name_is_cut():
    """A TrialStarting event names the level and trial on the live bar while its window runs (not
    printed as a line); a long variant name is cut with an ellipsis and the counts stay on the line."""
    from truthput.events import TrialStarting
    from truthput.report.progress import LiveProgress

    buf = io.StringIO()
    con = Console(file=buf, force_terminal=True, width=120)
    name = "speculative-ngram-k3-prompt-lookup-4-max-num-seqs-128-and-more"
    with LiveProgress(console=con) as p:
        p.set_plan(total_trials=4, estimate_s=600.0)
        p.handle(TrialStarting(name, 0, 8, 1, 30.0))
        assert p.state.where() == f"{name} start 1 c=8 trial 2 (30 s window)"
        p._bar.refresh()
    out = buf.getvalue()
    assert "…" in out and "0/4" in out and "elapsed, about 0:" in out
    assert name not in out  # cut, not wrapped over the bar

    plain = io.StringIO()
    q = LiveProgress(console=Console(file=plain, width=200), live=False)
    q.handle(TrialStarting("a", 0, 8, 0, 30.0))
    assert plain.getvalue() == "" and q.state.where() == "a start 1 c=8 trial 1 (30 s window)"


def test_several_runs_on_one_display_add_up_never_more_done_than_planned():
    """tune's rounds are runs shown on one display: the second round's trials add to the total
    (6 then 6 more: "12/12", never "12/6"), and the same variant names in round 2 count again."""
    from truthput.events import RunStarted
    from truthput.report.progress import LiveProgress

    buf = io.StringIO()
    p = LiveProgress(console=Console(file=buf, width=200), live=False)
    for run in ("r1", "r2"):
        p.handle(RunStarted(run, 2, 1, "sim", True, total_trials=6, estimate_s=60.0))
        for k in range(6):
            p.handle(TrialDone(("baseline", "cand")[k % 2], k // 2, 8, 0, 90.0, "server counter", True, "ok"))
    assert p.state.done_trials == 12 and p.state.total_trials == 12
    assert "12/12 trials" in buf.getvalue() and "/6 trials" not in buf.getvalue().splitlines()[-1]
