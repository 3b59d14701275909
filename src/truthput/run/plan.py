"""The plan of a run: every variant's argv resolved (parsed, never string-replaced), the order of
server starts, and every check that no server start could survive, made before any start.

Why here and not in the runner: `truthput plan` and `truthput run` must refuse the same inputs,
and the Ray executor reads the same GPU counts the checks read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from truthput.engines.factory import sim_requirements
from truthput.errors import InputError
from truthput.experiment.flagcheck import (check_llamacpp_argv, check_llamacpp_values, check_speculative_keys,
                                           check_variant_flags, check_vllm_values, vllm_vocabulary)
from truthput.experiment.argv import ServerArgv, argv_diff, int_flag, speculative_settings, variant_argv, whole_number
from truthput.experiment.engines import metric_family
from truthput.experiment.file import Experiment
from truthput.experiment.levels import Level, Rate
from truthput.text import plural

if TYPE_CHECKING:
    from truthput.measure.names import EngineMetricNames


@dataclass
class VariantPlan:
    name: str
    position: int
    is_baseline: bool
    argv: ServerArgv
    env: dict[str, str]
    diff: Any
    diff_text: list[str]
    speculative: dict[str, Any] | None


@dataclass
class Plan:
    engine: str
    variants: list[VariantPlan]
    order: list[tuple[str, int]]
    levels: list[Level]
    """Streams per closed-loop level, or a `Rate` per open-loop level."""
    repeats: int
    estimate_s: float
    max_estimate_s: float

    def variant(self, name: str) -> VariantPlan:
        return next(v for v in self.variants if v.name == name)


def _check_names(exp: Experiment, kind: str) -> None:
    """Names every start would trip over, checked before any starts: the GPU and model the
    roofline and simulator read, and the host the servers listen on."""
    import socket

    from truthput.hardware.gpus import get_gpu
    from truthput.hardware.models import get_model

    if exp.hardware is not None:
        try:
            get_gpu(exp.hardware.gpu)
        except InputError as exc:
            raise InputError(f"[hardware].gpu: {exc}") from None
    if exp.model is not None and (kind == "sim" or exp.model.profile):
        try:
            get_model(exp.model.ref)
        except InputError as exc:
            raise InputError(f"[model]: {exc}") from None
    _check_program(exp, kind)
    host = exp.server.host
    if host and kind != "external":
        try:
            socket.getaddrinfo(host, None)
        except (socket.gaierror, UnicodeError) as exc:
            raise InputError(f"[server].host {host!r}: cannot be resolved ({exc})") from None


LAUNCHED_KINDS = ("vllm", "sglang", "llamacpp", "command")
"""Kinds whose command truthput executes itself (sim replaces the program; systemd and external
servers are started by someone else)."""


def _check_program(exp: Experiment, kind: str) -> None:
    """The server's program exists and can be executed: a wrong path fails in `plan`, not after a
    run was opened."""
    import os
    import shutil

    if kind not in LAUNCHED_KINDS or not exp.server.command:
        return
    program = exp.server.command[0]
    if "{" in program:
        return  # a placeholder truthput fills in
    if os.sep in program:
        if not os.path.isfile(program):
            raise InputError(f"[server].command: {program}: no such file (the server's program)")
        if not os.access(program, os.X_OK):
            raise InputError(f"[server].command: {program}: not executable")
    elif shutil.which(program) is None:
        raise InputError(f"[server].command: {program!r} is not on PATH (give the program's full path)")


INT_FLAGS = ("--max-num-seqs", "--max-model-len", "--max-num-batched-tokens", "--block-size",
             "--tensor-parallel-size", "--pipeline-parallel-size")
"""vLLM flags that take a whole number >= 1: a typo there ("lots") fails every start otherwise."""


def metric_names_for(exp: Experiment, kind: str) -> EngineMetricNames:
    """The /metrics names a server of engine `kind` is read by (the experiment's overrides applied)."""
    from truthput.measure.names import metric_names

    return metric_names(metric_family(kind), exp.server.metric_names or None)


def max_num_seqs_warnings(exp: Experiment, plan: Plan) -> list[str]:
    """Concurrency levels above a variant's --max-num-seqs: the extra streams queue in the server
    (TTFT grows, tok/s does not), a legitimate experiment but one a user should see coming."""
    out: list[str] = []
    if exp.workload.mode == "open":
        return out
    top = max(exp.workload.concurrency)
    for v in plan.variants:
        if v.argv.has("--max-num-seqs"):
            raw = v.argv.get("--max-num-seqs")
            cap = whole_number(str(raw[-1] if isinstance(raw, list) else raw))
            if cap is not None and top > cap:
                out.append(f"{v.name}: concurrency {top} is above its --max-num-seqs {cap}: {top - cap} streams "
                           "will wait in the server's queue")
    return out


def workload_of(exp: Experiment, seed: int, tokenizer: Any = None, **rows: Any) -> Any:
    """The `load.workload.Workload` of one trial (or warm-up) of the experiment: its seed, and which
    of the run's order of the user's rows it sends (`rows`: rows_from, lane, lanes, backward)."""
    from truthput.load.workload import Workload

    return Workload.of_experiment(exp, seed, tokenizer, **rows)


def _check_trace(exp: Experiment, replay: Any) -> None:
    """A trace's requests must fit every variant's context (--max-model-len where it is set)."""
    from truthput.load.trace import context_check

    base = ServerArgv.parse(exp.server.command)
    context_check(replay, int_flag(base, ["--max-model-len"], "[server].command")
                  if base.has("--max-model-len") else None)
    if exp.workload.rates is not None or "concurrency" in exp.workload.model_fields_set:
        raise InputError("[workload] prompt_source = \"trace:...\" replays the trace's own arrival times: drop "
                         "rates / concurrency (the replay's speed is [workload.trace] speedup)")


ROW_SECONDS_WARN = 1.0
"""`plan` warns where the user's file lasts one server's timed windows only while a request takes
longer than this."""


def rows_warnings(exp: Experiment, plan: Plan) -> list[str]:
    """Whether the user's file has rows enough for each to reach one server once: the rows a start
    sends (exact where trials count requests or arrive at a rate; where streams run timed windows,
    how long a request must take for the file to last) against the rows the file has. Later rounds
    go on through the file and begin again at its end on fresh servers, which no cache has seen.
    Trials that do send a row again to the same server are flagged `workload_repeats`."""
    wl, m = exp.workload, exp.measure
    n = workload_of(exp, 0).n_rows
    if not n:
        return []
    where = f"{wl.prompt_source} has {n} rows"
    flagged = "rows will be sent again to the same server (those trials are flagged workload_repeats)"
    if wl.requests is not None:
        need = len(plan.levels) * m.repeats * wl.requests
        return [f"{where}, but each start sends {need} ({plural(len(plan.levels), 'level')} x "
                f"{plural(m.repeats, 'trial')} x {plural(wl.requests, 'request')}): {flagged}"] if need > n else []
    window = (wl.duration_s or 0.0) + wl.warmup_s
    if wl.mode == "open":
        need = int(sum(float(r) for r in plan.levels) * window * m.repeats)
        return [f"{where}, but at the planned rates each start sends about {need}: {flagged}"] if need > n else []
    stream_s = sum(int(c) for c in plan.levels) * window * m.repeats  # stream-seconds one start drives
    if stream_s / n <= ROW_SECONDS_WARN:
        return []
    return [f"{where}: timed windows take as many as the server answers, and it lasts a start ({stream_s:.0f} "
            f"stream-seconds) only while a request takes at least {stream_s / n:.1f} s; else {flagged}"]


def checks_vllm_flags(kind: str) -> bool:
    """Whether a plan of engine `kind` checks its flags as vLLM's: the simulator (vLLM's command
    line) and any engine read as vLLM that truthput starts (not a server already running)."""
    return kind == "sim" or (metric_family(kind) == "vllm" and kind != "external")


def vocabulary_lines(exp: Experiment, kind: str) -> list[str]:
    """What `plan` says of the vLLM flags it checked: against which vLLM (installed, or the bundled
    table), or that a named release has no table here and they were not checked."""
    from truthput.experiment.flagcheck import vocabulary_note

    if not checks_vllm_flags(kind):
        return []
    return [vocabulary_note(exp.server.command, exp.server.engine_version)]


def address_warnings(exp: Experiment) -> list[str]:
    """A variant that sets the server's address: truthput puts its own --host/--port on every
    start (a free port each time, or [server] port), so the variant's value is not what runs."""
    if exp.server.engine == "external":
        return []
    return [f"{v.name}: sets {flag}, which truthput replaces on every start (a free port each time; "
            "[server] host / port pin them)" for v in exp.variant for flag in v.set if flag in ("--host", "--port")]


def _check_variant_argv(exp: Experiment, name: str, argv: ServerArgv) -> None:
    """What no server start can survive, refused before any starts: a NUL byte in an argument (the
    exec'd argv would be cut there) and more GPUs (tensor x pipeline parallel) than [hardware] has."""
    where = f"[[variant]] {name!r}"
    for i, word in enumerate(argv.to_argv()):
        if "\x00" in word:
            raise InputError(f"{where}: argument {i} ({word.split(chr(0))[0]!r}...) contains a NUL byte")
    if argv.engine == "vllm":
        for flag in INT_FLAGS:
            int_flag(argv, (flag,), where)
        if argv.has("--gpu-memory-utilization"):
            raw = argv.get("--gpu-memory-utilization")
            try:
                util = float(str(raw[-1] if isinstance(raw, list) else raw))
            except ValueError:
                util = float("nan")
            if not 0.0 < util <= 1.0:
                raise InputError(f"{where}: --gpu-memory-utilization {raw!r}: expected a fraction in (0, 1]")
        if argv.has("--max-model-len"):
            raw = argv.get("--max-model-len")
            limit = whole_number(str(raw[-1] if isinstance(raw, list) else raw))
            ins, outs = exp.workload.input_tokens, exp.workload.output_tokens  # (a distribution: not checked)
            if limit is not None and isinstance(ins, int) and isinstance(outs, int) and limit < ins + outs:
                raise InputError(f"{where}: --max-model-len {limit} is shorter than each request's {ins} prompt + "
                                 f"{outs} output tokens ([workload]): the server would refuse every request")
    if exp.hardware is None:
        return
    tp = int_flag(argv, ("--tensor-parallel-size",), where)
    pp = int_flag(argv, ("--pipeline-parallel-size",), where)
    if tp * pp > exp.hardware.count:
        raise InputError(f"{where}: --tensor-parallel-size {tp} x --pipeline-parallel-size {pp} = {tp * pp} GPUs, "
                        f"but [hardware].count = {exp.hardware.count}")


def _values(argv: ServerArgv) -> list[tuple[str, str | None]]:
    """The command's (spelling, value) pairs a start uses: not --host / --port, which truthput sets
    on every start itself (an imported unit's `--port ${PORT}` is never run)."""
    return [(f.spelling, f.value) for f in argv.flags if f.name not in ("--host", "--port")]


def _request_tokens(exp: Experiment) -> tuple[int, int] | None:
    """The largest prompt and output tokens a request of the workload asks, where set as numbers
    (a trace: its longest request); None where the workload's lengths are not known here."""
    wl = exp.workload
    if wl.replays_trace:
        reqs = [r for r in workload_of(exp, 0).trace.requests if r.input_tokens is not None]
        return max(((r.input_tokens, r.output_tokens or 0) for r in reqs), key=sum, default=None)
    if wl.prompt_source == "synthetic" and isinstance(wl.input_tokens, int) and isinstance(wl.output_tokens, int):
        return wl.input_tokens, wl.output_tokens
    return None


def _check_duplicates(variants: list[VariantPlan]) -> None:
    """Two variants that would start the very same server (same argv, same environment) compare a
    configuration with itself: almost always a typo or a flag that is already at that value."""
    import json

    from truthput.experiment.argv import normalised_settings

    seen: dict[tuple[str, tuple[tuple[str, str], ...]], str] = {}
    for vp in variants:
        # what the command asks for, whatever its spelling ("--flag=v", "--flag v", an alias)
        key = (json.dumps(normalised_settings(vp.argv), sort_keys=True, default=str), tuple(sorted(vp.env.items())))
        if key in seen:
            raise InputError(f"[[variant]] {vp.name!r} starts the same server as {seen[key]!r} (same command line "
                             "and environment): its `set`/`remove` change nothing; give it a different setting or "
                             "drop it")
        seen[key] = vp.name


def _runs_vllm(argv: ServerArgv) -> bool:
    """A command that runs vLLM itself (`vllm serve`, `python -m vllm.entrypoints...`): its flags are
    vLLM's. (A unit or command running something else, a wrapper or truthput's own simulator, has
    flags of its own.) On the simulator (engine sim) the command is always read as vLLM's."""
    import os

    return any(os.path.basename(w) == "vllm" or w.startswith("vllm.entrypoints") for w in argv.program)


def _runs_llama_server(argv: ServerArgv) -> bool:
    """A command that runs llama.cpp's server itself (its flags are llama-server's own)."""
    import os

    return any(os.path.basename(w).startswith("llama-server") for w in argv.program)


def _check_port(exp: Experiment, kind: str) -> None:
    """A fixed `[server] port` that something else already listens on: every start would fail
    `port_in_use`, so `plan` and `run` refuse it (a server truthput starts itself only)."""
    import socket

    port = exp.server.port
    if not port or kind in ("external", "systemd"):
        return
    host = exp.server.host or "127.0.0.1"
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        if s.connect_ex((host, port)) == 0:
            raise InputError(f"[server].port {port}: something already listens on {host}:{port}, so every start "
                             "would fail (port_in_use): stop it, or leave port unset for a free port each start")


def build_plan(exp: Experiment, engine: str | None = None) -> Plan:
    """Resolve every variant's argv (parsed, never string-replaced) and the order of server starts:
    the one validation `plan` and `run` both call, so they refuse the same things."""
    from truthput.analyze.design import estimate_plan_time, interleaved_order
    from truthput.experiment.engines import ENGINE_KINDS

    kind = engine or exp.server.engine
    if kind not in ENGINE_KINDS:
        import difflib

        near = difflib.get_close_matches(kind, ENGINE_KINDS, n=1, cutoff=0.6)
        raise InputError(f"--engine {kind!r}: expected one of {', '.join(ENGINE_KINDS)}"
                         + (f": did you mean {near[0]!r}?" if near else ""))
    if kind == "sim":
        sim_requirements(exp)
    _check_names(exp, kind)
    from truthput.engines.cpus import check_cores

    check_cores(exp.server.cpus, "[server].cpus")
    check_cores(exp.workload.client_cpus, "[workload].client_cpus")
    if exp.server.cpus and exp.workload.client_cpus and set(exp.server.cpus) & set(exp.workload.client_cpus):
        raise InputError("[server].cpus and [workload].client_cpus share core(s) "
                        f"{sorted(set(exp.server.cpus) & set(exp.workload.client_cpus))}: pinning is for keeping "
                        "them apart")
    base = ServerArgv.parse(exp.server.command, engine=metric_family(kind))
    checks_vllm = metric_family(kind) == "vllm" and kind != "external"
    vocab = vllm_vocabulary(tuple(exp.server.command), exp.server.engine_version) if checks_vllm_flags(kind) \
        else None
    vllm_argv = kind == "sim" or (checks_vllm and _runs_vllm(base))
    if vllm_argv:
        # the baseline's own flags too: the simulator would otherwise run a typo as "a flag it
        # does not model", and the verdict compare a server that is not the one written
        check_variant_flags("[server].command", [f.spelling.split("=", 1)[0] for f in base.flags], [], vocab=vocab)
        check_vllm_values("[server].command", _values(base), vocab)
    llama = metric_family(kind) == "llamacpp" and _runs_llama_server(base)
    if llama:
        check_variant_flags("[server].command", [f.spelling.split("=", 1)[0] for f in base.flags], [], "llamacpp")
        check_llamacpp_values("[server].command", _values(base))
        request_tokens = _request_tokens(exp)  # once: every variant is checked against the same workload
        check_llamacpp_argv("[server].command", base, request_tokens)
    _check_port(exp, kind)
    variants: list[VariantPlan] = []
    for pos, v in enumerate(exp.variant):
        if checks_vllm:
            check_variant_flags(f"[[variant]] {v.name!r}", v.set, v.remove, vocab=vocab)
        elif llama:
            check_variant_flags(f"[[variant]] {v.name!r}", v.set, v.remove, "llamacpp")
        argv = variant_argv(base, set=v.set, remove=v.remove, where=f"[[variant]] {v.name!r}")
        if llama:
            check_llamacpp_values(f"[[variant]] {v.name!r}", _values(argv))
            check_llamacpp_argv(f"[[variant]] {v.name!r}", argv, request_tokens)
        elif vllm_argv:
            check_vllm_values(f"[[variant]] {v.name!r}", _values(argv), vocab)
        try:
            spec = speculative_settings(argv)
        except InputError as exc:
            raise InputError(f"[[variant]] {v.name!r}: {exc}") from None
        if checks_vllm and vocab is not None:
            check_speculative_keys(f"[[variant]] {v.name!r}", spec, vocab)
        _check_variant_argv(exp, v.name, argv)
        if llama and exp.workload.cache == "reset" and not argv.has("--slot-save-path"):
            raise InputError(f"[[variant]] {v.name!r}: [workload] cache = \"reset\" needs --slot-save-path DIR in "
                             "its llama-server command (llama-server erases its slots only then)")
        diff = argv_diff(base, argv)
        variants.append(VariantPlan(
            name=v.name, position=pos, is_baseline=(v.name == exp.experiment.baseline), argv=argv,
            env={**exp.server.env, **v.env}, diff=diff.to_dict(), diff_text=str(diff).splitlines() or ["(no change)"],
            speculative=spec))
    _check_duplicates(variants)
    order = interleaved_order([v.name for v in variants], exp.measure.starts, exp.experiment.seed,
                              randomized=exp.measure.randomize_order)
    wl = exp.workload
    # a trial is its window plus ramp-up, drain and scrapes (~3 s); a start is load + readiness
    restart_s = {"sim": 1.5 + exp.sim.startup_s, "external": 0.0}.get(kind, 60.0)
    levels, trial_s = wl.levels, (wl.duration_s or 30.0) + 3.0
    workload = workload_of(exp, 0)  # its source read as a start would read it: bad rows refused here
    if wl.replays_trace:  # one level: the trace's own rate over the slice replayed, its span a trial
        replay = workload.trace
        _check_trace(exp, replay)
        levels, trial_s = [Rate(round(replay.rate, 4))], replay.offsets[-1] + 3.0
    cost = estimate_plan_time(len(variants), len(levels), exp.measure.starts, exp.measure.repeats,
                              restart_s=restart_s, trial_s=trial_s, warmup_s=wl.warmup_s,
                              max_starts=exp.measure.planned_max_starts)
    return Plan(engine=kind, variants=variants, order=order, levels=levels,
                repeats=exp.measure.repeats, estimate_s=cost.total_s, max_estimate_s=cost.max_total_s)
