"""vLLM-format log lines: the periodic throughput and spec-decode lines, start-up and errors.

The periodic lines are computed as vLLM's LoggingStatLogger / SpecDecodingLogging compute them:
token counts accumulated per engine step since the last log, divided by the monotonic time since
the last log. So a line's generation throughput equals the generation-token counter's rate over
that line's own interval (and not over anyone's timed window): that is the fact the seed's
notes got wrong, and the sim must reproduce it faithfully.
"""

from __future__ import annotations

import os
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, TextIO

#: Source locations as vLLM 0.32 prints them.
_LOC_STATS = "loggers.py:335"
_LOC_SPEC = "metrics.py:120"


def vllm_prefix(level: str = "INFO", loc: str = "api_server.py:1", process: str = "APIServer") -> str:
    """`(APIServer pid=N) INFO 11-30 10:10:26 [loggers.py:335] ` as vLLM 0.32's logger formats it
    (local time; the process tag names which of vLLM's processes wrote the line)."""
    return f"({process} pid={os.getpid()}) {level} {time.strftime('%m-%d %H:%M:%S')} [{loc}] "


def emit(line: str, out: TextIO | None = None) -> None:
    """Print one line and flush, so a runner reading the pipe sees it at once."""
    stream = out or sys.stdout
    stream.write(line + "\n")
    stream.flush()


def throughput_line(engine: int, prompt_tps: float, gen_tps: float, running: int, waiting: int,
                    kv_usage: float, prefix_hit_rate: float | None, preemptions: int = 0) -> str:
    """The 'Engine 000: Avg prompt throughput ...' message (vLLM's %-formats): the prefix-cache
    part only with prefix caching on (`prefix_hit_rate` not None), preemptions only when some."""
    line = (
        "Engine %03d: Avg prompt throughput: %.1f tokens/s, Avg generation throughput: %.1f tokens/s, "
        "Running: %d reqs, Waiting: %d reqs" % (engine, prompt_tps, gen_tps, running, waiting)
    )
    if preemptions:
        line += ", Preemptions: %d" % preemptions
    line += ", GPU KV cache usage: %.1f%%" % (kv_usage * 100)
    if prefix_hit_rate is not None:
        line += ", Prefix cache hit rate: %.1f%%" % (prefix_hit_rate * 100)
    return line


def spec_line(drafts: int, draft_tokens: int, accepted: int, accepted_per_pos: list[int],
              elapsed: float) -> str:
    """The 'SpecDecoding metrics: ...' message (vLLM's formulas and %-formats)."""
    draft_tps = draft_tokens / elapsed if elapsed > 0 else 0.0
    accepted_tps = accepted / elapsed if elapsed > 0 else 0.0
    rate = accepted / draft_tokens * 100 if draft_tokens > 0 else float("nan")
    mean_len = 1 + accepted / drafts
    rates = ", ".join(f"{a / drafts:.3f}" for a in accepted_per_pos)
    return (
        "SpecDecoding metrics: Mean acceptance length: %.2f, Accepted throughput: %.2f tokens/s, "
        "Drafted throughput: %.2f tokens/s, Accepted: %d tokens, Drafted: %d tokens, "
        "Per-position acceptance rate: %s, Avg Draft acceptance rate: %.1f%%"
        % (mean_len, accepted_tps, draft_tps, accepted, draft_tokens, rates, rate)
    )


@dataclass
class IntervalStats:
    """Counts accumulated since the last log line."""

    prompt_tokens: int = 0
    generation_tokens: int = 0
    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)


PREFIX_WINDOW_REQUESTS = 1000
"""vLLM's log line gives the prefix-cache hit rate over its last this many requests."""


class StatsLogger:
    """Accumulates per-step counts and prints vLLM's two lines every interval.

    `history` keeps (t_start, t_end, generation_tokens) per printed line so tests can check a
    line against the counter over exactly its interval.
    """

    def __init__(self, spec_k: int, clock: Callable[[], float] = time.monotonic,
                 out: TextIO | None = None, prefix_caching: bool = False) -> None:
        self.spec_k = spec_k
        self.clock = clock
        self.out = out
        self.prefix_caching = prefix_caching
        self.stats = IntervalStats(accepted_per_pos=[0] * spec_k)
        self.spec = IntervalStats(accepted_per_pos=[0] * spec_k)
        """Spec-decode counts since the last SpecDecoding line: vLLM resets them only when it
        prints one, and prints one only when there were drafts."""
        self.last_log_time = clock()
        self.last_spec_time = self.last_log_time
        self.last_prompt_tps = 0.0
        self.last_gen_tps = 0.0
        self.history: list[tuple[float, float, int]] = []
        self.lookups: deque[tuple[int, int]] = deque(maxlen=PREFIX_WINDOW_REQUESTS)
        """(prompt tokens looked up, hit) of the last requests: the log line's rolling hit rate."""

    def record_lookup(self, queries: int, hits: int) -> None:
        self.lookups.append((queries, hits))

    def prefix_hit_rate(self) -> float | None:
        """The rolling hit rate vLLM's log line prints (None: prefix caching off)."""
        if not self.prefix_caching:
            return None
        q = sum(a for a, _ in self.lookups)
        return sum(b for _, b in self.lookups) / q if q else 0.0

    def record_step(self, prompt_tokens: int, generation_tokens: int, drafts: int = 0,
                    draft_tokens: int = 0, accepted: int = 0,
                    accepted_per_pos: list[int] | None = None) -> None:
        s = self.stats
        s.prompt_tokens += prompt_tokens
        s.generation_tokens += generation_tokens
        if drafts:
            for acc in (s, self.spec):
                acc.drafts += drafts
                acc.draft_tokens += draft_tokens
                acc.accepted += accepted
                if accepted_per_pos:
                    for i, a in enumerate(accepted_per_pos):
                        acc.accepted_per_pos[i] += a

    def log(self, running: int, waiting: int, kv_usage: float) -> list[str]:
        """Print the interval's lines (none when idle twice in a row, as vLLM logs those at debug)."""
        now = self.clock()
        elapsed = now - self.last_log_time
        s = self.stats
        prompt_tps = s.prompt_tokens / elapsed if elapsed > 0 else 0.0
        gen_tps = s.generation_tokens / elapsed if elapsed > 0 else 0.0
        lines: list[str] = []
        if any((prompt_tps, gen_tps, self.last_prompt_tps, self.last_gen_tps)):
            lines.append(vllm_prefix("INFO", _LOC_STATS)
                         + throughput_line(0, prompt_tps, gen_tps, running, waiting, kv_usage,
                                           self.prefix_hit_rate()))
            sp = self.spec
            if sp.drafts:
                lines.append(vllm_prefix("INFO", _LOC_SPEC)
                             + spec_line(sp.drafts, sp.draft_tokens, sp.accepted, sp.accepted_per_pos,
                                         now - self.last_spec_time))
                self.spec = IntervalStats(accepted_per_pos=[0] * self.spec_k)
                self.last_spec_time = now
            self.history.append((self.last_log_time, now, s.generation_tokens))
        self.last_prompt_tps, self.last_gen_tps = prompt_tps, gen_tps
        self.stats = IntervalStats(accepted_per_pos=[0] * self.spec_k)
        self.last_log_time = now
        for line in lines:
            emit(line, self.out)
        return lines
