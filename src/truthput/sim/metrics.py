"""vLLM V1 Prometheus metrics of the simulator, with vLLM's names, labels and meanings.

One CollectorRegistry per server (so in-process test servers never share series). Counters are
incremented once per engine step, at the moment that step's tokens are handed to the streams, so
`vllm:generation_tokens_total` always equals the sum of completion tokens already sent (or about
to be written in the same event-loop turn).
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
_ITL_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                10.0, 20.0, 40.0, 80.0]
_E2E_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
                120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0]
FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")
_ITERATION_BUCKETS = [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]
_N_BUCKETS = [1, 2, 5, 10, 20]
_PREEMPTION_BUCKETS = [1, 2, 3, 4, 5, 10, 20]


def build_1_2_5_buckets(max_value: int) -> list[int]:
    """1, 2, 5, 10, 20, 50, ... up to max_value (vLLM's token-count buckets)."""
    out: list[int] = []
    exponent = 0
    while True:
        for m in (1, 2, 5):
            v = m * 10**exponent
            if v > max_value:
                return out
            out.append(v)
        exponent += 1


class SimMetrics:
    """The series the simulator exposes; label values are bound once for speed."""

    # per-request and per-step histograms declared from a table in __init__
    iteration_tokens: Histogram
    prefill_time: Histogram
    decode_time: Histogram
    inference_time: Histogram
    params_max_tokens: Histogram
    max_num_generation_tokens: Histogram
    params_n: Histogram
    request_preemptions: Histogram
    prefill_kv_computed: Histogram

    def __init__(self, model_name: str, max_model_len: int, spec_k: int, config: dict | None = None,
                 tool_parser: bool = False) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self._labels, self._lv = ["model_name", "engine"], (model_name, "0")
        self._request_families(model_name, max_model_len)
        self._other_families(model_name, config)
        self.tool_parser_invocations: dict[tuple[str, str, str], Any] = {}
        if tool_parser:
            self._tool_parser_families(model_name)
        self.spec_k = spec_k
        if spec_k > 0:
            self.spec_drafts = self._counter("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.")
            self.spec_draft_tokens = self._counter("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.")
            self.spec_accepted = self._counter("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.")
            per_pos = Counter("vllm:spec_decode_num_accepted_tokens_per_pos",
                              "Accepted tokens per draft position.", self._labels + ["position"], registry=self.registry)
            self.spec_accepted_per_pos = [per_pos.labels(*self._lv, str(i)) for i in range(spec_k)]

    def _counter(self, name: str, doc: str) -> Any:
        return Counter(name, doc, self._labels, registry=self.registry).labels(*self._lv)

    def _gauge(self, name: str, doc: str) -> Any:
        return Gauge(name, doc, self._labels, registry=self.registry).labels(*self._lv)

    def _hist(self, name: str, doc: str, buckets: list) -> Any:
        return Histogram(name, doc, self._labels, buckets=buckets, registry=self.registry).labels(*self._lv)

    def _request_families(self, model_name: str, max_model_len: int) -> None:
        """The families the simulator moves: tokens, requests, the queue, the latency histograms."""
        counter, gauge, hist = self._counter, self._gauge, self._hist
        labels, lv, r = self._labels, self._lv, self.registry
        self.generation_tokens = counter("vllm:generation_tokens", "Number of generation tokens processed.")
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.num_preemptions = counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.")
        self.prefix_cache_queries = counter("vllm:prefix_cache_queries",
                                            "Prefix cache queries, in terms of number of queried tokens.")
        self.prefix_cache_hits = counter("vllm:prefix_cache_hits",
                                         "Prefix cache hits, in terms of number of cached tokens.")
        success = Counter("vllm:request_success", "Count of successfully processed requests.",
                          labels + ["finished_reason"], registry=r)
        self.request_success = {reason: success.labels(*lv, reason) for reason in FINISH_REASONS}
        self.running = gauge("vllm:num_requests_running", "Number of requests in model execution batches.")
        self.waiting = gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.")
        self.kv_usage = gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
        self.ttft = hist("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                         _TTFT_BUCKETS)
        self.itl = hist("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                        _ITL_BUCKETS)
        self.e2e = hist("vllm:e2e_request_latency_seconds",
                        "Histogram of e2e request latency in seconds.", _E2E_BUCKETS)
        self.tpot = hist("vllm:request_time_per_output_token_seconds",
                         "Histogram of time_per_output_token_seconds per request.", _ITL_BUCKETS)
        self.queue_time = hist("vllm:request_queue_time_seconds",
                               "Histogram of time spent in WAITING phase for request.", _E2E_BUCKETS)
        token_buckets = build_1_2_5_buckets(max_model_len)
        self.request_generation_tokens = hist("vllm:request_generation_tokens",
                                              "Number of generation tokens processed.", token_buckets)
        self.request_prompt_tokens = hist("vllm:request_prompt_tokens",
                                          "Number of prefill tokens processed.", token_buckets)
        # the rest of vLLM 0.32's families, each with its meaning where the simulator has one
        per_request = (
            ("iteration_tokens", "vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.",
             _ITERATION_BUCKETS),
            ("prefill_time", "vllm:request_prefill_time_seconds",
             "Histogram of time spent in PREFILL phase for request.", _E2E_BUCKETS),
            ("decode_time", "vllm:request_decode_time_seconds",
             "Histogram of time spent in DECODE phase for request.", _E2E_BUCKETS),
            ("inference_time", "vllm:request_inference_time_seconds",
             "Histogram of time spent in RUNNING phase for request.", _E2E_BUCKETS),
            ("params_max_tokens", "vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.",
             token_buckets),
            ("max_num_generation_tokens", "vllm:request_max_num_generation_tokens",
             "Histogram of maximum number of requested generation tokens.", token_buckets),
            ("params_n", "vllm:request_params_n", "Histogram of the n request parameter.", _N_BUCKETS),
            ("request_preemptions", "vllm:request_num_preemptions", "Number of preemptions per request.",
             _PREEMPTION_BUCKETS),
            ("prefill_kv_computed", "vllm:request_prefill_kv_computed_tokens",
             "Histogram of new KV tokens computed during prefill (excluding cached).", token_buckets),
        )
        for attr, name, doc, buckets in per_request:
            setattr(self, attr, hist(name, doc, buckets))

    def _other_families(self, model_name: str, config: dict | None) -> None:
        """The rest of vLLM 0.32's families, most at rest (the cache's sources, sleep, admission)."""
        counter = self._counter
        labels, lv, r = self._labels, self._lv, self.registry
        self.prompt_tokens_cached = counter("vllm:prompt_tokens_cached", "Number of cached prompt tokens.")
        by_source = Counter("vllm:prompt_tokens_by_source", "Number of prompt tokens by source.",
                            labels + ["source"], registry=r)
        self.prompt_by_source = {s: by_source.labels(*lv, s)
                                 for s in ("local_compute", "local_cache_hit", "external_kv_transfer")}
        cached_by = Counter("vllm:prompt_tokens_cached_by_source", "Number of cached prompt tokens by source.",
                            labels + ["source"], registry=r)
        for s in ("device", "host", "p2p", "disk", "external_unspecified"):
            cached_by.labels(*lv, s)
        waiting_by = Gauge("vllm:num_requests_waiting_by_reason", "Number of requests waiting, by reason.",
                           labels + ["reason"], registry=r)
        self.waiting_capacity = waiting_by.labels(*lv, "capacity")
        waiting_by.labels(*lv, "deferred")
        sleep = Gauge("vllm:engine_sleep_state", "Engine sleep state.", labels + ["sleep_state"], registry=r)
        for state, v in (("awake", 1), ("weights_offloaded", 0), ("discard_all", 0)):
            sleep.labels(*lv, state).set(v)
        self.est_flops = counter("vllm:estimated_flops_per_gpu", "Estimated FLOPs per GPU (the physics model's).")
        self.est_read = counter("vllm:estimated_read_bytes_per_gpu", "Estimated bytes read per GPU (the physics model's).")
        self.est_write = counter("vllm:estimated_write_bytes_per_gpu",
                                 "Estimated bytes written per GPU (the physics model's).")
        for name, doc in (("vllm:external_prefix_cache_queries", "External prefix cache queries."),
                          ("vllm:external_prefix_cache_hits", "External prefix cache hits."),
                          ("vllm:mm_cache_queries", "Multi-modal cache queries."),
                          ("vllm:mm_cache_hits", "Multi-modal cache hits.")):
            counter(name, doc)
        rejections = Counter("vllm:admission_rejections", "Requests rejected at admission, by reason.",
                             ["model_name", "reason"], registry=r)
        for reason in ("max_num_queued_reqs", "max_num_queued_tokens"):
            rejections.labels(model_name, reason)
        info = dict(config or {})
        if info:
            Gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig", ["engine", *sorted(info)],
                  registry=r).labels("0", *[str(info[k]) for k in sorted(info)]).set(1)

    def _tool_parser_families(self, model_name: str) -> None:
        """vLLM registers it only with --tool-call-parser, every label set at 0 from the start."""
        calls = Counter("vllm:tool_call_parser_invocations",
                        "Total number of ToolParser invocations. Non-streaming increments once per choice; "
                        "streaming increments once per delta.",
                        ["model_name", "mode", "outcome", "request_type"], registry=self.registry)
        for mode in ("streaming", "non_streaming"):
            for outcome in ("tool_call", "no_tool_call"):
                for kind in ("chat_completions", "responses", "other"):
                    self.tool_parser_invocations[(mode, outcome, kind)] = calls.labels(model_name, mode, outcome, kind)

    def expose_energy(self, meter: Any) -> None:
        """The modelled GPU energy (`truthput.sim.power`) as a counter read at each scrape; nothing
        when the hardware's board power is not known."""
        import time

        from prometheus_client.core import CounterMetricFamily

        from truthput.sim.power import ENERGY_METRIC

        if meter.energy_j(time.monotonic()) is None:
            return

        class _Energy:
            def collect(self) -> Any:
                fam = CounterMetricFamily(ENERGY_METRIC.removesuffix("_total"),
                                          "SIMULATED: energy the server's GPUs drew by the simulator's power model, joules.")
                fam.add_metric([], float(meter.energy_j(time.monotonic()) or 0.0))
                yield fam

        self.registry.register(_Energy())
    def render(self) -> bytes:
        """Prometheus text exposition of this server's registry."""
        return generate_latest(self.registry)
