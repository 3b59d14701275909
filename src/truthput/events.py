"""What a run reports while it runs, as typed events.

Why events and not strings: the live progress bar counts trials and shows the last headline
figure from the event's fields, so no display parses a human message back; and text that came
from outside (a variant name, a server log line taken as a failure reason) is plain text here,
never rich markup, so it can neither break nor restyle the display.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol, Union

from truthput.experiment.levels import Level, level_label
from truthput.text import plural


@dataclass(frozen=True)
class RunStarted:
    run_id: str
    variants: int
    levels: int
    engine: str
    simulated: bool
    resumed: bool = False
    kept_trials: int = 0
    estimate_s: float | None = None
    max_estimate_s: float | None = None
    total_trials: int | None = None
    """Trials the planned starts hold (the stopping rule may add rounds)."""

    def text(self) -> str:
        sim = " (SIMULATED)" if self.simulated else ""
        head = (f"run {self.run_id}: {plural(self.variants, 'variant')} x {plural(self.levels, 'load level')}, "
                f"engine {self.engine}{sim}")
        if self.resumed:
            head += f"; resumed, {plural(self.kept_trials, 'finished trial')} kept"
        if self.estimate_s is not None:
            head += f"; about {_minutes(self.estimate_s)}"
            if self.max_estimate_s and self.max_estimate_s > self.estimate_s * 1.05:
                head += f", at most {_minutes(self.max_estimate_s)} if the stopping rule adds starts"
        return head


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds < 600 else f"{seconds / 60:.0f} min"


@dataclass(frozen=True)
class _OfStart:
    variant: str
    start_index: int

    @property
    def who(self) -> str:
        return f"{self.variant} start {self.start_index + 1}"


@dataclass(frozen=True)
class StartLaunching(_OfStart):
    engine: str

    def text(self) -> str:
        return f"{self.who}: launching {self.engine} server"


@dataclass(frozen=True)
class StartReady(_OfStart):
    ready_s: float

    def text(self) -> str:
        return f"{self.who}: ready in {self.ready_s:.1f} s"


@dataclass(frozen=True)
class StartFailed(_OfStart):
    failure_class: str
    reason: str

    def text(self) -> str:
        return f"{self.variant}: failed: {self.failure_class}: {self.reason}"


@dataclass(frozen=True)
class _OfTrial(_OfStart):
    level: Level
    """Streams, or a `Rate` (open loop)."""
    trial_index: int

    @property
    def where(self) -> str:
        return f"{self.who} {level_label(self.level)} trial {self.trial_index + 1}"


@dataclass(frozen=True)
class TrialDone(_OfTrial):
    tokps: float | None
    source: str
    """How the headline was read ('server counter', 'usage placed in time: no counter')."""
    simulated: bool
    status: str

    def text(self) -> str:
        sim = ", simulated" if self.simulated else ""
        shown = f"{self.tokps:.1f} tok/s [{self.source}{sim}]" if self.tokps is not None else "no throughput figure"
        return f"{self.where}: {shown} {self.status}"


@dataclass(frozen=True)
class TrialStarting(_OfTrial):
    """A trial's load begins: the live display names the level and trial during a long window
    (nothing is printed for it on plain lines, where the finished trial says the same)."""

    window_s: float | None
    """The timed window (None when trials count requests)."""

    def text(self) -> str:
        return self.where + (f" ({self.window_s:g} s window)" if self.window_s else "")


@dataclass(frozen=True)
class RoundAdded:
    """The stopping rule added a round of starts: the planned total of trials grows."""

    message: str
    total_trials: int

    def text(self) -> str:
        return self.message


@dataclass(frozen=True)
class Note:
    message: str
    level: str = "info"
    """info | warning | error"""

    def text(self) -> str:
        return self.message


Event = Union[RunStarted, StartLaunching, StartReady, StartFailed, TrialStarting, TrialDone, RoundAdded, Note]

NOTE_STYLES = {"warning": "yellow", "error": "red"}


def style_of(event: Event) -> str | None:
    if isinstance(event, Note):
        return NOTE_STYLES.get(event.level)
    return "red" if isinstance(event, StartFailed) else None


class EventSink(Protocol):
    def handle(self, event: Event) -> None: ...


def emitter(progress: Callable[[str], None] | EventSink | None) -> Callable[[Event], None]:
    """A function that sends events to `progress`: its `handle` when it has one, else its
    plain-text call (a bare callable, as tests pass)."""
    if progress is None:
        return lambda _e: None
    handle = getattr(progress, "handle", None)
    if callable(handle):
        sink: Callable[[Event], None] = handle
        return sink
    plain: Callable[[str], None] = progress  # type: ignore[assignment]
    return lambda e: None if isinstance(e, TrialStarting) else plain(e.text())
