"""Live progress during a run: a rich progress bar on a terminal, plain timestamped lines otherwise.

It takes the runner's typed events (`truthput.events`): the bar counts `TrialDone` events and shows
the last trial's headline figure with its source ("server counter", or usage placed in time when
there is no counter; "simulated" in a simulated run). Nothing is parsed back out of a message, and
event text (variant names, server log lines) is printed as plain text, never as markup.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Any

from truthput.events import Event, RoundAdded, RunStarted, StartLaunching, TrialDone, TrialStarting, style_of
from truthput.experiment.levels import Level, level_label


DESCRIPTION_WIDTH = 40
"""Columns the live bar gives "variant start level trial": a long variant name is cut with an
ellipsis there instead of pushing the bar off the line."""


def clock(seconds: float) -> str:
    """H:MM:SS, as a clock reads (a duration never mistaken for a time of day: always labelled)."""
    s = max(int(round(seconds)), 0)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


@dataclass
class ProgressState:
    """What the display shows; kept separate from rendering so it is testable."""

    total_trials: int | None = None
    estimate_s: float | None = None
    done_trials: int = 0
    kept_trials: int = 0
    """Trials a resumed run already had (counted as done; the pace comes from this session's)."""
    variant: str | None = None
    start: int | None = None
    level: Level | None = None
    trial: int | None = None
    last_tokps: float | None = None
    last_source: str = "server counter"
    simulated: bool = False
    seen: set[tuple[str, int, Level, int]] = field(default_factory=set)
    t0: float = field(default_factory=time.monotonic)

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self.t0

    window_s: float | None = None
    """The running trial's timed window, while one runs (None between trials)."""
    before_run: int = 0
    """Trials counted by earlier runs shown on this display (tune's earlier rounds)."""

    @property
    def remaining_s(self) -> float | None:
        """From the pace so far; before the first trial finishes, the plan's estimate less the
        time gone (so it is known, and counts down, from the first second)."""
        if self.total_trials is None:
            return None
        left = max(self.total_trials - self.kept_trials - self.done_trials, 0)
        if self.done_trials:
            return self.elapsed_s / self.done_trials * left
        if self.estimate_s is None:
            return None
        return max(self.estimate_s - self.elapsed_s, 0.0)

    def where(self) -> str:
        parts = []
        if self.variant:
            parts.append(self.variant)
        if self.start is not None:
            parts.append(f"start {self.start}")
        if self.level is not None:
            parts.append(level_label(self.level))
        if self.trial is not None:
            parts.append(f"trial {self.trial}")
        if self.window_s:
            parts.append(f"({self.window_s:g} s window)")
        return " ".join(parts) or "starting"

    def counts_text(self) -> str:
        """'0:01:05 elapsed, 3/8 trials, about 0:02:10 left': each figure says what it is."""
        head = f"{clock(self.elapsed_s)} elapsed"
        if self.total_trials:
            head += f", {self.kept_trials + self.done_trials}/{self.total_trials} trials"
            rem = self.remaining_s
            if rem is not None:
                head += f", about {clock(rem)} left"
        return head

    def tokps_text(self) -> str:
        if self.last_tokps is None:
            return "–"
        return f"{self.last_tokps:.1f} tok/s [{self.last_source}{', simulated' if self.simulated else ''}]"

    def record_trial(self, variant: str, start: int, level: Level, trial: int, tokps: float | None,
                     simulated: bool = False, source: str = "server counter") -> bool:
        """Count a finished trial once (starts and trials 1-based); False when already counted."""
        key = (variant, start, level, trial)
        self.variant, self.start, self.level, self.trial = key
        self.window_s = None
        if tokps is not None:
            self.last_tokps, self.simulated, self.last_source = tokps, simulated, source
        if key in self.seen:
            return False
        self.seen.add(key)
        self.done_trials += 1
        return True


class LiveProgress:
    """Takes the runner's events (and plain lines); a rich bar when stderr is a terminal, plain lines otherwise."""

    def __init__(self, console: Any = None, live: bool | None = None) -> None:
        from truthput.report.console import make_console

        self.console = console or make_console(stderr=True, highlight=False)
        self.live = self.console.is_terminal if live is None else live
        self.state = ProgressState()
        self._bar: Any = None
        self._task: Any = None

    # ---- structured hooks -------------------------------------------------------------------
    def set_plan(self, plan: Any = None, *, total_trials: int | None = None, estimate_s: float | None = None) -> None:
        """From runner.Plan (starts x levels x repeats), or the numbers directly."""
        if plan is not None:
            total_trials = len(plan.order) * len(plan.levels) * plan.repeats
            estimate_s = plan.estimate_s
        self.state.total_trials, self.state.estimate_s = total_trials, estimate_s
        if self._bar is not None and self._task is not None:
            self._bar.update(self._task, total=total_trials)

    def start(self, variant: str, start_index: int) -> None:
        """A server start begins (start_index 0-based, as in the runner)."""
        self.state.variant, self.state.start = variant, start_index + 1
        self.state.level = self.state.trial = None
        self._refresh()


    # ---- events and plain lines --------------------------------------------------------------
    def handle(self, event: Event) -> None:
        """One runner event: update the state from its fields, then print its text."""
        if isinstance(event, TrialDone):
            self.state.record_trial(event.variant, event.start_index + 1, event.level, event.trial_index + 1,
                                    event.tokps, event.simulated, event.source)
        elif isinstance(event, TrialStarting):
            st = self.state
            st.variant, st.start, st.level, st.trial = (event.variant, event.start_index + 1, event.level,
                                                        event.trial_index + 1)
            st.window_s = event.window_s
            if self.live:
                self._ensure_bar()
            self._refresh()
            return  # shown by the live bar; on plain lines the finished trial says it
        elif isinstance(event, StartLaunching):
            self.state.variant, self.state.start = event.variant, event.start_index + 1
            self.state.level = self.state.trial = self.state.window_s = None
        elif isinstance(event, RoundAdded):
            self.set_plan(total_trials=self.state.before_run + event.total_trials, estimate_s=self.state.estimate_s)
        elif isinstance(event, RunStarted):
            # one display over several runs (tune's rounds): this run's trials add to what came before
            st = self.state
            st.before_run = st.kept_trials + st.done_trials
            st.seen.clear()
            if event.resumed:
                st.kept_trials += event.kept_trials
            if event.total_trials is not None:
                self.set_plan(total_trials=st.before_run + event.total_trials, estimate_s=event.estimate_s)
        self._print(event.text(), style_of(event))

    def __call__(self, msg: str) -> None:
        """A plain line (printed as text, never as markup)."""
        self._print(msg, None)

    def _print(self, text: str, style: str | None) -> None:
        from rich.text import Text

        line = Text(text, style=style or "")
        if self.live:
            self._ensure_bar()
            self._bar.console.print(line)
            self._refresh()
            return
        self.console.print(Text(self.state.counts_text() + "  ", style="dim") + line)

    # ---- rich rendering ---------------------------------------------------------------------
    def _ensure_bar(self) -> None:
        if self._bar is not None:
            return
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
        from rich.table import Column

        self._bar = Progress(TextColumn("{task.description}", markup=False,
                                        table_column=Column(max_width=DESCRIPTION_WIDTH, no_wrap=True,
                                                            overflow="ellipsis")),
                             BarColumn(bar_width=20), MofNCompleteColumn(), TextColumn("trials"),
                             TextColumn("{task.fields[times]}", markup=False),
                             TextColumn("{task.fields[tokps]}", markup=False), console=self.console, transient=False)
        self._bar.start()
        self._task = self._bar.add_task(self.state.where(), total=self.state.total_trials, tokps="", times="")

    def _refresh(self) -> None:
        if self._bar is None:
            return
        st = self.state
        rem = st.remaining_s
        times = f"{clock(st.elapsed_s)} elapsed" + (f", about {clock(rem)} left" if rem is not None else "")
        self._bar.update(self._task, completed=st.kept_trials + st.done_trials, description=st.where(),
                         tokps=st.tokps_text(), times=times)

    def close(self) -> None:
        """Stop the live bar (idempotent); plain mode has nothing to close."""
        if self._bar is not None:
            self._refresh()
            self._bar.stop()
            self._bar = None

    def __enter__(self) -> "LiveProgress":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def make_progress(console: Any = None) -> LiveProgress:
    """The progress the run command should use: live on a terminal (stderr), plain lines otherwise."""
    return LiveProgress(console=console, live=None if console is not None else sys.stderr.isatty())
