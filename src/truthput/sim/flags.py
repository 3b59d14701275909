"""Command-line flags of `truthput sim serve`: vLLM's serve flags plus the simulator's own.

The simulator must accept exactly the argv a real vLLM would get (the runner launches both the
same way), so the parser knows vLLM's common serve flags with vLLM's defaults. Flags it does not
model are accepted and listed at start-up instead of failing, because a real deployment's unit
file carries many flags that do not change throughput (tool parsers, chat templates, ...).

Speculation can be given three ways, as vLLM accepts them: `--speculative-config JSON`, dotted
`--speculative-config.KEY VALUE`, and the older `--spec-method/--spec-model/--spec-tokens`.
They are merged into one dict; the same key given two different values is a `InputError`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from dataclasses import dataclass, field
from typing import Any

from truthput.errors import InputError

#: vLLM's default for the OpenAI API server on most GPUs (V1 engine).
DEFAULT_MAX_NUM_SEQS = 256
DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048
DEFAULT_STARTUP_S = 0.5
DEFAULT_FRONTEND_CHUNK_US = 40.0
"""A Python API server's time per SSE chunk (detokenise, serialise, write): ~25k chunks/s."""

_SPEC_INT_KEYS = {"num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min",
                  "draft_tensor_parallel_size", "max_model_len"}
#: Flags the parser knows but whose effect the simulator does not model; listed at start-up.
NOT_MODELLED = frozenset({
    "--data-parallel-size", "-dp", "--dtype", "--quantization", "-q", "--enforce-eager", "--no-enforce-eager", "--swap-space",
    "--cpu-offload-gb", "--reasoning-parser",
    "--chat-template", "--default-chat-template-kwargs", "--trust-remote-code",
    "--revision", "--download-dir", "--load-format", "--uvicorn-log-level", "--api-key",
    "--max-logprobs",
})


@dataclass
class SimServeConfig:
    """Everything `sim serve` needs, parsed and validated from argv."""

    model: str | None
    served_model_name: str
    host: str
    port: int
    tensor_parallel_size: int
    pipeline_parallel_size: int
    gpu_memory_utilization: float
    max_model_len: int | None
    max_num_seqs: int
    max_num_batched_tokens: int
    kv_cache_dtype: str
    dtype: str
    quantization: str | None
    enable_prefix_caching: bool
    enforce_eager: bool
    block_size: int
    speculative: dict[str, Any] | None
    sim_gpu: str | None
    sim_model: str | None
    sim_profile: str | None
    sim_acceptance: list[float] | None
    noise: float
    seed: int
    startup_s: float
    disable_log_stats: bool = False
    sim_repetition: float = 0.25
    sim_copy_span: float = 8.0
    tokenizer: str | None = None
    tool_call_parser: str | None = None
    enable_auto_tool_choice: bool = False
    num_gpu_blocks_override: int | None = None
    served_model_names: list[str] = field(default_factory=list)
    access_log: bool = True
    frontend_chunk_s: float = 0.0
    ignored: list[str] = field(default_factory=list)
    allow_remote: bool = False
    argv: list[str] = field(default_factory=list)

    @property
    def num_gpus(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def spec_k(self) -> int:
        if not self.speculative:
            return 0
        return int(self.speculative.get("num_speculative_tokens", 0) or 0)

    @property
    def spec_method(self) -> str | None:
        return self.speculative.get("method") if self.speculative else None

    @property
    def kv_dtype_bytes(self) -> float:
        from truthput.hardware.dtypes import kv_dtype_bytes

        return kv_dtype_bytes(self.kv_cache_dtype)


def _share(text: str) -> float:
    try:
        value = float(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from exc
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"a share in [0, 1), got {text!r}")
    return value


def _float_list(text: str) -> list[float]:
    try:
        values = [float(v) for v in text.replace(" ", "").split(",") if v]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from exc
    if not values or any(not 0.0 <= v <= 1.0 for v in values):
        raise argparse.ArgumentTypeError(f"acceptance rates must lie in [0, 1], got {text!r}")
    return values


def build_parser() -> argparse.ArgumentParser:
    """The parser `--help` shows: vLLM's serve flags (vLLM defaults) and the `--sim-*` flags."""
    p = argparse.ArgumentParser(
        prog="truthput sim serve",
        description=(
            "Simulated vLLM-compatible OpenAI server (a SIMULATOR: its speed comes from the "
            "hardware physics model, not a GPU). Accepts vLLM's serve flags; flags it does not "
            "model are listed at start-up and ignored."
        ),
        allow_abbrev=False,
    )
    bo = argparse.BooleanOptionalAction
    v = p.add_argument_group("vLLM serve flags (modelled or accepted)")
    v.add_argument("model_tag", nargs="?", default=None,
                   help="Model path or name, as `vllm serve MODEL` (same as --model).")
    v.add_argument("--model", default=None,
                   help="Model directory (its config.json gives the architecture) or name.")
    v.add_argument("--served-model-name", nargs="+", default=None,
                   help="Name(s) the API answers to; default: the model argument.")
    v.add_argument("--host", default="127.0.0.1", help="Address to listen on (default 127.0.0.1).")
    v.add_argument("--port", type=int, default=8000, help="Port to listen on (default 8000).")
    v.add_argument("--tensor-parallel-size", "-tp", type=int, default=1,
                   help="GPUs per pipeline stage; the sim prices TP all-reduces per step.")
    v.add_argument("--pipeline-parallel-size", "-pp", type=int, default=1,
                   help="Pipeline stages; GPU count = TP x PP.")
    v.add_argument("--data-parallel-size", "-dp", type=int, default=1,
                   help="Data-parallel engines (accepted; the sim runs one engine).")
    v.add_argument("--gpu-memory-utilization", type=float, default=0.9,
                   help="Fraction of each GPU's memory vLLM may use (default 0.9).")
    v.add_argument("--max-model-len", type=int, default=None,
                   help="Context length; default: the model's maximum.")
    v.add_argument("--max-num-seqs", type=int, default=DEFAULT_MAX_NUM_SEQS,
                   help=f"Most sequences in one batch (default {DEFAULT_MAX_NUM_SEQS}).")
    v.add_argument("--max-num-batched-tokens", type=int, default=DEFAULT_MAX_NUM_BATCHED_TOKENS,
                   help="Token budget of one step (chunked prefill + decodes) "
                        f"(default {DEFAULT_MAX_NUM_BATCHED_TOKENS}).")
    v.add_argument("--kv-cache-dtype", default="auto",
                   choices=["auto", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "bfloat16"],
                   help="KV cache element type; fp8 halves KV bytes (default auto = model dtype).")
    v.add_argument("--dtype", default="auto",
                   help="Activation/weight dtype (auto, half, float16, bfloat16, float).")
    v.add_argument("--quantization", "-q", default=None,
                   help="Weight quantization method (the model profile gives bits per weight).")
    v.add_argument("--enable-prefix-caching", action=bo, default=True,
                   help="Prefix caching (accepted; the sim reports a 0%% hit rate).")
    v.add_argument("--enforce-eager", action=bo, default=False,
                   help="Disable CUDA graphs (accepted; not modelled).")
    v.add_argument("--block-size", type=int, default=16, help="KV block size in tokens (default 16).")
    v.add_argument("--num-gpu-blocks-override", type=int, default=None,
                   help="KV cache blocks, instead of what the memory left holds (vLLM's profiling result).")
    v.add_argument("--swap-space", type=float, default=4, help="CPU swap space GiB (accepted).")
    v.add_argument("--cpu-offload-gb", type=float, default=0, help="Accepted; not modelled.")
    v.add_argument("--speculative-config", default=None,
                   help="Speculative decoding as JSON, e.g. "
                        "'{\"method\":\"mtp\",\"num_speculative_tokens\":2}'; "
                        "dotted forms --speculative-config.KEY VALUE are accepted too.")
    v.add_argument("--spec-method", default=None,
                   help="Speculation method (mtp, qwen3_5_mtp, eagle, eagle3, ngram, draft_model).")
    v.add_argument("--spec-model", default=None, help="Draft model path (accepted).")
    v.add_argument("--spec-tokens", type=int, default=None,
                   help="Number of speculative tokens k.")
    v.add_argument("--enable-auto-tool-choice", action=bo, default=False, help="Accepted.")
    v.add_argument("--tool-call-parser", default=None, help="Named tool choices need it, as in vLLM (the sim "
                   "produces the calls itself, whichever parser is named).")
    v.add_argument("--reasoning-parser", default=None, help="Accepted.")
    v.add_argument("--chat-template", default=None, help="Accepted (the sim has its own).")
    v.add_argument("--default-chat-template-kwargs", default=None, help="Accepted (JSON).")
    v.add_argument("--trust-remote-code", action=bo, default=False, help="Accepted.")
    v.add_argument("--tokenizer", default=None, help="A folder with tokenizer.json: prompt counts, /tokenize and "
                   "/detokenize use it (default: the model directory's, else the sim's estimate).")
    v.add_argument("--revision", default=None, help="Accepted.")
    v.add_argument("--download-dir", default=None, help="Accepted.")
    v.add_argument("--load-format", default="auto", help="Accepted.")
    v.add_argument("--disable-log-requests", action=bo, default=False, help="Accepted.")
    v.add_argument("--enable-log-requests", action=bo, default=False, help="Accepted.")
    v.add_argument("--disable-log-stats", action=bo, default=False,
                   help="Do not print the periodic throughput log lines.")
    v.add_argument("--uvicorn-log-level", default="info", help="Accepted.")
    v.add_argument("--disable-uvicorn-access-log", action=bo, default=False,
                   help="No access line per request (as uvicorn prints them by default).")
    v.add_argument("--api-key", default=None, help="Accepted (not enforced).")
    v.add_argument("--max-logprobs", type=int, default=20, help="Accepted.")
    v.add_argument("--seed", type=int, default=0, help="Seeds every random choice of the sim.")

    _simulator_flags(p.add_argument_group("simulator flags"))
    return p


def _simulator_flags(s: Any) -> None:
    """The simulator's own flags (what it models, how it runs)."""
    s.add_argument("--sim-gpu", default=os.environ.get("TRUTHPUT_SIM_GPU"),
                   help="GPU from the catalog (env TRUTHPUT_SIM_GPU), e.g. 'RTX 3090'.")
    s.add_argument("--sim-model", default=os.environ.get("TRUTHPUT_SIM_MODEL"),
                   help="Model profile name (env TRUTHPUT_SIM_MODEL) when --model is not a directory.")
    s.add_argument("--sim-profile", default=None,
                   help="Calibrated efficiency profile (JSON from `truthput sim calibrate`).")
    s.add_argument("--sim-acceptance", type=_float_list, default=None,
                   help="Per-position conditional acceptance, e.g. '0.8,0.6,0.5' "
                        "(last value repeats for further positions).")
    s.add_argument("--sim-repetition", type=_share, default=0.25, metavar="SHARE",
                   help="Share of greedy output tokens the simulated model copies from the prompt or its own "
                        "recent output (default 0.25); what n-gram speculation can find. Sampled text copies "
                        "less, at temperature >= 1 only by chance. `truthput sim fit-ngram` fits it to a real "
                        "run's counters.")
    s.add_argument("--sim-copy-span", type=float, default=8.0, metavar="TOKENS",
                   help="Mean length of a copied span in tokens (default 8).")
    s.add_argument("--noise", type=float, default=0.0,
                   help="Per-start bandwidth variation and per-step jitter as a fraction "
                        "(0 = exactly deterministic step times).")
    s.add_argument("--allow-remote", action="store_true",
                   help="Listen on a non-loopback address as given (without it, any address other than "
                        "loopback is replaced by 127.0.0.1: a simulator is for this machine)")
    s.add_argument("--sim-startup-s", type=float, default=DEFAULT_STARTUP_S,
                   help=f"Seconds before /health answers (default {DEFAULT_STARTUP_S}).")
    s.add_argument("--sim-frontend-chunk-us", type=float, default=DEFAULT_FRONTEND_CHUNK_US,
                   help="Microseconds the modelled API server spends per stream chunk, one chunk at a time "
                        f"(default {DEFAULT_FRONTEND_CHUNK_US:g}); when a step's outputs take it longer than the "
                        "step, a stream's tokens wait and leave merged into fewer chunks, as vLLM's do under load. "
                        "0: every token in its own chunk.")


def _takes_value(action: argparse.Action) -> bool:
    return action.nargs != 0


def _coerce_spec_value(key: str, raw: str) -> Any:
    if key in _SPEC_INT_KEYS:
        try:
            return int(raw)
        except ValueError as exc:
            raise InputError(f"--speculative-config.{key}: expected an integer, got {raw!r}") from exc
    try:
        return json.loads(raw)
    except (ValueError, TypeError):
        return raw


def split_argv(parser: argparse.ArgumentParser, argv: list[str]) -> tuple[list[str], dict[str, Any], list[str]]:
    """Split argv into (known args, dotted speculative-config items, ignored flag names).

    Done by hand rather than with parse_known_args so an unknown flag's value is never taken for
    the positional model argument.
    """
    known: list[str] = []
    dotted: dict[str, Any] = {}
    ignored: list[str] = []
    options = parser._option_string_actions
    i = 0
    while i < len(argv):
        tok = argv[i]
        if tok.startswith("-") and tok != "-" and not _is_number(tok):
            name, eq, value = tok.partition("=")
            if name.startswith("--speculative-config."):
                key = name[len("--speculative-config."):].replace("-", "_")
                if not eq:
                    if i + 1 >= len(argv):
                        raise InputError(f"{name} needs a value")
                    value = argv[i + 1]
                    i += 1
                dotted[key] = _coerce_spec_value(key, value)
            elif name in options:
                if name in NOT_MODELLED:
                    ignored.append(name)
                known.append(tok)
                if not eq and _takes_value(options[name]):
                    nargs = options[name].nargs
                    if nargs == "+":
                        while i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                            known.append(argv[i + 1])
                            i += 1
                    elif i + 1 < len(argv):
                        known.append(argv[i + 1])
                        i += 1
            else:
                ignored.append(name)
                if not eq and i + 1 < len(argv) and not argv[i + 1].startswith("-"):
                    i += 1  # the unknown flag's value
        else:
            known.append(tok)
        i += 1
    return known, dotted, ignored


def _is_number(tok: str) -> bool:
    try:
        float(tok)
        return True
    except ValueError:
        return False


def _merge_speculative(argv: list[str]) -> dict[str, Any] | None:
    """One speculative dict from every spelling, by the same rules (and refusals) as truthput's
    own argv model (`truthput.experiment.argv.speculative_settings`, which mirrors vLLM's): the simulator
    accepts exactly the speculative flags vLLM does."""
    from truthput.experiment.argv import ServerArgv, speculative_settings

    from truthput.experiment.flagcheck import check_speculative_keys

    merged = speculative_settings(ServerArgv.parse(list(argv), engine="vllm")) or {}
    if not merged:
        return None
    check_speculative_keys("--speculative-config", merged)
    k = merged.get("num_speculative_tokens")
    if k is None:
        raise InputError("speculative decoding needs num_speculative_tokens (--spec-tokens N)")
    if not isinstance(k, int) or k < 0:
        raise InputError(f"num_speculative_tokens must be a non-negative integer, got {k!r}")
    if k == 0:
        return None
    if "method" not in merged:
        merged["method"] = "draft_model" if merged.get("model") else "ngram"
    return merged


def parse_serve_args(argv: list[str]) -> SimServeConfig:
    """Parse `sim serve` argv into a SimServeConfig; raises InputError on bad or conflicting flags."""
    parser = build_parser()
    known, dotted, ignored = split_argv(parser, list(argv))
    try:
        ns = parser.parse_args(known)
    except SystemExit as exc:  # argparse already printed its message (or --help)
        if exc.code == 0:
            raise
        raise InputError(f"bad sim serve arguments: {' '.join(argv)}") from exc
    spec = _merge_speculative(list(argv))
    model = ns.model or ns.model_tag
    if ns.model and ns.model_tag and ns.model != ns.model_tag:
        raise InputError(f"two models given: positional {ns.model_tag!r} and --model {ns.model!r}")
    served_names = list(ns.served_model_name or [model or ns.sim_model or "sim-model"])
    served = served_names[0]
    if ns.enable_auto_tool_choice and not ns.tool_call_parser:
        raise InputError("Error: --enable-auto-tool-choice requires --tool-call-parser")
    if not 0 <= ns.sim_frontend_chunk_us < 1e6:
        raise InputError(f"--sim-frontend-chunk-us must lie in [0, 1e6), got {ns.sim_frontend_chunk_us}")
    for name, val in (("--tensor-parallel-size", ns.tensor_parallel_size),
                      ("--pipeline-parallel-size", ns.pipeline_parallel_size),
                      ("--max-num-seqs", ns.max_num_seqs),
                      ("--max-num-batched-tokens", ns.max_num_batched_tokens),
                      ("--block-size", ns.block_size),
                      ("--num-gpu-blocks-override", ns.num_gpu_blocks_override or 1)):
        if val < 1:
            raise InputError(f"{name} must be >= 1, got {val}")
    if not 0.0 < ns.gpu_memory_utilization <= 1.0:
        raise InputError(f"--gpu-memory-utilization must lie in (0, 1], got {ns.gpu_memory_utilization}")
    if ns.sim_copy_span < 1:
        raise InputError(f"--sim-copy-span must be at least 1 token, got {ns.sim_copy_span}")
    if ns.noise < 0:
        raise InputError(f"--noise must be >= 0, got {ns.noise}")
    if not 0 <= ns.port <= 65535:
        raise InputError(f"--port {ns.port}: expected 0..65535 (0 = any free port)")
    own = dict(model=model, served_model_name=served, speculative=spec, startup_s=ns.sim_startup_s,
               served_model_names=served_names, access_log=not ns.disable_uvicorn_access_log,
               frontend_chunk_s=ns.sim_frontend_chunk_us / 1e6, ignored=ignored, argv=list(argv))
    as_parsed = {f.name: getattr(ns, f.name) for f in dataclasses.fields(SimServeConfig) if hasattr(ns, f.name)}
    return SimServeConfig(**{**as_parsed, **own})
