"""Turn (experiment, variant argv) into an engine to start.

`engine = "sim"` (or `--engine sim`) runs the same argv on the embedded simulator: the program part
of the argv is replaced by `python -m truthput.sim serve` and the simulator is told the hardware and
model from the experiment. The core never imports `truthput.sim`; it launches it like any server.
"""

from __future__ import annotations

import dataclasses
import sys

from truthput.engines.base import LogSink
from truthput.engines.external import ExternalEngine
from truthput.engines.ports import free_port
from truthput.engines.process import ProcessEngine
from truthput.errors import InputError
from truthput.experiment.argv import ServerArgv
from truthput.experiment.file import Experiment

READY_PATHS = {
    "vllm": ("/health", "/v1/models"),
    "sim": ("/health", "/v1/models"),
    "sglang": ("/health", "/v1/models"),
    "llamacpp": ("/health", "/v1/models"),
    "command": ("/health", "/v1/models"),
}


def sim_requirements(exp: Experiment) -> None:
    missing = [s for s in ("hardware", "model") if getattr(exp, s) is None]
    if missing:
        raise InputError(
            "the simulator needs " + " and ".join(f"[{m}]" for m in missing)
            + " in the experiment file (e.g. [hardware] gpu = \"RTX 3090\", count = 2; [model] profile = \"qwen3.6-27b-5.5bit\")")


def sim_argv(exp: Experiment, argv: ServerArgv, host: str, port: int, seed: int) -> list[str]:
    assert exp.hardware is not None and exp.model is not None
    served = dataclasses.replace(argv, program=()).with_host_port(host, port).to_argv()
    extra = ["--sim-gpu", exp.hardware.gpu, "--sim-model", exp.model.ref, "--noise", repr(exp.sim.noise),
             "--seed", str(seed), "--sim-startup-s", repr(exp.sim.startup_s)]
    if exp.sim.profile:
        extra += ["--sim-profile", exp.sim.profile]
    if exp.sim.acceptance:
        extra += ["--sim-acceptance", ",".join(str(a) for a in exp.sim.acceptance)]
    if exp.sim.repetition is not None:
        extra += ["--sim-repetition", repr(exp.sim.repetition)]
    if exp.sim.copy_span is not None:
        extra += ["--sim-copy-span", repr(exp.sim.copy_span)]
    return [sys.executable, "-m", "truthput.sim", "serve", *served, *extra]


def make_engine(exp: Experiment, engine_kind: str, argv: ServerArgv, env: dict[str, str], seed: int,
                log_sink: LogSink | None = None, *, run_id: str | None = None, variant: str | None = None,
                start_index: int | None = None):
    """Returns (engine, launched argv). run_id / variant / start_index only name systemd units."""
    srv = exp.server
    if engine_kind == "external":
        return ExternalEngine(srv.url or ""), []
    host = srv.host or "127.0.0.1"
    port = srv.port or free_port(host)
    if engine_kind == "sim":
        sim_requirements(exp)
        launched = sim_argv(exp, argv, host, port, seed)
        env = {"VLLM_LOG_STATS_INTERVAL": repr(exp.sim.log_stats_interval_s), **env}
    elif any("{port}" in a for a in argv.to_argv()):
        # a command that spells its own port option: truthput fills in the placeholders instead
        launched = [a.replace("{port}", str(port)).replace("{host}", host) for a in argv.to_argv()]
    else:
        launched = argv.with_host_port(host, port).to_argv()
    ready: tuple[str, ...] = READY_PATHS.get(engine_kind, ("/health", "/v1/models"))
    if engine_kind == "systemd":
        return _systemd_engine(exp, launched, env, host, port, seed, log_sink, run_id, variant, start_index), launched
    if engine_kind == "command" and srv.ready_url:
        ready = (srv.ready_url,)
    engine = ProcessEngine(engine_kind, launched, host, port, env=env, ready_paths=ready,
                           ready_timeout_s=srv.ready_timeout_s, stop_grace_s=srv.stop_grace_s,
                           log_sink=log_sink, port_pinned=srv.port is not None, cpus=srv.cpus)
    return engine, launched


def _systemd_engine(exp: Experiment, launched: list[str], env: dict[str, str], host: str, port: int, seed: int,
                    log_sink: LogSink | None, run_id: str | None, variant: str | None, start_index: int | None):
    """The variant's unit (the experiment's [server.systemd_unit], ExecStart= = launched, Restart=no)
    under a run-specific name; without a run id the name is made unique from seed, port and time."""
    import time

    from truthput.engines.systemd import SystemdEngine, render_variant_unit, unit_name

    srv = exp.server
    if run_id is not None:
        name = unit_name(run_id, variant, start_index)
    else:
        name = unit_name(exp.experiment.name, variant, f"s{seed}", f"p{port}", f"{time.time_ns() // 1_000_000:x}")
    ref = srv.systemd_unit
    text = render_variant_unit(ref.text if ref else None, ref.path if ref else None, launched, env,
                               label=name.removesuffix(".service"))
    return SystemdEngine(name, text, host, port, user=srv.user, ready_paths=READY_PATHS["vllm"],
                         ready_timeout_s=srv.ready_timeout_s, stop_grace_s=srv.stop_grace_s, log_sink=log_sink,
                         port_pinned=srv.port is not None)
