"""Prometheus metric names per engine, so measurement never hard-codes one engine's spelling.

Each field holds the current sample name; `aliases` lists older spellings (vLLM renamed
`gpu_cache_usage_perc` -> `kv_cache_usage_perc` and `time_per_output_token_seconds` ->
`inter_token_latency_seconds`). `candidates(field)` returns the current name first, then aliases,
and measurement uses the first one present in a scrape. Counters are named as exposed (`_total`);
histograms by their base name (`_bucket` / `_sum` / `_count` are appended when read).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

from truthput.errors import InputError


@dataclass(frozen=True, slots=True)
class EngineMetricNames:
    """The metric names one engine exposes; None where the engine has no such metric."""

    engine: str
    emitted_tokens: str | None = None
    prompt_tokens: str | None = None
    spec_drafts: str | None = None
    spec_draft_tokens: str | None = None
    spec_accepted: str | None = None
    spec_accepted_per_pos: str | None = None  # labelled position="0", "1", ...
    spec_verify_calls: str | None = None  # SGLang: one per verification step
    preemptions: str | None = None
    running: str | None = None
    waiting: str | None = None
    kv_usage: str | None = None
    ttft_hist: str | None = None
    itl_hist: str | None = None
    tpot_hist: str | None = None
    e2e_hist: str | None = None
    prefix_cache_queries: str | None = None
    """Prompt tokens the server looked up in its prefix cache (a counter)."""
    prefix_cache_hits: str | None = None
    """Of those, the tokens it found cached (a counter)."""
    external_cache_queries: str | None = None
    """Prompt tokens looked up in a KV connector's tier (vLLM's external prefix cache), a counter."""
    external_cache_hits: str | None = None
    prefix_cache_computed: str | None = None
    """Prompt tokens it computed, not found cached (a counter), for an engine that counts no
    lookups: the tokens looked up are these plus the hits (llama.cpp)."""
    aliases: dict[str, tuple[str, ...]] = field(default_factory=dict)
    counter_moves: str = "per_step"
    """When the emitted-token counter rises: "per_step" (vLLM, SGLang: every decode step adds the
    tokens it emitted, so a window between two scrapes counts the tokens made in it) or
    "per_request" (llama.cpp: a request's tokens are added when it finishes, so a window counts
    whole requests, and text chunks arriving do not move it). See COUNTER_SEMANTICS."""

    @property
    def counts_whole_requests(self) -> bool:
        return self.counter_moves == "per_request"

    def candidates(self, name_field: str) -> tuple[str, ...]:
        """Current name first, then older aliases; empty when the engine has none."""
        current = getattr(self, name_field)
        older = self.aliases.get(name_field, ())
        return tuple(n for n in (current, *older) if n)


SIMULATED_ENERGY = "truthput_sim:gpu_energy_joules_total"
"""The embedded simulator's modelled GPU energy (its power model; no real engine has it)."""


_VLLM = EngineMetricNames(
    engine="vllm",
    emitted_tokens="vllm:generation_tokens_total",
    prompt_tokens="vllm:prompt_tokens_total",
    spec_drafts="vllm:spec_decode_num_drafts_total",
    spec_draft_tokens="vllm:spec_decode_num_draft_tokens_total",
    spec_accepted="vllm:spec_decode_num_accepted_tokens_total",
    spec_accepted_per_pos="vllm:spec_decode_num_accepted_tokens_per_pos_total",
    preemptions="vllm:num_preemptions_total",
    running="vllm:num_requests_running",
    waiting="vllm:num_requests_waiting",
    kv_usage="vllm:kv_cache_usage_perc",
    ttft_hist="vllm:time_to_first_token_seconds",
    itl_hist="vllm:inter_token_latency_seconds",
    tpot_hist="vllm:request_time_per_output_token_seconds",
    e2e_hist="vllm:e2e_request_latency_seconds",
    prefix_cache_queries="vllm:prefix_cache_queries_total",
    prefix_cache_hits="vllm:prefix_cache_hits_total",
    external_cache_queries="vllm:external_prefix_cache_queries_total",
    external_cache_hits="vllm:external_prefix_cache_hits_total",
    aliases={
        "kv_usage": ("vllm:gpu_cache_usage_perc",),
        "itl_hist": ("vllm:time_per_output_token_seconds",),
        "preemptions": ("vllm:num_preemptions",),
    },
)

_SGLANG = EngineMetricNames(
    engine="sglang",
    emitted_tokens="sglang:generation_tokens_total",
    prompt_tokens="sglang:prompt_tokens_total",
    spec_verify_calls="sglang:spec_verify_calls_total",
    running="sglang:num_running_reqs",
    waiting="sglang:num_queue_reqs",
    kv_usage="sglang:token_usage",
    ttft_hist="sglang:time_to_first_token_seconds",
    itl_hist="sglang:inter_token_latency_seconds",
    e2e_hist="sglang:e2e_request_latency_seconds",
    aliases={"itl_hist": ("sglang:time_per_output_token_seconds",)},
)

_LLAMACPP = EngineMetricNames(
    engine="llamacpp",
    emitted_tokens="llamacpp:tokens_predicted_total",
    prompt_tokens="llamacpp:prompt_tokens_total",
    spec_drafts="llamacpp:spec_decode_num_drafts_total",
    spec_draft_tokens="llamacpp:spec_decode_num_draft_tokens_total",
    spec_accepted="llamacpp:spec_decode_num_accepted_tokens_total",
    spec_accepted_per_pos="llamacpp:spec_decode_num_accepted_tokens_per_pos_total",
    running="llamacpp:requests_processing",
    waiting="llamacpp:requests_deferred",
    prefix_cache_hits="llamacpp:prompt_tokens_cached_total",
    prefix_cache_computed="llamacpp:prompt_tokens_total",
    counter_moves="per_request",
)

_BY_ENGINE = {"vllm": _VLLM, "sim": _VLLM, "systemd": _VLLM, "sglang": _SGLANG, "llamacpp": _LLAMACPP}

COUNTER_SEMANTICS = {name: names.counter_moves for name, names in _BY_ENGINE.items()}
"""Engine -> when its emitted-token counter rises (checked against each real engine's behaviour:
vLLM per scheduler step, llama.cpp's `tokens_predicted_total` when a request ends)."""

NAME_FIELDS = tuple(f.name for f in fields(EngineMetricNames)
                    if f.name not in ("engine", "aliases", "counter_moves"))


def metric_names(engine: str, user_names: dict[str, str] | None = None) -> EngineMetricNames:
    """Names for `engine`; `user_names` (field -> metric name) overrides or, for "command" /
    "external" engines, supplies them (unknown engines start from vLLM's names, the common case
    for OpenAI-compatible servers built on vLLM)."""
    base = _BY_ENGINE.get(engine)
    if base is None:
        if engine not in ("command", "external"):
            raise InputError(f"unknown engine {engine!r} for metric names (known: vllm, sglang, llamacpp, command)")
        base = replace(_VLLM, engine=engine)
    if not user_names:
        return base
    unknown = sorted(set(user_names) - set(NAME_FIELDS))
    if unknown:
        raise InputError(f"unknown metric name field(s) {unknown} (known: {', '.join(NAME_FIELDS)})")
    return replace(base, **user_names)  # type: ignore[arg-type]  # every key is a str-valued name field
