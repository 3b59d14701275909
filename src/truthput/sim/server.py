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
import functools
import json
import os
import random
import re
import signal
import sys
import time
import uuid
from dataclasses import dataclass, replace
from http import HTTPStatus
from pathlib import Path
from typing import Any, Callable

import orjson
from aiohttp import web
from aiohttp.abc import AbstractAccessLogger

from truthput.errors import InputError
from truthput.sim import textgen
from truthput.sim.engine import EngineLimits, SimEngine, SimRequest, StepShape, method_family
from truthput.sim.flags import SimServeConfig
from truthput.sim.logs import StatsLogger, emit, vllm_prefix
from truthput.sim.metrics import SimMetrics
from truthput.sim.speculation import DEFAULT_VOCAB, OutputTokens, Repetition, lookup_window

GiB = 1024**3
SIM_VERSION = "0.0.0+truthput.sim"
FRONTEND_MIN_WAIT_S = 0.001
"""A front-end wait shorter than this is not slept (a timer costs the sim more than it models)."""
PRICE_CACHE_SHAPES = 1 << 16
"""Step shapes whose price a pricer keeps (cleared when full: a long open-loop run meets new ones)."""
_PROM_CONTENT_TYPE = "text/plain; version=1.0.0; charset=utf-8"  # as vLLM 0.32 serves /metrics


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


def load_efficiency(path: str) -> tuple[Any, dict[str, Any]]:
    """--sim-profile: a calibrated profile, or a hand-written JSON of Efficiency's fields."""
    from truthput.sim.calibrate import load_profile

    eff, meta = load_profile(path)
    return eff, dict(meta or {})


def resolve_setup(cfg: SimServeConfig, eff=None) -> SimSetup:
    """Resolve model, GPU, efficiency and the memory plan; StartupFailure in vLLM's words."""
    from truthput.hardware.gpus import get_gpu
    from truthput.hardware.models import get_model
    from truthput.hardware.physics import memory_plan, prior_efficiency

    if cfg.model and Path(cfg.model).expanduser().is_dir():
        model = get_model(cfg.model)
    elif cfg.sim_model:
        model = get_model(cfg.sim_model)
    else:
        raise InputError(
            f"sim serve: no model profile for {cfg.model!r}: pass --model DIR (a directory with "
            "config.json) or --sim-model NAME (or env TRUTHPUT_SIM_MODEL)"
        )
    if not cfg.sim_gpu:
        raise InputError("sim serve: no GPU given: pass --sim-gpu NAME (or env TRUTHPUT_SIM_GPU), e.g. 'RTX 3090'")
    gpu = get_gpu(cfg.sim_gpu)
    meta: dict = {}
    if eff is None:
        if cfg.sim_profile:
            eff, meta = load_efficiency(cfg.sim_profile)
        else:
            eff = prior_efficiency(gpu)
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
    capacity = plan.kv_capacity_tokens
    if cfg.num_gpu_blocks_override is not None:  # vLLM: the blocks given, whatever the memory holds
        capacity = cfg.num_gpu_blocks_override * cfg.block_size
        if capacity < max_len:
            raise StartupFailure([
                vllm_prefix("ERROR", "core.py:700") + "EngineCore failed to start.",
                f"ValueError: To serve at least one request with the model's max seq len ({max_len}), "
                f"({max_len / capacity:.2f}x the KV cache) is needed, which is larger than the available KV cache "
                f"memory ({capacity} tokens in {cfg.num_gpu_blocks_override} blocks). Try increasing "
                "`num_gpu_blocks_override` or decreasing `max_model_len` when initializing the engine.",
                "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}"])
    return SimSetup(gpu=gpu, model=model, eff=eff, profile_meta=meta, max_model_len=max_len,
                    kv_capacity_tokens=capacity, plan=plan, bw_factor=bw_factor)


def _cache_config(cfg: SimServeConfig, setup: SimSetup) -> dict[str, Any]:
    """vLLM 0.32's `vllm:cache_config_info` labels: the simulator's own values where it has them,
    vLLM's defaults for what it does not model."""
    blocks = setup.kv_capacity_tokens // max(cfg.block_size, 1)
    return {
        "_block_size_resolved": True, "block_size": cfg.block_size, "cache_dtype": cfg.kv_cache_dtype,
        "cache_hit_alignment_tokens": None, "effective_attention_block_size": cfg.block_size,
        "enable_mamba_shared_prefix_checkpoint": False, "enable_prefix_caching": cfg.enable_prefix_caching,
        "gpu_memory_utilization": cfg.gpu_memory_utilization, "hash_block_size": None, "is_attention_free": False,
        "kv_cache_dtype_skip_layers": [], "kv_cache_layout": None,
        "kv_cache_max_concurrency": round(setup.kv_capacity_tokens / max(setup.max_model_len, 1), 2),
        "kv_cache_memory_bytes": int(setup.plan.kv_bytes_per_gpu), "kv_cache_size_tokens": setup.kv_capacity_tokens,
        "kv_offloading_backend": "native", "kv_offloading_size": None, "kv_sharing_fast_prefill": False,
        "mamba_block_size": None, "mamba_cache_dtype": "auto", "mamba_cache_mode": "none",
        "mamba_page_size_padded": None, "mamba_ssm_cache_dtype": "float32", "num_cpu_blocks": None,
        "num_gpu_blocks": blocks, "num_gpu_blocks_override": cfg.num_gpu_blocks_override, "prefix_cache_retention_interval": 0,
        "prefix_caching_hash_algo": "sha256", "prefix_match_unit": None, "replayssm_buffer_len": 16,
        "skip_page_size_padded": None, "sliding_window": None, "swa_bounded_replay": True,
        "use_kda_recoverssm": False, "use_replayssm": False, "user_specified_block_size": False,
    }


def make_pricer(cfg: SimServeConfig, setup: SimSetup, metrics: SimMetrics | None = None,
                on_step: Callable[[Any], None] | None = None):
    """Step time from decode_step (the one physics model; the simulator adds none of its own).
    `on_step` sees each priced step's breakdown (the virtual-time driver models power from it).

    Tensor parallelism is priced by decode_step (weights split, all-reduces per layer). Pipeline
    stages run one after another for a decode step, so a step costs about the TP-only step: the
    pricer passes tp = --tensor-parallel-size, while memory is planned over TP x PP GPUs.
    """
    from truthput.hardware.models import get_model
    from truthput.hardware.physics import StepBreakdown, decode_step

    family = method_family(cfg.spec_method) if cfg.spec_k else None
    method = _physics_method(family)
    draft = None
    if family == "draft_model":
        spec_model = (cfg.speculative or {}).get("model")
        try:
            draft = get_model(spec_model) if spec_model else None
        except InputError:
            draft = None
        if draft is None:
            raise InputError(f"sim serve: draft model {spec_model!r} has no profile: give a directory with "
                            "config.json or a named profile as the speculative model")
    gpu, model, eff, tp = setup.gpu, setup.model, setup.eff, cfg.tensor_parallel_size
    kv_bytes = cfg.kv_dtype_bytes

    from truthput.hardware.physics import kv_bytes_per_token_per_gpu

    kv_write = kv_bytes_per_token_per_gpu(model, kv_bytes, tp)

    priced: dict[StepShape, StepBreakdown] = {}

    def price(shape: StepShape) -> float:
        # a closed loop passes through the same shapes again and again (each request's context
        # grows through the same lengths): the physics is priced once per shape
        step = priced.get(shape)
        if step is None:
            if len(priced) >= PRICE_CACHE_SHAPES:
                priced.clear()
            step = priced[shape] = decode_step(
                gpu, model, tp, shape.decode_seqs, shape.context_tokens, spec_k=shape.spec_k,
                spec_method=method if shape.spec_k else None, kv_dtype_bytes=kv_bytes,
                prefill_tokens=shape.prefill_tokens, eff=eff, draft_model=draft, draft_tokens=shape.draft_tokens)
        if metrics is not None:  # vLLM's estimated_* counters, from the same physics as the step time
            metrics.est_flops.inc(step.flops_per_gpu)
            metrics.est_read.inc(step.weight_bytes_per_gpu + step.kv_bytes_per_gpu)
            verified = shape.decode_seqs * shape.spec_k if shape.draft_tokens is None else shape.draft_tokens
            metrics.est_write.inc(kv_write * (shape.decode_seqs + verified + shape.prefill_tokens))
        if on_step is not None:
            on_step(step)
        return step.total

    return price


def _asked_max_tokens(body: dict, chat: bool) -> tuple[int | None, str] | web.Response:
    """(max_tokens, the key it came under), as vLLM's request model reads it (pydantic's lax mode:
    a float that is a whole number, a string of an integer), or the 400 it answers."""
    max_tokens = body.get("max_completion_tokens") if chat else None
    if max_tokens is None:
        max_tokens = body.get("max_tokens")
    name = "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None else "max_tokens"
    if isinstance(max_tokens, float):
        if not max_tokens.is_integer():
            return _body_error("int_from_float", f"body.{name}",
                               "Input should be a valid integer, got a number with a fractional part", repr(max_tokens))
        max_tokens = int(max_tokens)
    if isinstance(max_tokens, str):
        if not re.fullmatch(r"\s*[+-]?\d+\s*", max_tokens):
            return _body_error("int_parsing", f"body.{name}",
                               "Input should be a valid integer, unable to parse string as an integer", max_tokens)
        max_tokens = int(max_tokens)
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int)):
        return _body_error("int_type", f"body.{name}", "Input should be a valid integer", repr(max_tokens))
    return max_tokens, name


def _sampling_refused(body: dict) -> web.Response | None:
    """vLLM's 400 for a temperature, top_p or n it refuses (None: they are fine)."""
    temperature, top_p, n = body.get("temperature"), body.get("top_p"), body.get("n", 1)
    if temperature is not None and (isinstance(temperature, bool) or not isinstance(temperature, (int, float))):
        return _body_error("float_type", "body.temperature", "Input should be a valid number", repr(temperature))
    if temperature is not None and temperature < 0:
        return _param_error("temperature", float(temperature), "must be non-negative")
    if top_p is not None and (isinstance(top_p, bool) or not isinstance(top_p, (int, float))):
        return _body_error("float_type", "body.top_p", "Input should be a valid number", repr(top_p))
    if top_p is not None and not 0 < top_p <= 1:
        return _param_error("top_p", float(top_p), "must be in (0, 1]")
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        return _body_error("int_type", "body.n", "Input should be a valid integer >= 1", repr(n))
    if n not in (1, None) and temperature is not None and float(temperature) == 0.0:
        return _error(400, f"n must be 1 when using greedy sampling, got {n}.")
    return None


def _error(status: int, message: str, err_type: str = "BadRequestError", param: str | None = None) -> web.Response:
    body = {"error": {"message": message, "type": err_type, "param": param, "code": status}}
    return web.Response(status=status, body=orjson.dumps(body), content_type="application/json")


def _body_error(kind: str, loc: str, msg: str, got: str) -> web.Response:
    """A request body that fails validation, worded as vLLM's (pydantic's) 400: `type: "Bad
    Request"`, `param: "body.<loc>"`."""
    detail = {"type": kind, "loc": loc, "msg": msg, "input": got}
    return _error(400, f"1 validation error:\n  {detail!r}", "Bad Request", loc)


def _param_error(name: str, value: Any, rule: str) -> web.Response:
    return _error(400, f"{name} {rule}, got {value}. (parameter={name}, value={value})", param=name)


@dataclass
class Prompt:
    """One prompt of a request: its token count, the text its output stream is keyed on, and the
    text `echo` repeats (None for token-id prompts and chat)."""

    tokens: int
    key_text: str
    text: str | None
    #: the prompt's token ids where the request gave them; else read from the text when needed
    ids: list[int] | None = None
    messages: list | None = None


@dataclass
class Shaping:
    """How one choice's text is shown: cut before a stop string, the prompt echoed, a tool call."""

    stop: str | None = None
    cut: int | None = None
    """Characters of the output kept (the stop string and what follows it are not sent)."""
    echo: str | None = None
    tool_call: str | None = None
    """The function called (the text is then its arguments as JSON)."""


class FixedStream:
    """A constrained answer (JSON, a tool call) sent as `n` pieces of a known text."""

    def __init__(self, text: str, n: int) -> None:
        step = max(1, -(-len(text) // n))
        self.parts = [text[i:i + step] for i in range(0, len(text), step)] or [""]
        self.parts += [""] * (n - len(self.parts))
        self.tokens = OutputTokens(textgen.text_key(text), (), 0.0, 1.0)  # fresh ids: nothing for n-gram to find

    def piece(self, i: int) -> str:
        return self.parts[i] if i < len(self.parts) else ""

    def text(self, start: int, stop: int) -> str:
        return "".join(self.parts[start:stop])


async def _open_stream(request: web.Request, body: dict) -> tuple[web.StreamResponse, bool, bool]:
    """An SSE response, started; and whether usage is asked for at the end, and in every chunk."""
    opts = body.get("stream_options") or {}
    include_usage = bool(opts.get("include_usage"))
    continuous = include_usage and bool(opts.get("continuous_usage_stats"))
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"})
    await resp.prepare(request)
    return resp, include_usage, continuous


def _first_stop(stream: Any, max_new: int, stops: list[str]) -> tuple[int, str, int] | None:
    """(tokens up to and including the one that completes a stop string, that string, characters
    kept before it) for the first stop string the output would contain, or None."""
    text = ""
    longest = max(len(x) for x in stops)
    for i in range(max_new):
        start = max(0, len(text) - longest)
        text += stream.piece(i)
        hits = [(text.find(x, start), x) for x in stops if text.find(x, start) >= 0]
        if hits:
            at, which = min(hits)
            return i + 1, which, at
    return None


def _json_instance(schema: dict) -> Any:
    """A minimal value valid under a JSON schema (required properties filled, defaults and enums
    used): what a guided decoder's shortest answer looks like."""
    if "default" in schema:
        return schema["default"]
    if schema.get("enum"):
        return schema["enum"][0]
    if "const" in schema:
        return schema["const"]
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object" or "properties" in schema:
        props = schema.get("properties") or {}
        return {k: _json_instance(props.get(k) or {}) for k in schema.get("required") or []}
    if kind == "array":
        return [_json_instance(schema.get("items") or {}) for _ in range(int(schema.get("minItems") or 0))]
    return {"string": "", "integer": 0, "number": 0, "boolean": False, "null": None}.get(kind or "", {})


def _completion_logprobs(stream: Any, start: int, stop: int, k: int, key: int, offset: int = 0) -> dict:
    """Completions-style logprobs for tokens start..stop: each token's logprob and the top `k`
    (the token itself among them), deterministic per request; the simulator has no model, so the
    values are stand-ins of the right shape and range."""
    tokens, lps, tops, offsets = [], [], [], []
    for i in range(start, stop):
        tok = stream.piece(i)
        r = random.Random(key * 1_000_003 + i)
        lp = -r.uniform(0.05, 8.0)
        top = {tok: lp}
        for j in range(1, max(1, k)):
            top[stream.alternative(i, j) + ("" if j == 1 else str(j))] = lp - r.uniform(0.01, 2.0)
        tokens.append(tok)
        lps.append(lp)
        tops.append(top)
        offsets.append(offset)
        offset += len(tok)
    return {"text_offset": offsets, "token_logprobs": lps, "tokens": tokens, "top_logprobs": tops}


class UvicornAccessLogger(AbstractAccessLogger):
    """One line per request in uvicorn's words, as vLLM's API server prints them by default
    (`--disable-uvicorn-access-log` turns them off): `INFO:     HOST:PORT - "POST /v1/completions
    HTTP/1.1" 200 OK`."""

    out: Any = None  # where the lines go (the server's log stream; stdout when None)

    def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
        peer = request.transport.get_extra_info("peername") if request.transport else None
        where = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) and len(peer) >= 2 else "-"
        try:
            phrase = HTTPStatus(response.status).phrase
        except ValueError:
            phrase = ""
        emit(f'INFO:     {where} - "{request.method} {request.path_qs} HTTP/{request.version.major}.'
             f'{request.version.minor}" {response.status} {phrase}'.rstrip(), self.out)


def _chat_logprobs(stream: Any, start: int, stop: int, top: int, key: int) -> dict:
    """Chat-style logprobs for tokens start..stop (`{"content": [...]}`, each token with its UTF-8
    bytes and its `top` alternatives), stand-in values from the same draws as the completions form."""
    base = _completion_logprobs(stream, start, stop, max(1, top), key)
    content = []
    for tok, lp, alts in zip(base["tokens"], base["token_logprobs"], base["top_logprobs"]):
        tops = [{"token": t, "logprob": v, "bytes": list(t.encode())} for t, v in list(alts.items())[:top]]
        content.append({"token": tok, "logprob": lp, "bytes": list(tok.encode()), "top_logprobs": tops})
    return {"content": content}


def _logprobs_asked(body: dict, chat: bool) -> int | None:
    """How many alternatives per token the request asks for, or None when it asks for no logprobs
    (chat: `logprobs: true` with `top_logprobs`; completions: `logprobs: K`)."""
    asked = body.get("logprobs")
    if chat:
        if asked is not True:
            return None
        top = body.get("top_logprobs")
        return top if isinstance(top, int) and not isinstance(top, bool) else 0
    return asked if isinstance(asked, int) and not isinstance(asked, bool) else None


@web.middleware
async def _json_http_errors(request: web.Request, handler):
    """404 and 405 answer with a JSON body, as vLLM's FastAPI front does."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status in (404, 405):
            return web.json_response({"detail": exc.reason}, status=exc.status)
        raise


def _fingerprint() -> str:
    return f"truthput-sim-{uuid.uuid4().hex[:8]}"


class SimServer:
    """The HTTP front and engine of one simulated server; usable in-process (tests) or via serve()."""

    def __init__(self, cfg: SimServeConfig, setup: SimSetup, pricer=None, log_out=None) -> None:
        self.cfg = cfg
        self.setup = setup
        self.model_name = cfg.served_model_name
        self.max_model_len = setup.max_model_len
        self.metrics = SimMetrics(self.model_name, self.max_model_len, cfg.spec_k, config=_cache_config(cfg, setup),
                                  tool_parser=bool(cfg.tool_call_parser))
        self._frontend_free_at = 0.0
        interval = float(os.environ.get("VLLM_LOG_STATS_INTERVAL", "10") or 10)
        self.log_interval = interval
        self.stats_logger = StatsLogger(cfg.spec_k, out=log_out, prefix_caching=cfg.enable_prefix_caching)
        self.log_out = log_out
        limits = EngineLimits(
            max_num_seqs=cfg.max_num_seqs,
            max_num_batched_tokens=cfg.max_num_batched_tokens,
            max_model_len=self.max_model_len,
            block_size=cfg.block_size,
            kv_capacity_tokens=setup.kv_capacity_tokens,
        )
        from truthput.sim.power import PowerMeter

        self.power = PowerMeter(setup.gpu, cfg.num_gpus, t0=time.monotonic(), clock=time.monotonic)
        self.pricer = pricer or make_pricer(cfg, setup, self.metrics, on_step=self.power.priced)
        if pricer is None:
            self.metrics.expose_energy(self.power)
        self.engine: SimEngine | None = None
        self._limits = limits
        self.fp8_kv = cfg.kv_cache_dtype.startswith("fp8")
        self.rng = random.Random(cfg.seed ^ 0x7E47)
        self.created = int(time.time())
        self.ready = False
        self._runner: web.AppRunner | None = None
        self._log_task: asyncio.Task | None = None
        self.port: int | None = None
        from truthput.sim.tokenizer import find_model_tokenizer

        model_dir = cfg.model if cfg.model and os.path.isdir(cfg.model) else None
        self.tokenizer = find_model_tokenizer(cfg.tokenizer, model_dir)
        self.vocab = self.tokenizer.vocab_size if self.tokenizer is not None else DEFAULT_VOCAB
        self.repetition = Repetition(cfg.sim_repetition, cfg.sim_copy_span)
        self.fingerprint = _fingerprint()
        self._shaping: dict[str, Shaping] = {}

    # ------------------------------------------------------------------ lifecycle
    def build_app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024**2, middlewares=[_json_http_errors])
        app.router.add_get("/health", self.health)
        app.router.add_get("/ping", self.health)
        app.router.add_get("/version", self.version)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/metrics", self.metrics_endpoint)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat_completions)
        app.router.add_post("/tokenize", self.tokenize)
        app.router.add_post("/detokenize", self.detokenize)
        app.router.add_get("/load", self.load)
        if os.environ.get("VLLM_SERVER_DEV_MODE") == "1":  # vLLM serves its cache routes only in dev mode
            app.router.add_post("/reset_prefix_cache", self.reset_prefix_cache)
        return app

    def make_engine(self, stats_logger: StatsLogger | None = None) -> SimEngine:
        """This server's engine (not started: the real-time loop or the virtual-time driver runs it)."""
        cfg = self.cfg
        from truthput.sim.prefixcache import PrefixCache

        # without the model's tokenizer words stand in for tokens (0.75 words a token, as the workload)
        per_block = cfg.block_size if self.tokenizer is not None else max(1, round(cfg.block_size * 0.75))
        return SimEngine(self._limits, self.pricer, self.metrics, stats_logger,
                         spec_k=cfg.spec_k, spec_method=cfg.spec_method,
                         acceptance=cfg.sim_acceptance, seed=cfg.seed,
                         jitter=cfg.noise / 3.0, lookup=lookup_window(cfg.speculative),
                         cache=PrefixCache(cfg.block_size, per_block, enabled=cfg.enable_prefix_caching))

    def engine_start(self) -> None:
        """Start the engine loop on the running event loop (the HTTP front is separate)."""
        self.engine = self.make_engine(self.stats_logger)
        self.engine.start()

    async def start(self, host: str | None = None, port: int | None = None) -> int:
        """Start engine and HTTP site; returns the bound port (0 picks a free one)."""
        cfg = self.cfg
        self.engine_start()
        access: dict[str, Any] = {"access_log": None}
        if cfg.access_log:
            access = {"access_log_class": type("AccessLog", (UvicornAccessLogger,), {"out": self.log_out})}
        self._runner = web.AppRunner(self.build_app(), shutdown_timeout=0.1, handle_signals=False, **access)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host or cfg.host, cfg.port if port is None else port,
                           reuse_address=True, backlog=2048)
        await site.start()
        server: Any = site._server  # aiohttp keeps the asyncio Server here; its sockets give the bound port
        sockets = server.sockets if server else []
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
                "permission": [{
                    "id": f"modelperm-{uuid.uuid4().hex[:16]}", "object": "model_permission", "created": self.created,
                    "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True,
                    "allow_search_indices": False, "allow_view": True, "allow_fine_tuning": False,
                    "organization": "*", "group": None, "is_blocking": False,
                }],
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
        tok = self.tokenizer
        if tok is not None:
            text = tok.chat_text(body["messages"]) if "messages" in body else str(body.get("prompt", ""))
            ids = tok.encode(text)
        else:  # no tokenizer: the estimate's count, with stand-in ids
            n = (textgen.count_chat_tokens(body["messages"]) if "messages" in body
                 else textgen.count_text_tokens(str(body.get("prompt", ""))))
            ids = list(range(n))
        strs = (tok.token_strs(ids) if tok is not None else [str(i) for i in ids]) if body.get("return_token_strs") \
            else None
        return web.json_response({"count": len(ids), "max_model_len": self.max_model_len, "tokens": ids,
                                  "token_strs": strs})

    async def detokenize(self, request: web.Request) -> web.Response:
        body = await self._json(request)
        if isinstance(body, web.Response):
            return body
        ids = body.get("tokens")
        if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
            return _body_error("list_type", "body.tokens", "Input should be a valid list of integers", repr(ids))
        text = self.tokenizer.decode(ids) if self.tokenizer is not None else " ".join("tok" for _ in ids)
        return web.json_response({"prompt": text})

    async def reset_prefix_cache(self, request: web.Request) -> web.Response:
        """vLLM's dev-mode route: `{"success": false}` (HTTP 200) while requests hold blocks."""
        done = self.engine.reset_prefix_cache() if self.engine is not None else False
        return web.json_response({"success": done})

    async def load(self, request: web.Request) -> web.Response:
        eng = self.engine
        return web.json_response({"server_load": (len(eng.running) + len(eng.waiting)) if eng is not None else 0})

    def _ids_of(self, p: Prompt) -> list[int]:
        """A prompt's token ids, for the output process to copy from and n-gram to look up in:
        the model's when the simulator has its tokenizer, else one id per word."""
        if p.ids is not None:
            return p.ids
        tok = self.tokenizer
        if p.messages is not None:
            text = tok.chat_text(p.messages) if tok is not None else p.key_text
        else:
            text = p.text or p.key_text
        return tok.encode(text) if tok is not None else textgen.word_ids(text, self.vocab)

    def _prompt_ids(self, text: str, n: int) -> list[int]:
        return self.tokenizer.encode(text) if self.tokenizer is not None else list(range(n))

    def count_text(self, text: str) -> int:
        return self.tokenizer.count_text(text) if self.tokenizer is not None else textgen.count_text_tokens(text)

    def count_chat(self, messages: list) -> int:
        return (self.tokenizer.count_chat(messages) if self.tokenizer is not None
                else textgen.count_chat_tokens(messages))

    # ------------------------------------------------------------------ generation
    async def _json(self, request: web.Request):
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError as exc:
            return _body_error("json_invalid", f"body.{exc.pos}", "JSON decode error", "<dict of 0 items>")
        if not isinstance(body, dict):
            what = f"<list of {len(body)} items>" if isinstance(body, list) else repr(body)
            return _body_error("model_attributes_type", "body",
                               "Input should be a valid dictionary or object to extract fields from", what)
        return body

    async def _required(self, request: web.Request, name: str) -> tuple[dict[str, Any], Any] | web.Response:
        """The request's JSON body and its field `name`, or vLLM's 400 when either is missing."""
        body = await self._json(request)
        if isinstance(body, web.Response):
            return body
        if body.get(name) is None:
            return _body_error("missing", f"body.{name}", "Field required", f"<dict of {len(body)} items>")
        return body, body[name]

    async def completions(self, request: web.Request) -> web.StreamResponse:
        got = await self._required(request, "prompt")
        if isinstance(got, web.Response):
            return got
        body, prompt = got
        if isinstance(prompt, str):
            prompts = [Prompt(self.count_text(prompt), prompt, prompt)]
        elif isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            prompts = [Prompt(len(prompt), " ".join(map(str, prompt)), None, ids=prompt)]
        elif isinstance(prompt, list) and prompt and all(isinstance(x, str) for x in prompt):
            prompts = [Prompt(self.count_text(x), x, x) for x in prompt]  # a batch: one choice per prompt
        else:
            return _error(400, "'prompt' must be a string, a list of strings or a list of token ids", param="prompt")
        return await self._generate(request, body, prompts, chat=False)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        got = await self._required(request, "messages")
        if isinstance(got, web.Response):
            return got
        body, messages = got
        if not isinstance(messages, list) or not messages:
            return _error(400, "'messages' must be a non-empty list", param="messages")
        return await self._generate(request, body, [Prompt(self.count_chat(messages), textgen.chat_key_text(messages),
                                                           None, messages=messages)], chat=True)

    async def _generate(self, request: web.Request, body: dict, prompts: list["Prompt"],
                        chat: bool) -> web.StreamResponse:
        prompt_tokens = max(p.tokens for p in prompts)
        model = body.get("model")
        if model is not None and model not in (self.cfg.served_model_names or [self.model_name]):
            return _error(404, f"The model `{model}` does not exist.", "NotFoundError", "model")
        asked = _asked_max_tokens(body, chat)
        if isinstance(asked, web.Response):
            return asked
        max_tokens, name = asked
        refused = _sampling_refused(body)
        if refused is not None:
            return refused
        temperature, n = body.get("temperature"), body.get("n", 1)
        greedy = temperature is not None and float(temperature) == 0.0
        if prompt_tokens > self.max_model_len:
            return _error(400, f"This model's maximum context length is {self.max_model_len} tokens. However, your "
                               f"prompt contains at least {self.max_model_len + 1} input tokens, which exceeds this "
                               "limit even without any output tokens. Please reduce the length of the input prompt. "
                               f"(parameter=input_tokens, value={self.max_model_len + 1})", param="input_tokens")
        room = self.max_model_len - prompt_tokens
        if max_tokens is None:
            # vLLM's defaults: 16 for completions, the rest of the context for chat
            max_tokens = 16 if not chat else room
        if max_tokens > self.max_model_len:
            return _error(400, f"{name}={max_tokens} cannot be greater than max_model_len={self.max_model_len}. "
                               f"Please request fewer output tokens. (parameter={name}, value={max_tokens})",
                          param=name)
        if max_tokens < 1:
            return _param_error(name, max_tokens, "must be at least 1")
        if room < 1:
            return _error(400, self._too_long_message(prompt_tokens, max_tokens), param="input_tokens")
        max_tokens = min(max_tokens, room)  # as vLLM: asked beyond the context, clamped to what is left
        seed = body.get("seed")
        if seed is not None and not isinstance(seed, int):
            return _error(400, f"seed must be an integer, got {seed!r}", param="seed")
        stops = body.get("stop")
        stops = [stops] if isinstance(stops, str) else [x for x in (stops or []) if isinstance(x, str) and x]
        fixed = self._fixed_output(body) if chat else None
        if isinstance(fixed, web.Response):
            return fixed
        loop = asyncio.get_running_loop()
        reqs: list[SimRequest] = []
        # vLLM samples at temperature 1 unless told otherwise (this model has no generation_config)
        copy_q = self.repetition.copy_start_prob(1.0 if temperature is None else float(temperature))
        for p in prompts:
            prompt_key = textgen.text_key(p.key_text)
            for j in range(int(n or 1)):
                skey = textgen.stream_key(prompt_key, greedy=greedy, seed=None if seed is None else seed + j,
                                          fp8_kv=self.fp8_kv, fallback=self.rng.getrandbits(64))
                room_p = self.max_model_len - p.tokens
                limit = min(max_tokens, room_p)
                if body.get("ignore_eos"):
                    max_new, reason = limit, "length"
                else:
                    natural = textgen.natural_length(skey)
                    max_new, reason = (natural, "stop") if natural < limit else (limit, "length")
                stream: Any = self.output_stream(p, skey, copy_q)
                shape = Shaping(echo=p.text if body.get("echo") and not chat else None)
                if fixed is not None:
                    text, tool = fixed
                    # the answer's own tokens (the model's tokenizer where the simulator has it, as
                    # vLLM counts them) and the end-of-sequence token that stops it
                    own = (len(self.tokenizer.encode(text)) if self.tokenizer is not None
                           else textgen.count_text_tokens(text))
                    max_new = max(1, min(limit, own + 1))
                    # the engine finishes it with "stop" (its metrics' reason); the API says tool_calls
                    stream, reason = FixedStream(text, max_new), "stop"
                    shape.tool_call = tool
                elif stops:
                    found = _first_stop(stream, max_new, stops)
                    if found is not None:
                        max_new, reason = found[0], "stop"
                        shape.stop, shape.cut = found[1], found[2]
                req = SimRequest(uuid.uuid4().hex, p.tokens, max_new, reason, stream, loop.time(),
                                 prefix_ids=functools.partial(self._ids_of, p))
                self._shaping[req.rid] = shape
                reqs.append(req)
        assert self.engine is not None
        for req in reqs:
            self.metrics.params_max_tokens.observe(max_tokens)
            self.metrics.max_num_generation_tokens.observe(min(max_tokens, self.max_model_len - req.prompt_tokens))
            self.metrics.params_n.observe(int(n or 1))
            self.engine.submit(req)
        try:
            if body.get("stream"):
                if len(reqs) > 1:
                    return await self._stream_choices(request, body, reqs, chat, len(prompts))
                return await self._stream(request, body, reqs[0], chat)
            return await self._whole(reqs, chat, body)
        finally:
            for req in reqs:
                self._shaping.pop(req.rid, None)
                if req.finish_reason is None:
                    self.engine.abort(req)

    def output_stream(self, p: Prompt, skey: int, copy_q: float,
                      prompt_ids: Callable[[], list[int]] | None = None) -> textgen.TokenStream:
        """The token stream one choice's output is drawn from (keyed; copies from its prompt, whose
        ids `prompt_ids` gives when read; by default the prompt's own, see `_ids_of`)."""
        ids = prompt_ids or functools.partial(self._ids_of, p)
        tokens = OutputTokens(skey, ids, copy_q, self.repetition.span, self.vocab)
        return textgen.TokenStream(skey, tokens)

    def _fixed_output(self, body: dict) -> tuple[str, str | None] | web.Response | None:
        """What a constrained chat answer must say: a tool call for a required or named tool, or
        JSON under response_format (a minimal instance of the schema)."""
        tools = body.get("tools") or []
        choice = body.get("tool_choice")
        named = choice.get("function", {}).get("name") if isinstance(choice, dict) else None
        if tools and choice == "auto" and not (self.cfg.tool_call_parser and self.cfg.enable_auto_tool_choice):
            return _error(400, '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set')
        if tools and (choice == "required" or named):
            if not self.cfg.tool_call_parser:
                what = '"required"' if choice == "required" else f'function "{named}"'
                return _error(400, f"tool_choice={what} requires --tool-call-parser to be set")
            tool = next((t for t in tools if t.get("function", {}).get("name") == named), None) if named else tools[0]
            if tool is None:
                return _error(400, f"tool_choice names {named!r}, which is not among the tools", param="tool_choice")
            fn = tool.get("function", {})
            return json.dumps(_json_instance(fn.get("parameters") or {})), str(fn.get("name", ""))
        fmt = body.get("response_format") or {}
        if fmt.get("type") == "json_object":
            return "{}", None
        if fmt.get("type") == "json_schema":
            schema = (fmt.get("json_schema") or {}).get("schema") or {}
            return json.dumps(_json_instance(schema)), None
        return None

    def _too_long_message(self, prompt_tokens: int, max_tokens: int) -> str:
        return (f"This model's maximum context length is {self.max_model_len} tokens. However, you requested "
                f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the messages, {max_tokens} in the "
                f"completion). Please reduce the length of the messages or completion.")

    def _shown(self, req: SimRequest, start: int, stop: int) -> str:
        """The text of tokens start..stop as the client sees it (cut before a stop string)."""
        shape = self._shaping.get(req.rid)
        if shape is None or shape.cut is None:
            return req.stream.text(start, stop)
        # nothing at or past the stop string is ever sent, in any chunk
        before = len(req.stream.text(0, start)[:shape.cut]) if start else 0
        return req.stream.text(0, stop)[:shape.cut][before:]

    async def _whole(self, reqs: list[SimRequest], chat: bool, body: dict) -> web.Response:
        for req in reqs:
            while req.finish_reason is None:
                await req.wait()
            if req.finish_reason == "abort":
                return _error(500, "request aborted", "InternalServerError")
        p_total = sum(r.prompt_tokens for r in reqs[:: max(1, int(body.get("n") or 1))])  # once per prompt
        c_total = sum(r.emitted for r in reqs)
        usage = {"prompt_tokens": p_total, "total_tokens": p_total + c_total, "completion_tokens": c_total,
                 "prompt_tokens_details": None, "completion_tokens_details": None}
        # the key sets of vLLM 0.32's responses (tests/fixtures/conformance), unset fields as null
        tail = {"service_tier": None, "system_fingerprint": self.fingerprint, "usage": usage,
                "kv_transfer_params": None, "ec_transfer_params": None, "metrics": None}
        choices = []
        for index, req in enumerate(reqs):
            shape = self._shaping.get(req.rid) or Shaping()
            text = self._shown(req, 0, req.emitted)
            finish = "tool_calls" if shape.tool_call is not None and req.finish_reason == "stop" else req.finish_reason
            choice_tail = {"finish_reason": finish, "stop_reason": shape.stop, "token_ids": None,
                           "routed_experts": None}
            if chat:
                message: dict[str, Any] = {"role": "assistant", "content": text, "refusal": None,
                                           "annotations": None, "audio": None, "function_call": None,
                                           "reasoning": None}
                if shape.tool_call is not None:
                    message["content"] = None
                    message["tool_calls"] = [{"id": f"chatcmpl-tool-{uuid.uuid4().hex[:16]}", "type": "function",
                                              "function": {"name": shape.tool_call, "arguments": text}}]
                self._count_tool_parse(body, "non_streaming", shape.tool_call is not None)
                top = _logprobs_asked(body, chat=True)
                logprobs = (_chat_logprobs(req.stream, 0, req.emitted, top, req.stream.key)
                            if top is not None and hasattr(req.stream, "key") else None)
                choices.append({"index": index, "message": message, "logprobs": logprobs, **choice_tail})
            else:
                k = body.get("logprobs")
                logprobs = (_completion_logprobs(req.stream, 0, req.emitted, int(k), req.stream.key)
                            if isinstance(k, int) and not isinstance(k, bool) and hasattr(req.stream, "key")
                            else None)
                choices.append({"index": index, "text": (shape.echo or "") + text, "logprobs": logprobs,
                                **choice_tail, "prompt_logprobs": None, "prompt_token_ids": None})
        first = reqs[0]
        if chat:
            out = {"id": f"chatcmpl-{first.rid}", "object": "chat.completion", "created": int(time.time()),
                   "model": self.model_name, "choices": choices, **tail, "prompt_logprobs": None,
                   "prompt_token_ids": None, "prompt_text": None}
        else:
            out = {"id": f"cmpl-{first.rid}", "object": "text_completion", "created": int(time.time()),
                   "model": self.model_name, "choices": choices, **tail}
        return web.Response(body=orjson.dumps(out), content_type="application/json")

    def _count_tool_parse(self, body: dict, mode: str, called: bool) -> None:
        """vLLM's tool-call parser runs on chat requests with tools (once per choice, or once per
        delta when streamed) where a parser is configured."""
        if body.get("tools") and self.metrics.tool_parser_invocations:
            outcome = "tool_call" if called else "no_tool_call"
            self.metrics.tool_parser_invocations[(mode, outcome, "chat_completions")].inc()

    async def _frontend_turn(self) -> bool:
        """The modelled API server writes one chunk at a time, `frontend_chunk_s` each: a chunk
        waits for the chunks queued before it. True when it waited (then the tokens that arrived
        meanwhile go out with it, merged, as vLLM's output collector merges a stream's outputs that
        arrive before its writer reads them)."""
        cost = self.cfg.frontend_chunk_s
        if cost <= 0:
            return False
        now = asyncio.get_running_loop().time()
        done_at = max(now, self._frontend_free_at) + cost
        self._frontend_free_at = done_at
        wait = done_at - now
        if wait < FRONTEND_MIN_WAIT_S:
            return False
        await asyncio.sleep(wait)
        return True

    async def _stream(self, request: web.Request, body: dict, req: SimRequest, chat: bool) -> web.StreamResponse:
        resp, include_usage, continuous = await _open_stream(request, body)
        created = int(time.time())
        model_json = orjson.dumps(self.model_name)
        if chat:
            head = (b'data: {"id":"chatcmpl-' + req.rid.encode() + b'","object":"chat.completion.chunk","created":'
                    + str(created).encode() + b',"model":' + model_json + b',"choices":[{"index":0,"delta":')
            tail_open = b',"logprobs":null,"finish_reason":'
            tail_more = b',"token_ids":null}]'
            tail_last = b',"stop_reason":null,"token_ids":null}]'
        else:
            head = (b'data: {"id":"cmpl-' + req.rid.encode() + b'","object":"text_completion","created":'
                    + str(created).encode() + b',"model":' + model_json + b',"choices":[{"index":0,"text":')
            tail_open = b',"logprobs":null,"finish_reason":'
            tail_more = tail_last = b',"stop_reason":null,"prompt_token_ids":null,"token_ids":null}]'
        p = req.prompt_tokens
        p_bytes = str(p).encode()
        shape = self._shaping.get(req.rid) or Shaping()
        if shape.stop is not None:
            tail_last = tail_last.replace(b'"stop_reason":null', b'"stop_reason":' + orjson.dumps(shape.stop))
        echo = shape.echo or ""

        def usage_part(n: int) -> bytes:
            if continuous:
                return (b',"usage":{"prompt_tokens":' + p_bytes + b',"total_tokens":' + str(p + n).encode()
                        + b',"completion_tokens":' + str(n).encode() + b"}")
            return b""  # vLLM leaves the key out when usage is not asked for per chunk

        write = resp.write
        if chat:
            # vLLM sends the role with the first token, not on arrival (a client's TTFT starts there)
            while req.emitted == 0 and req.finish_reason is None:
                await req.wait()
            await write(head + b'{"role":"assistant","content":""}' + tail_open + b"null}]"
                        + usage_part(0) + b',"prompt_token_ids":null,"prompt_text":null}\n\n')
        sent = 0
        top = _logprobs_asked(body, chat)
        text_offset = 0
        while True:
            n = req.emitted
            if n == sent:
                if req.finish_reason is not None:
                    break
                await req.wait()
                continue
            if await self._frontend_turn():
                n = req.emitted  # what arrived while the front end was busy leaves in this chunk
            text = orjson.dumps(echo + self._shown(req, sent, n))
            if echo and not chat:
                # the echoed first chunk carries the prompt's token ids, as vLLM's does
                ids = self._prompt_ids(echo, req.prompt_tokens)
                tail_first = tail_more.replace(b'"prompt_token_ids":null', b'"prompt_token_ids":' + orjson.dumps(ids))
            else:
                tail_first = None
            echo = ""
            done = req.finish_reason is not None and req.finish_reason != "abort" and n >= req.emitted
            finish = "tool_calls" if shape.tool_call is not None and req.finish_reason == "stop" else req.finish_reason
            reason = (b'"' + str(finish).encode() + b'"') if done else b"null"
            if chat and shape.tool_call is not None:
                # a tool call streams as tool-call deltas: id and name first, then the arguments
                call: dict[str, Any] = {"index": 0, "function": {"arguments": orjson.loads(text)}}
                if sent == 0:
                    call = {"index": 0, "id": f"chatcmpl-tool-{uuid.uuid4().hex[:16]}", "type": "function",
                            "function": {"name": shape.tool_call, "arguments": orjson.loads(text)}}
                content = orjson.dumps({"tool_calls": [call]})
            else:
                content = (b'{"content":' + text + b"}") if chat else text
            if chat:
                self._count_tool_parse(body, "streaming", shape.tool_call is not None)
            # the last choices chunk carries the fingerprint, unless a usage chunk follows (then that does)
            print_ = (b',"system_fingerprint":' + orjson.dumps(self.fingerprint)) if done and not include_usage else b""
            opened = tail_open
            if top is not None and hasattr(req.stream, "key"):
                lp = (_chat_logprobs(req.stream, sent, n, top, req.stream.key) if chat else
                      _completion_logprobs(req.stream, sent, n, top, req.stream.key, offset=text_offset))
                opened = b',"logprobs":' + orjson.dumps(lp) + b',"finish_reason":'
                text_offset += len(orjson.loads(text)) if not chat else 0
            await write(head + content + opened + reason
                        + (tail_last if done else (tail_first or tail_more)) + usage_part(n) + print_ + b"}\n\n")
            sent = n
            if done:
                break
        if include_usage:
            final: dict[str, Any] = {"id": ("chatcmpl-" if chat else "cmpl-") + req.rid,
                     "object": "chat.completion.chunk" if chat else "text_completion",
                     "created": created, "model": self.model_name, "choices": [],
                     "usage": {"prompt_tokens": p, "total_tokens": p + sent, "completion_tokens": sent},
                     "system_fingerprint": self.fingerprint}
            await write(b"data: " + orjson.dumps(final) + b"\n\n")
        await write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


    async def _stream_choices(self, request: web.Request, body: dict, reqs: list[SimRequest], chat: bool,
                              n_prompts: int) -> web.StreamResponse:
        """Several choices in one stream (n > 1, or a list of prompts), as vLLM sends them: one id,
        each chunk one choice with its index, in the order their tokens come out; in chat every
        choice's role chunk with the first output of any; the final usage over all choices (each
        prompt once)."""
        resp, include_usage, continuous = await _open_stream(request, body)
        rid = ("chatcmpl-" if chat else "cmpl-") + reqs[0].rid
        base = {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion",
                "created": int(time.time()), "model": self.model_name}
        sent = [0] * len(reqs)
        finished = [False] * len(reqs)

        async def chunk(i: int, req: SimRequest, text: str | None, finish: str | None) -> None:
            stop = (self._shaping.get(req.rid) or Shaping()).stop if finish is not None else None
            extra: dict[str, Any] = {}
            if chat and text is None:  # the role chunk: vLLM's keys for it
                choice: dict[str, Any] = {"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                          "finish_reason": None}
                extra = {"prompt_token_ids": None, "prompt_text": None}
            elif chat:
                choice = {"index": i, "delta": {"content": text}, "logprobs": None, "finish_reason": finish,
                          **({"stop_reason": stop} if finish is not None else {}), "token_ids": None}
            else:
                choice = {"index": i, "text": text, "logprobs": None, "finish_reason": finish, "stop_reason": stop,
                          "prompt_token_ids": None, "token_ids": None}
            event: dict[str, Any] = {**base, "choices": [choice]}
            if continuous:
                event["usage"] = {"prompt_tokens": req.prompt_tokens, "total_tokens": req.prompt_tokens + sent[i],
                                  "completion_tokens": sent[i]}
            await resp.write(b"data: " + orjson.dumps({**event, **extra}) + b"\n\n")

        roles_sent = not chat
        while not all(finished):
            progressed = False
            if not roles_sent and any(r.emitted > 0 or r.finish_reason is not None for r in reqs):
                # vLLM sends every choice's role with the first output of any of them
                roles_sent = True
                for i, req in enumerate(reqs):
                    await chunk(i, req, None, None)
            for i, req in enumerate(reqs):
                if finished[i] or not roles_sent:
                    continue
                n = req.emitted
                done = req.finish_reason is not None and req.finish_reason != "abort"
                if n > sent[i] or done:
                    text = self._shown(req, sent[i], n)
                    sent[i] = n
                    finished[i] = done
                    await chunk(i, req, text, req.finish_reason if done else None)
                    progressed = True
            if not progressed and not all(finished):
                waits = [asyncio.ensure_future(r.wait()) for r, f in zip(reqs, finished) if not f]
                _, pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                for w in pending:
                    w.cancel()
        if include_usage:
            prompt = sum(r.prompt_tokens for r in reqs[::max(1, len(reqs) // n_prompts)])
            completion = sum(sent)
            final: dict[str, Any] = {**base, "choices": [], "usage": {"prompt_tokens": prompt, "total_tokens": prompt + completion,
                                                      "completion_tokens": completion},
                     "system_fingerprint": self.fingerprint}
            await resp.write(b"data: " + orjson.dumps(final) + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


def startup_lines(cfg: SimServeConfig, setup: SimSetup) -> list[str]:
    """vLLM-like start-up log, with a banner that names this a SIMULATOR."""
    plan = setup.plan
    eff = setup.eff
    spec = ""
    if cfg.spec_k:
        spec = f", speculation {cfg.spec_method} k={cfg.spec_k}"
        if method_family(cfg.spec_method) == "ngram":
            lo, hi = lookup_window(cfg.speculative)
            spec += (f" (prompt lookup {lo}..{hi} over text that copies {cfg.sim_repetition:g} of its greedy tokens "
                     f"in spans of {cfg.sim_copy_span:g}: --sim-repetition/--sim-copy-span)")
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
        vllm_prefix("INFO", "kv_cache_utils.py:1301", "EngineCore_DP0")
        + f"GPU KV cache size: {setup.kv_capacity_tokens:,} tokens, Maximum concurrency for "
        f"{setup.max_model_len:,} tokens per request: {setup.kv_capacity_tokens / setup.max_model_len:.2f}x",
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
    except InputError as exc:
        emit(f"truthput-sim: error: {exc}", sys.stderr)
        return 1
    try:
        import uvloop

        runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
    except ImportError:
        runner = asyncio.Runner()
    with runner:
        return runner.run(_serve_async(cfg, setup))
