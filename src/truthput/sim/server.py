"""The simulated vLLM OpenAI-compatible server (aiohttp): /health, /v1/models, /v1/completions,
/v1/chat/completions, /metrics, /tokenize, /version.

It behaves like vLLM where measurement looks: SSE chunk shapes, multi-token chunks under
speculation, stream_options usage, vLLM's 400 for over-long requests, vLLM's metric names and log
lines, start-up failures in vLLM's wording with exit code 1. Its speed is the physics model's
(truthput.hardware.physics.decode_step) -- a SIMULATOR, and it says so in its banner.

Per-token work is kept small: each request pre-encodes its chunk JSON around the text field, and
the engine wakes a stream once per step, not once per token.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import sys
import time
import uuid
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

from truthput.errors import SpecError
from truthput.sim import textgen
from truthput.sim.engine import EngineLimits, SimEngine, SimRequest, StepShape, method_family
from truthput.sim.flags import SimServeConfig
from truthput.sim.logs import StatsLogger, emit, vllm_prefix
from truthput.sim.metrics import SimMetrics

GiB = 1024**3
SIM_VERSION = "0.0.0+truthput.sim"
_PROM_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class StartupFailure(Exception):
    """Start-up refused the way vLLM refuses (memory plan, bad max_model_len): exit code 1."""

    def __init__(self, lines: list[str]) -> None:
        super().__init__(lines[-1] if lines else "start-up failed")
        self.lines = lines


@dataclass
class SimSetup:
    """What start-up resolved: hardware, model, efficiency and the limits the engine runs with."""

    gpu: Any
    model: Any
    eff: Any
    profile_meta: dict
    max_model_len: int
    kv_capacity_tokens: int
    plan: Any
    bw_factor: float


def _physics_method(family: str | None) -> str | None:
    return {"mtp": "mtp", "eagle": "eagle", "ngram": "ngram", "draft_model": "draft_model"}.get(family or "")


def load_efficiency(path: str):
    """--sim-profile: calibrate.load_profile when present, else a JSON of Efficiency's fields."""
    from truthput.hardware.physics import Efficiency

    try:
        from truthput.sim.calibrate import load_profile  # written by the calibration module
    except ImportError:
        load_profile = None
    if load_profile is not None:
        eff, meta = load_profile(path)
        return eff, dict(meta or {})
    try:
        raw = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise SpecError(f"--sim-profile {path}: cannot read JSON ({exc})") from exc
    fields = raw.get("efficiency", raw)
    known = {k: fields[k] for k in ("bw_frac", "flops_frac", "step_overhead_s", "tp_latency_s") if k in fields}
    return Efficiency(**known), {"path": path}


def resolve_setup(cfg: SimServeConfig, eff=None) -> SimSetup:
    """Resolve model, GPU, efficiency and the memory plan; StartupFailure in vLLM's words."""
    from truthput.hardware.gpus import get_gpu
    from truthput.hardware.models import get_model
    from truthput.hardware.physics import Efficiency, memory_plan

    if cfg.model and Path(cfg.model).expanduser().is_dir():
        model = get_model(cfg.model)
    elif cfg.sim_model:
        model = get_model(cfg.sim_model)
    else:
        raise SpecError(
            f"sim serve: no model profile for {cfg.model!r}: pass --model DIR (a directory with "
            "config.json) or --sim-model NAME (or env TRUTHPUT_SIM_MODEL)"
        )
    if not cfg.sim_gpu:
        raise SpecError("sim serve: no GPU given: pass --sim-gpu NAME (or env TRUTHPUT_SIM_GPU), e.g. 'RTX 3090'")
    gpu = get_gpu(cfg.sim_gpu)
    meta: dict = {}
    if eff is None:
        if cfg.sim_profile:
            eff, meta = load_efficiency(cfg.sim_profile)
        else:
            eff = Efficiency()
    bw_factor = 1.0
    if cfg.noise > 0:
        bw_factor = max(0.5, 1.0 + random.Random(cfg.seed ^ 0xB4D).gauss(0.0, cfg.noise))
        eff = replace(eff, bw_frac=eff.bw_frac * bw_factor)

    derived = model.max_position_embeddings
    max_len = cfg.max_model_len or derived
    if max_len > derived:
        raise StartupFailure([
            f"pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig",
            f"  Value error, User-specified max_model_len ({max_len}) is greater than the derived "
            f"max_model_len (max_position_embeddings={derived} in model's config.json). To allow "
            f"overriding this maximum, set the env var VLLM_ALLOW_LONG_MAX_MODEL_LEN=1.",
        ])
    tp_total = cfg.num_gpus
    plan = memory_plan(gpu, model, tp_total, cfg.gpu_memory_utilization, cfg.max_num_seqs, max_len,
                       spec_k=cfg.spec_k, kv_dtype_bytes=cfg.kv_dtype_bytes,
                       max_num_batched_tokens=cfg.max_num_batched_tokens)
    if plan.error_kind is not None:
        lines = [
            vllm_prefix("INFO", "gpu_worker.py:276") + f"Model loading took {plan.weights_per_gpu / GiB:.4f} GiB",
        ]
        if plan.error_kind == "kv_too_small":
            lines.append(vllm_prefix("INFO", "gpu_worker.py:298")
                         + f"Available KV cache memory: {plan.kv_bytes_per_gpu / GiB:.2f} GiB")
        lines.append(vllm_prefix("ERROR", "core.py:700") + "EngineCore failed to start.")
        lines.append(plan.error or "ValueError: start-up failed")
        lines.append("RuntimeError: Engine core initialization failed. See root cause above. "
                     "Failed core proc(s): {}")
        raise StartupFailure(lines)
    return SimSetup(gpu=gpu, model=model, eff=eff, profile_meta=meta, max_model_len=max_len,
                    kv_capacity_tokens=plan.kv_capacity_tokens, plan=plan, bw_factor=bw_factor)


def make_pricer(cfg: SimServeConfig, setup: SimSetup):
    """Step time from decode_step (the one physics model; the simulator adds none of its own).

    Tensor parallelism is priced by decode_step (weights split, all-reduces per layer). Pipeline
    stages run one after another for a decode step, so a step costs about the TP-only step: the
    pricer passes tp = --tensor-parallel-size, while memory is planned over TP x PP GPUs.
    """
    from truthput.hardware.models import get_model
    from truthput.hardware.physics import decode_step

    family = method_family(cfg.spec_method) if cfg.spec_k else None
    method = _physics_method(family)
    draft = None
    if family == "draft_model":
        spec_model = (cfg.speculative or {}).get("model")
        try:
            draft = get_model(spec_model) if spec_model else None
        except SpecError:
            draft = None
        if draft is None:
            raise SpecError(f"sim serve: draft model {spec_model!r} has no profile: give a directory with "
                            "config.json or a named profile as the speculative model")
    gpu, model, eff, tp = setup.gpu, setup.model, setup.eff, cfg.tensor_parallel_size
    kv_bytes = cfg.kv_dtype_bytes

    def price(shape: StepShape) -> float:
        return decode_step(gpu, model, tp, shape.decode_seqs, shape.context_tokens, spec_k=shape.spec_k,
                           spec_method=method if shape.spec_k else None, kv_dtype_bytes=kv_bytes,
                           prefill_tokens=shape.prefill_tokens, eff=eff, draft_model=draft).total

    return price


def _error(status: int, message: str, err_type: str = "BadRequestError", param: str | None = None) -> web.Response:
    body = {"error": {"message": message, "type": err_type, "param": param, "code": status}}
    return web.Response(status=status, body=orjson.dumps(body), content_type="application/json")


class SimServer:
    """The HTTP front and engine of one simulated server; usable in-process (tests) or via serve()."""

    def __init__(self, cfg: SimServeConfig, setup: SimSetup, pricer=None, log_out=None) -> None:
        self.cfg = cfg
        self.setup = setup
        self.model_name = cfg.served_model_name
        self.max_model_len = setup.max_model_len
        self.metrics = SimMetrics(self.model_name, self.max_model_len, cfg.spec_k)
        interval = float(os.environ.get("VLLM_LOG_STATS_INTERVAL", "10") or 10)
        self.log_interval = interval
        self.stats_logger = StatsLogger(cfg.spec_k, out=log_out)
        self.log_out = log_out
        limits = EngineLimits(
            max_num_seqs=cfg.max_num_seqs,
            max_num_batched_tokens=cfg.max_num_batched_tokens,
            max_model_len=self.max_model_len,
            block_size=cfg.block_size,
            kv_capacity_tokens=setup.kv_capacity_tokens,
        )
        self.pricer = pricer or make_pricer(cfg, setup)
        self.engine: SimEngine | None = None
        self._limits = limits
        self.fp8_kv = cfg.kv_cache_dtype.startswith("fp8")
        self.rng = random.Random(cfg.seed ^ 0x7E47)
        self.created = int(time.time())
        self.ready = False
        self._runner: web.AppRunner | None = None
        self._log_task: asyncio.Task | None = None
        self.port: int | None = None

    # ------------------------------------------------------------------ lifecycle
    def build_app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024**2)
        app.router.add_get("/health", self.health)
        app.router.add_get("/ping", self.health)
        app.router.add_get("/version", self.version)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/metrics", self.metrics_endpoint)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat_completions)
        app.router.add_post("/tokenize", self.tokenize)
        return app

    async def start(self, host: str | None = None, port: int | None = None) -> int:
        """Start engine and HTTP site; returns the bound port (0 picks a free one)."""
        cfg = self.cfg
        self.engine = SimEngine(self._limits, self.pricer, self.metrics, self.stats_logger,
                                spec_k=cfg.spec_k, spec_method=cfg.spec_method,
                                acceptance=cfg.sim_acceptance, seed=cfg.seed,
                                jitter=cfg.noise / 3.0)
        self.engine.start()
        self._runner = web.AppRunner(self.build_app(), access_log=None, shutdown_timeout=0.1,
                                     handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host or cfg.host, cfg.port if port is None else port,
                           reuse_address=True, backlog=2048)
        await site.start()
        sockets = site._server.sockets if site._server else []  # type: ignore[union-attr]
        self.port = sockets[0].getsockname()[1] if sockets else (port or cfg.port)
        if not cfg.disable_log_stats:
            self._log_task = asyncio.get_running_loop().create_task(self._log_loop())
        self.ready = True
        return self.port

    async def stop(self) -> None:
        self.ready = False
        if self._log_task is not None:
            self._log_task.cancel()
        if self.engine is not None:
            await self.engine.stop()
        if self._runner is not None:
            try:
                await asyncio.wait_for(self._runner.cleanup(), timeout=0.4)
            except (asyncio.TimeoutError, Exception):
                pass
            self._runner = None

    async def _log_loop(self) -> None:
        loop = asyncio.get_running_loop()
        t_next = loop.time()
        lost_before = 0.0
        while True:
            t_next += self.log_interval
            await asyncio.sleep(max(0.0, t_next - loop.time()))
            eng = self.engine
            if eng is not None:
                self.stats_logger.log(len(eng.running), len(eng.waiting), eng.kv_usage)
                if eng.time_lost_s > lost_before:
                    emit(vllm_prefix("WARNING", "truthput_sim.py:1")
                         + f"truthput-sim: the host CPU could not keep up: {eng.time_lost_s - lost_before:.3f} s "
                         "of simulated step time were not served in this interval; served speeds are "
                         "BELOW the physics model's", self.log_out)
                    lost_before = eng.time_lost_s

    # ------------------------------------------------------------------ simple endpoints
    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self.ready else 503)

    async def version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": SIM_VERSION})

    async def models(self, request: web.Request) -> web.Response:
        body = {
            "object": "list",
            "data": [{
                "id": self.model_name, "object": "model", "created": self.created, "owned_by": "vllm",
                "root": self.cfg.model or self.cfg.sim_model, "parent": None,
                "max_model_len": self.max_model_len,
                "permission": [],
            }],
        }
        return web.Response(body=orjson.dumps(body), content_type="application/json")

    async def metrics_endpoint(self, request: web.Request) -> web.Response:
        resp = web.Response(body=self.metrics.render())
        resp.headers["Content-Type"] = _PROM_CONTENT_TYPE
        return resp

    async def tokenize(self, request: web.Request) -> web.Response:
        body = await self._json(request)
        if isinstance(body, web.Response):
            return body
        if "messages" in body:
            n = textgen.count_chat_tokens(body["messages"])
        else:
            n = textgen.count_text_tokens(str(body.get("prompt", "")))
        return web.json_response({"count": n, "max_model_len": self.max_model_len, "tokens": list(range(n))})

    # ------------------------------------------------------------------ generation
    async def _json(self, request: web.Request):
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError as exc:
            return _error(400, f"request body is not valid JSON: {exc}")
        if not isinstance(body, dict):
            return _error(400, "request body must be a JSON object")
        return body

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await self._json(request)
        if isinstance(body, web.Response):
            return body
        prompt = body.get("prompt")
        if isinstance(prompt, list):
            if len(prompt) == 1 and isinstance(prompt[0], str):
                prompt = prompt[0]
            elif prompt and all(isinstance(t, int) for t in prompt):
                prompt_tokens = len(prompt)
                key_text = " ".join(map(str, prompt))
                return await self._generate(request, body, prompt_tokens, key_text, chat=False)
            else:
                return _error(400, "the simulator serves one prompt per request (a string or a list of token ids)",
                              param="prompt")
        if not isinstance(prompt, str):
            return _error(400, "'prompt' must be a string", param="prompt")
        return await self._generate(request, body, textgen.count_text_tokens(prompt), prompt, chat=False)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        body = await self._json(request)
        if isinstance(body, web.Response):
            return body
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return _error(400, "'messages' must be a non-empty list", param="messages")
        return await self._generate(request, body, textgen.count_chat_tokens(messages),
                                    textgen.chat_key_text(messages), chat=True)

    async def _generate(self, request: web.Request, body: dict, prompt_tokens: int, key_text: str,
                        chat: bool) -> web.StreamResponse:
        model = body.get("model")
        if model is not None and model != self.model_name and model != self.cfg.model:
            return _error(404, f"The model `{model}` does not exist.", "NotFoundError", "model")
        if body.get("n", 1) not in (1, None):
            return _error(400, "the simulator supports n=1 only", param="n")
        max_tokens = body.get("max_completion_tokens") if chat else None
        if max_tokens is None:
            max_tokens = body.get("max_tokens")
        room = self.max_model_len - prompt_tokens
        if max_tokens is None:
            if room < 1:
                return _error(400, self._too_long_message(prompt_tokens, 0), param="messages" if chat else "prompt")
            max_tokens = room
        try:
            max_tokens = int(max_tokens)
        except (TypeError, ValueError):
            return _error(400, f"max_tokens must be an integer, got {max_tokens!r}", param="max_tokens")
        if max_tokens < 1:
            return _error(400, f"max_tokens must be at least 1, got {max_tokens}", param="max_tokens")
        if prompt_tokens + max_tokens > self.max_model_len:
            return _error(400, self._too_long_message(prompt_tokens, max_tokens), param="max_tokens")

        temperature = body.get("temperature")
        if temperature is not None and not isinstance(temperature, (int, float)):
            return _error(400, f"temperature must be a number, got {temperature!r}", param="temperature")
        greedy = temperature is not None and float(temperature) == 0.0
        seed = body.get("seed")
        if seed is not None and not isinstance(seed, int):
            return _error(400, f"seed must be an integer, got {seed!r}", param="seed")
        prompt_key = textgen.text_key(key_text)
        skey = textgen.stream_key(prompt_key, greedy=greedy, seed=seed, fp8_kv=self.fp8_kv,
                                  fallback=self.rng.getrandbits(64))
        if body.get("ignore_eos"):
            max_new, reason = max_tokens, "length"
        else:
            natural = textgen.natural_length(skey)
            max_new, reason = (natural, "stop") if natural < max_tokens else (max_tokens, "length")

        loop = asyncio.get_running_loop()
        rid = uuid.uuid4().hex
        req = SimRequest(rid, prompt_tokens, max_new, reason, textgen.TokenStream(skey), loop.time())
        assert self.engine is not None
        self.engine.submit(req)
        try:
            if body.get("stream"):
                return await self._stream(request, body, req, chat)
            return await self._whole(req, chat)
        finally:
            if req.finish_reason is None:
                self.engine.abort(req)

    def _too_long_message(self, prompt_tokens: int, max_tokens: int) -> str:
        return (f"This model's maximum context length is {self.max_model_len} tokens. However, you requested "
                f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the messages, {max_tokens} in the "
                f"completion). Please reduce the length of the messages or completion.")

    async def _whole(self, req: SimRequest, chat: bool) -> web.Response:
        while req.finish_reason is None:
            await req.wait()
        if req.finish_reason == "abort":
            return _error(500, "request aborted", "InternalServerError")
        text = req.stream.text(0, req.emitted)
        usage = {"prompt_tokens": req.prompt_tokens, "total_tokens": req.prompt_tokens + req.emitted,
                 "completion_tokens": req.emitted, "prompt_tokens_details": None}
        if chat:
            body = {"id": f"chatcmpl-{req.rid}", "object": "chat.completion", "created": int(time.time()),
                    "model": self.model_name,
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": text, "tool_calls": []},
                                 "logprobs": None, "finish_reason": req.finish_reason, "stop_reason": None}],
                    "usage": usage}
        else:
            body = {"id": f"cmpl-{req.rid}", "object": "text_completion", "created": int(time.time()),
                    "model": self.model_name,
                    "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": req.finish_reason,
                                 "stop_reason": None, "prompt_logprobs": None}],
                    "usage": usage}
        return web.Response(body=orjson.dumps(body), content_type="application/json")

    async def _stream(self, request: web.Request, body: dict, req: SimRequest, chat: bool) -> web.StreamResponse:
        opts = body.get("stream_options") or {}
        include_usage = bool(opts.get("include_usage"))
        continuous = include_usage and bool(opts.get("continuous_usage_stats"))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        created = int(time.time())
        model_json = orjson.dumps(self.model_name)
        if chat:
            head = (b'data: {"id":"chatcmpl-' + req.rid.encode() + b'","object":"chat.completion.chunk","created":'
                    + str(created).encode() + b',"model":' + model_json + b',"choices":[{"index":0,"delta":')
            tail_open = b',"logprobs":null,"finish_reason":'
            tail_close = b"}]"
        else:
            head = (b'data: {"id":"cmpl-' + req.rid.encode() + b'","object":"text_completion","created":'
                    + str(created).encode() + b',"model":' + model_json + b',"choices":[{"index":0,"text":')
            tail_open = b',"logprobs":null,"finish_reason":'
            tail_close = b',"stop_reason":null}]'
        p = req.prompt_tokens
        p_bytes = str(p).encode()

        def usage_part(n: int) -> bytes:
            if continuous:
                return (b',"usage":{"prompt_tokens":' + p_bytes + b',"total_tokens":' + str(p + n).encode()
                        + b',"completion_tokens":' + str(n).encode() + b"}")
            return b',"usage":null'  # as vLLM serialises an unset usage field

        write = resp.write
        if chat:
            await write(head + b'{"role":"assistant","content":""}' + tail_open + b"null" + tail_close
                        + usage_part(0) + b"}\n\n")
        sent = 0
        while True:
            n = req.emitted
            if n == sent:
                if req.finish_reason is not None:
                    break
                await req.wait()
                continue
            text = orjson.dumps(req.stream.text(sent, n))
            done = req.finish_reason is not None and req.finish_reason != "abort" and n >= req.emitted
            reason = (b'"' + req.finish_reason.encode() + b'"') if done else b"null"
            content = (b'{"content":' + text + b"}") if chat else text
            await write(head + content + tail_open + reason + tail_close + usage_part(n) + b"}\n\n")
            sent = n
            if done:
                break
        if include_usage:
            final = {"id": ("chatcmpl-" if chat else "cmpl-") + req.rid,
                     "object": "chat.completion.chunk" if chat else "text_completion",
                     "created": created, "model": self.model_name, "choices": [],
                     "usage": {"prompt_tokens": p, "total_tokens": p + sent, "completion_tokens": sent}}
            await write(b"data: " + orjson.dumps(final) + b"\n\n")
        await write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


def startup_lines(cfg: SimServeConfig, setup: SimSetup) -> list[str]:
    """vLLM-like start-up log, with a banner that names this a SIMULATOR."""
    plan = setup.plan
    eff = setup.eff
    spec = ""
    if cfg.spec_k:
        spec = f", speculation {cfg.spec_method} k={cfg.spec_k}"
    lines = [
        vllm_prefix("INFO", "api_server.py:1800")
        + f"vLLM API server version {SIM_VERSION} -- truthput SIMULATOR (no GPU; speeds come from the "
        f"physics model): model {setup.model.name} on {cfg.num_gpus}x {setup.gpu.name} "
        f"(TP={cfg.tensor_parallel_size}, PP={cfg.pipeline_parallel_size}){spec}",
        vllm_prefix("INFO", "api_server.py:1801")
        + f"truthput-sim: efficiency bw_frac={eff.bw_frac:.4g} flops_frac={eff.flops_frac:.4g} "
        f"step_overhead_s={eff.step_overhead_s:.4g} tp_latency_s={eff.tp_latency_s} "
        f"(noise {cfg.noise:g}, bandwidth factor this start {setup.bw_factor:.4f}, seed {cfg.seed})",
        vllm_prefix("INFO", "gpu_model_runner.py:2000")
        + f"Model loading took {plan.weights_per_gpu / GiB:.4f} GiB and 0.000000 seconds",
        vllm_prefix("INFO", "gpu_worker.py:298")
        + f"Available KV cache memory: {plan.kv_bytes_per_gpu / GiB:.2f} GiB",
        vllm_prefix("INFO", "kv_cache_utils.py:1000") + f"GPU KV cache size: {setup.kv_capacity_tokens:,} tokens",
        vllm_prefix("INFO", "kv_cache_utils.py:1004")
        + f"Maximum concurrency for {setup.max_model_len:,} tokens per request: "
        f"{setup.kv_capacity_tokens / setup.max_model_len:.2f}x",
    ]
    return lines


async def _serve_async(cfg: SimServeConfig, setup: SimSetup) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError):
            pass
    for line in startup_lines(cfg, setup):
        emit(line)
    if cfg.startup_s > 0:
        try:
            await asyncio.wait_for(stop.wait(), timeout=cfg.startup_s)
            return 0
        except asyncio.TimeoutError:
            pass
    server = SimServer(cfg, setup)
    host = cfg.host
    if not cfg.allow_remote and not is_loopback(host):
        emit(f"truthput-sim: binding 127.0.0.1 instead of {host!r}: a simulator is for this machine only "
             "(--allow-remote to listen there)")
        host = "127.0.0.1"
    try:
        port = await server.start(host=host)
    except OSError as exc:
        emit(f"ERROR: [Errno {exc.errno}] error while attempting to bind on address "
             f"('{cfg.host}', {cfg.port}): {exc.strerror}", sys.stderr)
        return 1
    emit(vllm_prefix("INFO", "launcher.py:37") + f"Route: /v1/completions, Methods: POST (port {port})")
    emit(f"INFO:     Started server process [{os.getpid()}]")
    emit("INFO:     Waiting for application startup.")
    emit("INFO:     Application startup complete.")
    await stop.wait()
    emit("INFO:     Shutting down")
    await server.stop()
    emit("INFO:     Finished server process")
    return 0


def is_loopback(host: str) -> bool:
    """Whether `host` names only this machine's loopback: 127.x, ::1, "localhost". Every spelling of
    "all interfaces" ("", "0", "0.0.0.0", "::", "0:0:0:0:0:0:0:0") and any other address is not."""
    import ipaddress
    import socket

    h = host.strip().strip("[]")
    if h.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        pass
    try:  # the legacy IPv4 spellings inet_aton accepts: "0", "127.1", "0x7f.1"
        return ipaddress.IPv4Address(socket.inet_aton(h)).is_loopback
    except OSError:
        return False


def serve(argv: list[str]) -> int:
    """`sim serve` entry: parse flags, resolve the setup, serve until SIGTERM/SIGINT; exit code."""
    from truthput.sim.flags import parse_serve_args

    try:
        cfg = parse_serve_args(argv)
        if cfg.ignored:
            emit("truthput-sim: ignoring flags the simulator does not model: " + " ".join(cfg.ignored))
        setup = resolve_setup(cfg)
        make_pricer(cfg, setup)  # validate the speculative method / draft model before binding
    except StartupFailure as exc:
        for line in exc.lines:
            emit(line, sys.stderr)
        return 1
    except SpecError as exc:
        emit(f"truthput-sim: error: {exc}", sys.stderr)
        return 1
    try:
        import uvloop

        runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
    except ImportError:
        runner = asyncio.Runner()
    with runner:
        return runner.run(_serve_async(cfg, setup))
