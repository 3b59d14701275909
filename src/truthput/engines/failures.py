"""Classify why an inference server stopped or never became ready.

Why: a sweep must record a crashed or refused config and move on (principle 2) and tell the user
in one line what went wrong. A server's log ends with generic lines ("Engine core initialization
failed. See root cause above."); the useful line is the most specific error above it. This module
finds that line with patterns taken from real vLLM logs (tests/fixtures/vllm/*.log), falls back on
the exit code (137 / SIGKILL = likely OOM-kill) and the phase the failure happened in.

Kinds (stored in `starts.failure_class`):
  oom, kv_too_small, invalid_config, bad_model, port_in_use, startup_timeout, crash_under_load,
  request_errors, exited (nothing more specific is known).
"""

from __future__ import annotations

import re
import signal
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Literal

FailureKind = Literal[
    "oom",
    "kv_too_small",
    "invalid_config",
    "bad_model",
    "port_in_use",
    "startup_timeout",
    "crash_under_load",
    "request_errors",
    "exited",
]
FAILURE_KINDS: tuple[str, ...] = FailureKind.__args__  # type: ignore[attr-defined]

# Phases the runner reports: "startup" (spawn -> ready), "load" (a trial is running; "trial" is
# accepted as an alias), "teardown" (after the runner asked the server to stop).
_LOAD_PHASES = {"load", "trial", "running", "warmup"}

EXCERPT_BEFORE = 3
EXCERPT_AFTER = 6
EXCERPT_TAIL = 20
MAX_REASON_CHARS = 300

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


@dataclass(frozen=True, slots=True)
class Failure:
    """Why a server failed: `kind` (one of FAILURE_KINDS), a one-line `reason`, the log line that
    caused it (None when no log line says) and a short log `excerpt` around that line (lines
    joined by newlines, ready for `starts.log_excerpt`; "" when there is no log)."""

    kind: FailureKind
    reason: str
    root_cause_line: str | None = None
    excerpt: str = ""

    def to_dict(self) -> dict:
        """Plain dict for JSON / the store (`starts.failure_*`, `log_excerpt`)."""
        return asdict(self)


@dataclass(frozen=True, slots=True)
class _Pattern:
    kind: FailureKind
    regex: re.Pattern[str]
    specificity: int  # higher wins when several patterns match one log
    label: str  # what the reason says before the quoted log text


def _p(kind: FailureKind, pattern: str, specificity: int, label: str) -> _Pattern:
    return _Pattern(kind, re.compile(pattern, re.IGNORECASE), specificity, label)


# Ordered by nothing: the highest specificity across the whole log wins, then the earliest line.
PATTERNS: tuple[_Pattern, ...] = (
    # Out of memory: GPU (CUDA/HIP), torch, vLLM's CPU backend NUMA check, host allocator.
    _p("oom", r"(CUDA|HIP) out of memory", 90, "GPU out of memory"),
    _p("oom", r"torch(\.cuda)?\.OutOfMemoryError", 85, "out of memory"),
    _p("oom", r"\bOutOfMemoryError\b", 80, "out of memory"),
    _p("oom", r"Available memory on node .* is less than requested memory for kv", 90,
       "not enough memory for the requested KV cache space"),
    _p("oom", r"Available memory on node .* is less than desired CPU memory utilization", 90,
       "not enough free memory for --gpu-memory-utilization (CPU backend: set VLLM_CPU_KVCACHE_SPACE)"),
    _p("oom", r"No available memory for the cache blocks", 85,
       "no memory left for the KV cache after loading the weights"),
    _p("oom", r"std::bad_alloc|Cannot allocate memory|\[Errno 12\]", 60, "host out of memory"),
    # llama.cpp (ggml) and SGLang spellings of the same. ggml names the buffer's device: a CPU
    # buffer is host memory (never "GPU" on a CPU server).
    _p("oom", r"failed to allocate CPU\w* buffer|ggml_aligned_malloc: insufficient memory", 92,
       "host out of memory (a CPU buffer could not be allocated)"),
    _p("oom", r"failed to allocate buffer for kv cache", 88, "out of memory allocating the KV cache"),
    _p("oom", r"cudaMalloc failed: out of memory|failed to allocate (CUDA|ROCm|HIP|Vulkan|Metal|SYCL)\w* buffer", 90,
       "GPU out of memory"),
    _p("oom", r"Not enough memory\. Please try to increase --mem-fraction-static", 85,
       "not enough GPU memory for the KV cache (SGLang)"),
    # KV cache cannot hold one request of max_model_len.
    _p("kv_too_small", r"To serve at least one request with the model's max seq len", 95,
       "KV cache too small for max-model-len"),
    _p("kv_too_small", r"larger than the available KV cache memory"
       r"|max seq len .* is larger than the maximum number of tokens that can be stored in KV cache",
       90, "KV cache too small for max-model-len"),
    # Invalid configuration: pydantic validation, vLLM's max_model_len check, argparse.
    _p("invalid_config", r"is greater than the derived max_model_len", 95,
       "max-model-len above the model's"),
    _p("invalid_config", r"unrecognized arguments", 90, "unrecognized command-line arguments"),
    _p("invalid_config", r"error: argument|error: invalid argument|error while handling argument", 90,
       "invalid command-line argument"),  # the last two: llama.cpp
    _p("invalid_config", r"invalid choice", 85, "invalid command-line choice"),
    # A model file that is missing, truncated or not a model (llama.cpp's GGUF loader).
    _p("bad_model", r"failed to open GGUF file", 92, "model file cannot be opened"),
    _p("bad_model", r"invalid magic characters", 92, "not a GGUF model file"),
    _p("bad_model", r"failed to read key-value pairs|not within the file bounds|failed to read tensor", 90,
       "model file truncated or damaged"),
    _p("bad_model", r"error loading model:", 70, "model file could not be loaded"),
    _p("invalid_config", r"Value error, ", 70, "invalid configuration"),
    _p("invalid_config", r"\d+ validation errors? for \w+", 50, "invalid configuration"),
    _p("invalid_config", r"\bValidationError\b", 40, "invalid configuration"),
    # Port already bound.
    _p("port_in_use", r"Address already in use|\[Errno 98\]|errno 98", 95, "port already in use"),
    _p("port_in_use", r"couldn't bind HTTP server socket", 90, "port already in use"),  # llama.cpp
    # vLLM's engine-core process died (killed, segfault): the API server notices and shuts down,
    # exiting with code 0 (tests/fixtures/vllm/fail_engine_killed_under_load.log). Least specific:
    # an OOM or other cause in the same log wins.
    _p("crash_under_load", r"engine core exited unexpectedly", 35, "vLLM engine core died"),
    _p("crash_under_load", r"EngineDeadError", 30, "vLLM engine core died"),
)

# Lines that say "something failed" without saying what: never chosen as the root cause when a
# more specific line exists.
_GENERIC = re.compile(
    r"Engine core initialization failed|See root cause above|Traceback \(most recent call last\)"
    r"|^\s*(raise|File \")|EngineCore failed to start|Worker failed|APIServer.*exited",
    re.IGNORECASE,
)
_ERRORISH = re.compile(r"\b(\w+Error|\w+Exception|Exception|FATAL|Fatal|error:|Killed|Segmentation fault)\b")


# vLLM's logger prefix: "(EngineCore pid=1) INFO 11-30 10:13:24 [file.py:12] ...". Informational
# lines never carry the root cause (every vLLM log has a WARNING mentioning "[Errno 24]").
_LEVEL = re.compile(r"\b(DEBUG|INFO|WARNING|WARN)\s+\d\d-\d\d \d\d:\d\d:\d\d\b")
_INFO = re.compile(r"\b(DEBUG|INFO)\s+\d\d-\d\d \d\d:\d\d:\d\d\b")
_WARNING = re.compile(r"\b(WARNING|WARN)\s+\d\d-\d\d \d\d:\d\d:\d\d\b")


def _clean(line: str) -> str:
    return _ANSI.sub("", line).rstrip("\r\n")


_LOG_PREFIX = re.compile(r"^\s*(\([^)]*\)\s*)?([A-Z]+\s+\d\d-\d\d \d\d:\d\d:\d\d(\.\d+)?\s+\[[^\]]*\]\s*)?")


def _message_after(line: str, match: re.Match[str]) -> str:
    """The error text of a root-cause line without the logger prefix: from the exception name
    before the match when there is one (e.g. "ValueError: ..."), else the whole message."""
    prefix = _LOG_PREFIX.match(line)
    body_start = prefix.end() if prefix else 0
    exc = re.search(r"\b[\w.]*(Error|Exception)\b:", line[body_start: match.start() + 1])
    text = line[body_start + exc.start():] if exc else line[body_start:]
    text = re.sub(r"^\s*Value error,\s*", "", text).strip()
    return text if len(text) <= MAX_REASON_CHARS else text[: MAX_REASON_CHARS - 3] + "..."


def _excerpt(lines: list[str], index: int | None) -> str:
    chosen = lines[-EXCERPT_TAIL:] if index is None else lines[max(0, index - EXCERPT_BEFORE): index + EXCERPT_AFTER + 1]
    return "\n".join(chosen)


def _signal_name(exit_code: int) -> str | None:
    """Negative codes are signals (subprocess convention); 128+N is a shell's way of saying so."""
    signum = -exit_code if exit_code < 0 else exit_code - 128 if 128 < exit_code < 160 else None
    if signum is None:
        return None
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def find_root_cause(log_lines: Sequence[str]) -> tuple[_Pattern, int] | None:
    """The most specific known error pattern in the log and the index of its first line.

    A line logged at WARNING level ranks below every other matching line whatever its pattern:
    a server can warn about a setting and then fail on something else (vLLM warns that
    max_model_len is above the derived one, then errors that the KV cache cannot hold it), and
    the error is the root cause. Among lines of the same rank the most specific pattern wins,
    then the earliest line.
    """
    best: tuple[tuple[int, int], _Pattern, int] | None = None
    for i, raw in enumerate(log_lines):
        line = _clean(raw)
        if _INFO.search(line):
            continue
        rank = 0 if _WARNING.search(line) else 1
        for pat in PATTERNS:
            key = (rank, pat.specificity)
            if pat.regex.search(line) and (best is None or key > best[0]):
                best = (key, pat, i)
    return (best[1], best[2]) if best is not None else None


def _last_error_line(lines: list[str]) -> int | None:
    """The last line that looks like an error and is not a generic wrapper line."""
    for i in range(len(lines) - 1, -1, -1):
        line = lines[i]
        if _ERRORISH.search(line) and not _GENERIC.search(line) and not _LEVEL.search(line):
            return i
    return None


def classify(exit_code: int | None, log_lines: Sequence[str], phase: str) -> Failure:
    """Classify a failure from the server's exit code (None = still running), its log lines and
    the phase ("startup", "load", "teardown") it failed in.

    Known log patterns win over exit codes; then SIGKILL (exit 137 / -9) outside teardown is a
    likely OOM-kill; then the phase decides: a server alive at the end of startup is a
    startup_timeout, one that died under load crashed, one alive under load gave request errors.
    """
    lines = [_clean(line) for line in log_lines]
    found = find_root_cause(lines)
    code_text = "still running" if exit_code is None else f"exit code {exit_code}"
    sig = _signal_name(exit_code) if exit_code is not None else None
    if sig:
        code_text += f" ({sig})"

    if found is not None:
        pat, idx = found
        match = pat.regex.search(lines[idx])
        assert match is not None
        reason = f"{pat.label}: {_message_after(lines[idx], match)}"
        kind: FailureKind = pat.kind
        if kind == "crash_under_load" and phase not in _LOAD_PHASES:
            kind = "exited"  # the engine died, but not under load
        return Failure(kind, reason, lines[idx].strip(), _excerpt(lines, idx))

    err_idx = _last_error_line(lines)
    err_line = lines[err_idx].strip() if err_idx is not None else None
    detail = f"; last error: {err_line[:MAX_REASON_CHARS]}" if err_line else ""
    in_load = phase in _LOAD_PHASES

    if sig == "SIGKILL" and phase != "teardown":
        return Failure(
            "oom",
            f"killed by SIGKILL ({code_text}) {'under load' if in_load else 'during ' + phase}: "
            f"likely the kernel's OOM killer (check `dmesg`){detail}",
            err_line,
            _excerpt(lines, err_idx),
        )
    if phase == "startup" and exit_code is None:
        return Failure("startup_timeout", f"server did not become ready in time ({code_text}){detail}",
                       err_line, _excerpt(lines, err_idx))
    if in_load and exit_code is not None:
        return Failure("crash_under_load", f"server exited under load ({code_text}){detail}",
                       err_line, _excerpt(lines, err_idx))
    if in_load:
        return Failure("request_errors", f"requests failed while the server kept running{detail}",
                       err_line, _excerpt(lines, err_idx))
    return Failure("exited", f"server exited during {phase} ({code_text}){detail}",
                   err_line, _excerpt(lines, err_idx))
