"""Live progress during a run: a rich progress bar on a terminal, plain timestamped lines otherwise.

Why a drop-in for runner.Progress: the runner reports through `progress(msg: str)`, so this class
takes the same call and *also* reads the runner's own trial lines ("<variant> start S c=N trial T:
X tok/s server counter ...") to advance the bar and show the current tok/s, which keeps it working
without changing the runner's messages. Structured hooks (set_plan, start, trial_done) are there for
a runner that calls them directly; the two paths never double-count (a trial counted through a
hook is not counted again by its line).

Every tok/s shown is the server counter's window figure of the last trial, labelled as such (and
"simulated" in a simulated run), never a client-side estimate.
"""

from __future__ import annotations

import re
import sys
import time
from dataclasses import dataclass, field
from typing import Any

TRIAL_LINE = re.compile(
    r"^(?P<variant>\S+) start (?P<start>\d+) c=(?P<conc>\d+) trial (?P<trial>\d+): "
    r"(?:(?P<tokps>[0-9.]+) tok/s(?P<rest>.*)|no counter figure)")
START_LINE = re.compile(r"^(?:\[bold\])?(?P<variant>[^\s\[]+)(?:\[/bold\])? start (?P<start>\d+): launching")


@dataclass
class ProgressState:
    """What the display shows; kept separate from rendering so it is testable."""

    total_trials: int | None = None
    estimate_s: float | None = None
    done_trials: int = 0
    variant: str | None = None
    start: int | None = None
    concurrency: int | None = None
    trial: int | None = None
    last_tokps: float | None = None
    simulated: bool = False
    seen: set[tuple[str, int, int, int]] = field(default_factory=set)
    t0: float = field(default_factory=time.monotonic)

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self.t0

    @property
    def remaining_s(self) -> float | None:
        """From the pace so far; before the first trial, from the plan's estimate."""
        if self.total_trials is None:
            return None
        left = max(self.total_trials - self.done_trials, 0)
        if self.done_trials:
            return self.elapsed_s / self.done_trials * left
        return self.estimate_s

    def where(self) -> str:
        parts = []
        if self.variant:
            parts.append(self.variant)
        if self.start is not None:
            parts.append(f"start {self.start}")
        if self.concurrency is not None:
            parts.append(f"c={self.concurrency}")
        if self.trial is not None:
            parts.append(f"trial {self.trial}")
        return " ".join(parts) or "starting"

    def tokps_text(self) -> str:
        if self.last_tokps is None:
            return "–"
        return f"{self.last_tokps:.1f} tok/s [server counter{', simulated' if self.simulated else ''}]"

    def record_trial(self, variant: str, start: int, concurrency: int, trial: int, tokps: float | None,
                     simulated: bool = False) -> bool:
        """Count a finished trial once (starts and trials 1-based); False when already counted."""
        key = (variant, start, concurrency, trial)
        self.variant, self.start, self.concurrency, self.trial = key
        if tokps is not None:
            self.last_tokps, self.simulated = tokps, simulated
        if key in self.seen:
            return False
        self.seen.add(key)
        self.done_trials += 1
        return True


class LiveProgress:
    """Callable like runner.Progress; a rich bar when stderr is a terminal, plain lines otherwise."""

    def __init__(self, console: Any = None, live: bool | None = None) -> None:
        from truthput.report.terminal import make_console

        self.console = console or make_console(stderr=True, highlight=False)
        self.live = self.console.is_terminal if live is None else live
        self.state = ProgressState()
        self._bar: Any = None
        self._task: Any = None

    # ---- structured hooks -------------------------------------------------------------------
    def set_plan(self, plan: Any = None, *, total_trials: int | None = None, estimate_s: float | None = None) -> None:
        """From runner.Plan (starts x levels x repeats), or the numbers directly."""
        if plan is not None:
            total_trials = len(plan.order) * len(plan.concurrency) * plan.repeats
            estimate_s = plan.estimate_s
        self.state.total_trials, self.state.estimate_s = total_trials, estimate_s
        if self._bar is not None and self._task is not None:
            self._bar.update(self._task, total=total_trials)

    def start(self, variant: str, start_index: int) -> None:
        """A server start begins (start_index 0-based, as in the runner)."""
        self.state.variant, self.state.start = variant, start_index + 1
        self.state.concurrency = self.state.trial = None
        self._refresh()

    def trial_done(self, variant: str, start_index: int, concurrency: int, trial_index: int,
                   tokps: float | None, simulated: bool = False) -> None:
        """A trial committed (indices 0-based, as in the runner); tokps = its server-counter figure."""
        self.state.record_trial(variant, start_index + 1, concurrency, trial_index + 1, tokps, simulated)
        self._refresh()

    # ---- the runner.Progress call -----------------------------------------------------------
    def __call__(self, msg: str) -> None:
        self._parse(msg)
        if self.live:
            self._ensure_bar()
            self._bar.console.print(msg)
            self._refresh()
        else:
            st = self.state
            head = f"[dim]{st.elapsed_s:7.1f}s"
            if st.total_trials:
                rem = st.remaining_s
                head += f" {st.done_trials}/{st.total_trials} trials"
                if rem is not None:
                    head += f", ~{rem:.0f} s left"
            self.console.print(head + "[/dim] " + msg)

    def _parse(self, msg: str) -> None:
        from rich.text import Text

        plain = Text.from_markup(msg).plain if "[" in msg else msg
        m = TRIAL_LINE.match(plain)
        if m:
            tokps = float(m["tokps"]) if m["tokps"] else None
            self.state.record_trial(m["variant"], int(m["start"]), int(m["conc"]), int(m["trial"]), tokps,
                                    "simulated" in (m["rest"] or ""))
            return
        s = START_LINE.match(msg) or START_LINE.match(plain)
        if s:
            self.state.variant, self.state.start = s["variant"], int(s["start"])
            self.state.concurrency = self.state.trial = None

    # ---- rich rendering ---------------------------------------------------------------------
    def _ensure_bar(self) -> None:
        if self._bar is not None:
            return
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, \
            TimeRemainingColumn

        self._bar = Progress(TextColumn("{task.description}", markup=False), BarColumn(), MofNCompleteColumn(),
                             TextColumn("trials"), TimeElapsedColumn(), TextColumn("left"), TimeRemainingColumn(),
                             TextColumn("{task.fields[tokps]}", markup=False), console=self.console, transient=False)
        self._bar.start()
        self._task = self._bar.add_task(self.state.where(), total=self.state.total_trials, tokps="")

    def _refresh(self) -> None:
        if self._bar is None:
            return
        self._bar.update(self._task, completed=self.state.done_trials, description=self.state.where(),
                         tokps=self.state.tokps_text())

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
