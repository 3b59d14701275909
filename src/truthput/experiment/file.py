"""The experiment file (TOML): what to launch, which variants to try, how to load and measure.

Validated with pydantic at the edge; unknown keys are errors, and every error names the file, the
key and what was expected, on one line (principle 5).
"""

from __future__ import annotations

import re

import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from truthput.errors import InputError

from truthput.experiment.engines import EngineKind
from truthput.experiment.levels import Level, Rate


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=False)


def _core_list(v: list[int] | None) -> list[int] | None:
    """A non-empty list of CPU core numbers (checked against this host when the plan is built)."""
    if v is None:
        return None
    if not v or any(c < 0 for c in v):
        raise ValueError("expected a non-empty list of CPU core numbers (0, 1, ...)")
    return sorted(set(v))


_NAME_BAD = re.compile(r"[\x00-\x1f\x7f\[\]]")


def _check_name(v: str, what: str) -> str:
    """A name every view prints: not empty, no control characters (NUL, newlines) and no square
    brackets (terminal markup would read `[/]` as a tag)."""
    if not v.strip():
        raise ValueError(f"{what} is empty")
    bad = _NAME_BAD.search(v)
    if bad:
        raise ValueError(f"{what} {v!r} holds {bad.group()!r}: names may not hold control characters or [ ]")
    return v


def _check_env(env: dict[str, str]) -> dict[str, str]:
    """Environment variables a process can be given: a name of letters, digits and _, no NUL."""
    for k, val in env.items():
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k):
            raise ValueError(f"environment variable name {k!r}: letters, digits and _ only")
        if "\x00" in val:
            raise ValueError(f"environment variable {k}: its value holds a NUL byte")
    return env


class ExperimentSection(_Strict):
    """Names the experiment and its baseline variant."""

    name: str
    """The experiment's name: in run ids, reports and unit file names."""
    baseline: str
    """The variant every other one is compared with (usually the user's command as it is)."""
    seed: int = Field(0, ge=0, le=2**32 - 1)
    """Seeds the workload's prompts, the run order and the simulator (0 to 2^32-1: numpy's range)."""
    description: str = ""
    """Free text shown in the reports."""

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return _check_name(v, "experiment name")


class SystemdUnitRef(_Strict):
    """The unit the baseline came from, kept so the winner can be written back with the same sections."""

    path: str | None = None
    """Where the unit file was read from."""
    text: str | None = None
    """The unit file's text, kept so the winner is written back with the same sections."""


class ServerSection(_Strict):
    """How each variant's server is started (or where it already runs)."""

    engine: EngineKind = "vllm"
    """What starts the server: vllm, sglang, llamacpp, command (any OpenAI-compatible server, its own flags),
    systemd (a unit), external (already running at url) or sim (the embedded simulator)."""
    command: list[str] = Field(default_factory=list)
    """The server's argv, as the user runs it; variants change it flag by flag."""
    env: dict[str, str] = Field(default_factory=dict)
    """Environment variables for every server start (variants add theirs)."""
    host: str | None = None
    """Address the server binds; truthput's client uses a loopback form of an all-addresses host."""
    port: int | None = Field(None, ge=1, le=65535)
    """Port of every start (default: a free port each time, so a leftover never clashes)."""
    url: str | None = None  # engine = "external": where the server already runs
    ready_timeout_s: float = Field(600.0, gt=0, allow_inf_nan=False)
    """How long a start may take to answer its readiness check before it counts as failed."""
    stop_grace_s: float = Field(30.0, ge=0, allow_inf_nan=False)
    """Seconds between SIGTERM and SIGKILL when a server is stopped."""
    ready_url: str | None = None  # engine = "command": readiness path or URL (default /health then /v1/models)
    metric_names: dict[str, str] = Field(default_factory=dict)  # engine = "command": map onto vLLM's roles
    systemd_unit: SystemdUnitRef | None = None
    """The unit file the baseline was imported from (written by `truthput import`)."""
    user: bool = False  # engine = "systemd": use `systemctl --user`
    cpus: list[int] | None = None  # CPU cores the server may run on (affinity; vLLM-CPU's threads bound there)
    engine_version: str | None = Field(None, min_length=1, max_length=64)
    """The vLLM release the command runs ("0.11", "0.32.0"), for checking its flags where truthput
    cannot ask that vLLM itself (not installed for the command's Python): the bundled table when it
    is that release; another release's flags are then not checked before the start (plan says so)."""

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        return _check_env(v)

    @field_validator("cpus")
    @classmethod
    def _cores(cls, v: list[int] | None) -> list[int] | None:
        return _core_list(v)

    @model_validator(mode="after")
    def _needs_what_it_runs(self) -> "ServerSection":
        if self.engine == "external" and not self.url:
            raise ValueError("engine = 'external' needs url = 'http://host:port'")
        if self.engine not in ("external", "sim") and not self.command:
            raise ValueError(f"engine = '{self.engine}' needs command = [...] (the server's argv)")
        return self


class HardwareSection(_Strict):
    """The accelerators, for the roofline and the simulator."""

    gpu: str
    """The accelerator (a catalog name such as "RTX 3090", or a probed host profile .toml): for the roofline
    and the simulator."""
    count: int = Field(1, ge=1)
    """How many of them the server uses (tensor x pipeline parallel)."""


class ModelSection(_Strict):
    """The model, for the roofline and the simulator."""

    profile: str | None = None
    """A named model profile (`truthput roofline --help` lists them): parameters, layers, KV shape."""
    path: str | None = None
    """A model directory with a config.json, read for the same figures."""

    @model_validator(mode="after")
    def _one_of(self) -> "ModelSection":
        if not self.profile and not self.path:
            raise ValueError("give profile = '<named profile>' or path = '<model directory>'")
        return self

    @property
    def ref(self) -> str:
        return self.path or self.profile or ""


class SimSection(_Strict):
    """The embedded simulator (engine = "sim")."""

    noise: float = Field(0.03, ge=0.0, le=0.5)
    """Start-to-start spread of the simulated server's speed (a fraction; 0 = exact)."""
    startup_s: float = Field(0.5, ge=0.0)
    """Seconds a simulated server takes to answer /health."""
    profile: str | None = None  # calibration profile JSON (truthput sim calibrate)
    log_stats_interval_s: float = Field(10.0, gt=0.0)
    """Seconds between the simulator's throughput log lines (vLLM's VLLM_LOG_STATS_INTERVAL)."""
    acceptance: list[Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False)]] | None = None
    """Per-position acceptance rates of simulated draft tokens (speculative decoding), first position first."""
    # how much the simulated model's greedy text repeats: what n-gram speculation can find
    # (`truthput sim fit-ngram` fits both to a real run's counters)
    repetition: float | None = Field(None, ge=0.0, lt=1.0)
    copy_span: float | None = Field(None, ge=1.0)
    """Mean length, in tokens, of the spans the simulated text copies (with `repetition`)."""


class VariantSection(_Strict):
    """One configuration to compare; the first is usually the baseline."""

    name: str
    """The variant's name (letters, digits, - _ . only)."""
    set: dict[str, Any] = Field(default_factory=dict)
    """Flags to set on the baseline's command: {"--max-num-seqs" = 64}; a value of true adds a bare flag."""
    remove: list[str] = Field(default_factory=list)
    """Flags to remove from the baseline's command ("--speculative-config" removes every form of speculation)."""
    env: dict[str, str] = Field(default_factory=dict)
    """Environment variables this variant's server gets on top of [server].env."""
    description: str = ""
    """Free text shown in the reports."""
    tune_config: dict[str, str | int | float | bool] | None = None
    """Written by `truthput tune` into its rounds' experiments: the point of the search space this
    variant measures (flag -> value), so a resumed or re-read round knows it without parsing text."""

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return _check_name(v, "variant name")

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        return _check_env(v)


MAX_CONCURRENCY = 8192
"""The most streams one closed-loop client holds (about 20 KB each while they stream: 100000 reached
1.9 GB); spread larger loads over `truthput load --workers`."""


class TraceSection(_Strict):
    """How `prompt_source = "trace:PATH"` is replayed (`[workload.trace]`)."""

    speedup: float = Field(1.0, gt=0, allow_inf_nan=False)
    """The recorded gaps between requests divided by this."""
    max_gap_s: float | None = Field(None, gt=0, allow_inf_nan=False)
    """Each recorded gap at most this long (an idle night need not be waited out)."""
    start_s: float = Field(0.0, ge=0, allow_inf_nan=False)
    """The slice of the trace replayed: from this many seconds after its first request ..."""
    duration_s: float | None = Field(None, gt=0, allow_inf_nan=False)
    """... for this many seconds of the trace's own time (None: to its end)."""
    block_tokens: int | None = Field(None, ge=1)
    """Prompt tokens per hash id (default: the format's; Mooncake's 512)."""


class WorkloadSection(_Strict):
    """The load each trial drives."""

    concurrency: list[int] = Field(default_factory=lambda: [1])
    """Closed loop: the numbers of streams each start is measured at, in order."""
    rates: list[float] | None = None  # requests/s offered: an open loop at each rate instead of streams
    arrival: Literal["poisson", "constant"] = "poisson"  # open loop: exponential or even gaps
    max_in_flight: int | None = Field(None, ge=1, le=MAX_CONCURRENCY)  # open loop: cap on requests open at once
    duration_s: float | None = Field(30.0, gt=0, allow_inf_nan=False)
    """Seconds of each timed window (all streams in flight)."""
    requests: int | None = Field(None, gt=0)
    """Requests per trial instead of a duration."""
    warmup_s: float = Field(5.0, ge=0, allow_inf_nan=False)
    """Seconds of load before a level's first window (not measured)."""
    endpoint: Literal["completions", "chat"] = "completions"
    """completions or chat."""
    prompt_source: str = "synthetic"
    """synthetic, jsonl:PATH, sharegpt[:PATH], shared-prefix, multi-turn or tool-call."""
    prefixes: int = Field(4, ge=1)
    """shared-prefix: how many shared prefixes (request i uses prefix i % prefixes)."""
    suffixes: int = Field(16, ge=1)
    """shared-prefix: suffixes per prefix."""
    prefix_tokens: int = Field(256, ge=1)
    """shared-prefix: tokens of each shared prefix."""
    turns: int = Field(3, ge=1)
    """multi-turn: user turns per conversation."""
    trace: TraceSection = Field(default_factory=TraceSection)
    """prompt_source = "trace:PATH": the replay's speed-up, gap cap, slice and block size."""
    cache: Literal["as-is", "warm", "reset"] = "as-is"
    """The prefix cache at each window: as-is (each start a fresh server: cold, then what the workload
    shares), warm (the workload's shared text sent before every window) or reset (emptied before every
    window, and checked)."""
    input_tokens: int | dict[str, Any] = 256
    """Prompt length in tokens: a number, or a distribution table (kind = uniform/normal/histogram)."""
    output_tokens: int | dict[str, Any] = 256
    """Tokens to generate per request: a number or a distribution table."""
    ignore_eos: bool = True
    """Generate exactly output_tokens (vLLM's ignore_eos)."""
    temperature: float | None = 0.0
    """Sampling temperature sent with each request (0: greedy, what the output guard compares)."""
    top_p: float | None = None
    """Nucleus sampling's top_p sent with each request."""
    seed: int | None = None
    """The sampling seed sent with each request (default: none sent)."""
    model: str | None = None  # served model name; default: first of /v1/models
    api_key_env: str | None = None
    """The NAME of an environment variable holding the API key (never the key itself)."""
    extra_body: dict[str, Any] = Field(default_factory=dict)
    """Extra JSON keys added to every request body."""
    client_cpus: list[int] | None = None  # CPU cores the load generator runs on (apart from the server's)

    @field_validator("client_cpus")
    @classmethod
    def _cores(cls, v: list[int] | None) -> list[int] | None:
        return _core_list(v)

    @field_validator("concurrency")
    @classmethod
    def _positive(cls, v: list[int]) -> list[int]:
        if not v or any(c < 1 for c in v):
            raise ValueError("expected a non-empty list of positive integers")
        twice = sorted({c for c in v if v.count(c) > 1})
        if twice:
            raise ValueError(f"level {', '.join(map(str, twice))} given more than once (each level is measured once "
                             "per start; repeats = N times its trials)")
        if max(v) > MAX_CONCURRENCY:
            raise ValueError(f"{max(v)} streams: at most {MAX_CONCURRENCY} (each open stream holds its records "
                             "and a connection in this one client process)")
        return v

    @field_validator("rates")
    @classmethod
    def _rates(cls, v: list[float] | None) -> list[float] | None:
        if v is not None and (not v or any(not 0 < r < float("inf") for r in v)):
            raise ValueError("expected a non-empty list of request rates > 0 (requests per second)")
        return None if v is None else sorted(dict.fromkeys(float(r) for r in v))

    @model_validator(mode="after")
    def _one_loop(self) -> "WorkloadSection":
        if self.rates is not None and "concurrency" in self.model_fields_set:
            raise ValueError("give concurrency = [...] (a closed loop: streams) or rates = [...] (an open loop: "
                             "requests per second), not both")
        if self.rates is None and ("max_in_flight" in self.model_fields_set or "arrival" in self.model_fields_set):
            raise ValueError("arrival and max_in_flight shape an open loop: give rates = [...] too")
        return self

    @property
    def replays_trace(self) -> bool:
        """Requests sent at a trace's recorded times (its own rate: one open-loop level)."""
        return self.prompt_source.startswith("trace:")

    @property
    def mode(self) -> str:
        """"open" (requests arrive at a rate, or at a trace's times) or "closed" (a fixed number of streams)."""
        return "open" if self.rates is not None or self.replays_trace else "closed"

    @property
    def levels(self) -> list[Level]:
        """The load levels every server start is measured at, in order."""
        if self.rates is not None:
            return [Rate(r) for r in self.rates]
        return list(self.concurrency)

    @field_validator("input_tokens", "output_tokens")
    @classmethod
    def _tokens(cls, v: int | dict[str, Any]) -> int | dict[str, Any]:
        if isinstance(v, int) and v < 1:
            raise ValueError(f"expected at least 1 token, got {v}")
        return v


VERDICT_METRICS = ("tok/s", "goodput", "tok/s/W",
                   *(f"{m}_{q}" for m in ("ttft", "itl", "tpot", "e2e") for q in ("p50", "p90", "p99")))
"""What a verdict can be taken on: closed-loop tok/s (the server counter), goodput under the SLOs,
tok/s per watt (the counter's tokens per joule of GPU energy, where NVML telemetry was sampled),
client-clock latency quantiles per trial."""


class MeasureSection(_Strict):
    """Replication, the stopping rule and the verdict."""

    repeats: int = Field(2, ge=1)  # timed trials per concurrency level per server start
    starts: int = Field(3, ge=1)  # server starts per variant before the first look (the unit of replication)
    sequential: bool = True  # add rounds of starts until every comparison is decided, up to max_starts
    target: str | None = None  # precision goal, e.g. "±2%": also stop once every interval is this narrow
    min_effect: str = "2%"  # equivalence margin: an interval inside ±this reads "equivalent"
    max_starts: int = Field(8, ge=1)
    """The most server starts per variant the stopping rule may reach (8: a large effect is decided
    at the first look, a small one gets the starts it needs; docs/statistics.md)."""
    spending: Literal["decide-early", "linear", "quadratic", "pocock", "obrien-fleming"] = "decide-early"
    """How the stopping rule spends its error over the looks: "decide-early" (62% at the first
    look, the rest at the last) or a classic spending function."""
    verdicts: list[str] = Field(default_factory=lambda: ["tok/s"])  # metrics the verdict decides on
    confidence: float = Field(0.95, gt=0.5, lt=1.0)
    """The verdict's confidence (0.95: at most 5% chance of a wrong claim over the whole family)."""
    randomize_order: bool = False
    """Shuffle the variants' order within each round (default: the counterbalanced A B / B A order)."""
    output_guard: bool = True
    """Compare the variants' greedy outputs on a few prompts: a variant that changes them is not named a
    winner."""
    guard_prompts: int = Field(4, ge=1)
    """Prompts the output guard sends to every variant."""
    guard_max_tokens: int = Field(64, ge=1)
    """Tokens per output-guard answer."""
    request_error_threshold: float = Field(0.05, ge=0, le=1)
    """A trial whose share of failed requests is above this is a failed trial."""
    time_budget_s: float | None = Field(None, gt=0, allow_inf_nan=False)
    """Stop adding rounds once the run has taken this long."""

    @field_validator("target", "min_effect")
    @classmethod
    def _target_is_a_percentage(cls, v: str | None) -> str | None:
        if v:
            value = _percentage(v)
            if value is None or not 0 < value < 1:
                raise ValueError(f"expected a percentage like '±2%', got {v!r}")
        return v

    @field_validator("verdicts")
    @classmethod
    def _known_metrics(cls, v: list[str]) -> list[str]:
        bad = [m for m in v if m not in VERDICT_METRICS]
        if bad or not v:
            raise ValueError(f"expected a non-empty list of {', '.join(VERDICT_METRICS)}; got {v!r}")
        return list(dict.fromkeys(v))

    @property
    def target_rel(self) -> float | None:
        if not self.target:
            return None
        value = _percentage(self.target)
        if value is None:
            raise InputError(f"[measure].target: expected a percentage like '±2%', got {self.target!r}")
        return value

    @property
    def min_effect_rel(self) -> float:
        return _percentage(self.min_effect) or 0.02

    @property
    def first_look(self) -> int:
        """Starts per variant at the stopping rule's first look (an interval needs two)."""
        return max(2, self.starts)

    @property
    def planned_max_starts(self) -> int:
        """The most starts per variant this design can run."""
        if not self.sequential:
            return self.starts
        return max(self.max_starts, self.starts)


def _percentage(text: str) -> float | None:
    """'±2%', '2%', '+2' -> 0.02; None when it is not a finite number."""
    raw = text.strip().lstrip("±+").rstrip("%").strip()
    try:
        value = float(raw) / 100.0
    except ValueError:
        return None
    return value if value == value and abs(value) != float("inf") else None


class SloSection(_Strict):
    """Latency targets: goodput counts the requests that meet all of them."""

    ttft_ms: float | None = Field(None, gt=0)
    """Time-to-first-token target per request, in ms."""
    itl_ms: float | None = Field(None, gt=0)  # p99 inter-token latency per request
    e2e_ms: float | None = Field(None, gt=0)
    """End-to-end latency target per request (request sent to its last token, client clock), in ms."""


class ClusterSection(_Strict):
    """Where starts may be placed with `--executor ray`: a GPU type (Ray's accelerator_type) and node
    labels every server start's node must have, and how often a start lost with its node is run
    again elsewhere."""

    accelerator_type: str | None = None
    """Ray's accelerator_type every server start's node must have (e.g. "A100")."""
    labels: dict[str, str] = Field(default_factory=dict)
    """Node labels every server start's node must have."""
    max_reruns: int = Field(2, ge=0, le=20)
    """How often a start lost with its node is run again elsewhere."""


class TuneParam(_Strict):
    """One dimension of the search space: a server flag and the values it may take, applied to the
    baseline's argv like a variant's `set`. `values` lists choices ("off" removes the flag, and for
    a speculative flag all speculation); `low`/`high` (with `step`, or `log`) give a range.
    `with` is set alongside every value but "off" (e.g. the speculative method with its tokens)."""

    flag: str
    """The server flag this dimension sets."""
    values: list[Any] | None = None
    """The values it may take ("off" removes the flag)."""
    low: float | None = None
    """A range's lower end (with `high`)."""
    high: float | None = None
    """A range's upper end."""
    step: float | None = None
    """A range's step (integers when low, high and step are)."""
    log: bool = False
    """Sample the range on a log scale."""
    with_: dict[str, Any] = Field(default_factory=dict, alias="with")
    """Flags set alongside every value but "off" (key `with` in the file)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    @model_validator(mode="after")
    def _one_kind(self) -> "TuneParam":
        if (self.values is None) == (self.low is None or self.high is None):
            raise ValueError(f"[[tune.param]] {self.flag}: give either values = [...] or low and high")
        if self.values is not None and not self.values:
            raise ValueError(f"[[tune.param]] {self.flag}: values is empty")
        if self.low is not None and self.high is not None and self.low >= self.high:
            raise ValueError(f"[[tune.param]] {self.flag}: low must be below high")
        return self


class TuneSection(_Strict):
    """`truthput tune`: the space, the objective, the constraints and the budget of a search."""

    param: list[TuneParam] = Field(default_factory=list)
    """The search space: one [[tune.param]] per flag."""
    objective: Literal["tokps", "pareto", "goodput", "tokps_per_watt"] = "tokps"
    """tokps: counter tok/s at `level` streams; pareto: tok/s against p99 inter-token latency;
    goodput: output tok/s of the requests that meet the [slo] targets, at `rate` requests/s offered;
    tokps_per_watt: counter tokens per joule of GPU energy at `level` (NVML on a real server; the
    simulator's power model on the simulator)."""
    level: int | None = Field(None, ge=1, le=MAX_CONCURRENCY)
    """The concurrency the objective is measured at (default: the workload's highest)."""
    rate: float | None = Field(None, gt=0)
    """goodput: the open loop's offered rate, requests/s (default: the workload's highest rate)."""
    ttft_p99_ms: float | None = Field(None, gt=0)
    """A constraint: candidates whose p99 TTFT exceeds this are refused."""
    itl_p99_ms: float | None = Field(None, gt=0)
    """A constraint: candidates whose p99 inter-token latency exceeds this are refused."""
    allow_guard_change: list[str] = Field(default_factory=list)
    """Flags known to change numerics (an fp8 KV cache, batch shape): a candidate that sets one of
    these may differ from the baseline's greedy output without being refused."""
    screen: int = Field(400, ge=1)
    """Configurations the simulator evaluates (every one when the space is that small)."""
    sim_starts: int | None = Field(None, ge=1)
    """Simulated starts per configuration, averaged (default: 1 for a closed loop, whose noise-free
    figures repeat; 8 for goodput, whose Poisson arrivals differ by seed, and so does a short
    window's count of good requests)."""

    @property
    def screen_starts(self) -> int:
        if self.sim_starts is not None:
            return self.sim_starts
        return 8 if self.objective == "goodput" else 1
    candidates: int = Field(3, ge=1)
    """Configurations measured on the real server per round (beside the baseline)."""
    rounds: int = Field(2, ge=1)
    """Rounds of real-server measurements (each proves the best candidates so far)."""
    budget_starts: int | None = Field(None, ge=1)
    """Real server starts at most (all rounds, baseline included)."""
    budget_server_minutes: float | None = Field(None, gt=0)
    """Real server time at most, in minutes (all rounds)."""
    seed: int = Field(0, ge=0, le=2**32 - 1)
    """Seeds the search (optuna's sampler; 0 to 2^32-1)."""

    @model_validator(mode="after")
    def _has_space(self) -> "TuneSection":
        if not self.param:
            raise ValueError("[tune] needs at least one [[tune.param]] (a flag and its values or range)")
        flags = [p.flag for p in self.param]
        dupes = sorted({f for f in flags if flags.count(f) > 1})
        if dupes:
            raise ValueError(f"[[tune.param]] flags must be unique; repeated: {', '.join(dupes)}")
        return self


class Experiment(_Strict):
    experiment: ExperimentSection
    server: ServerSection
    hardware: HardwareSection | None = None
    model: ModelSection | None = None
    sim: SimSection = Field(default_factory=SimSection)
    variant: list[VariantSection] = Field(default_factory=list)
    workload: WorkloadSection = Field(default_factory=WorkloadSection)
    measure: MeasureSection = Field(default_factory=MeasureSection)
    slo: SloSection | None = None
    cluster: ClusterSection = Field(default_factory=ClusterSection)
    tune: TuneSection | None = None
    claim: list[dict[str, Any]] = Field(default_factory=list)

    @model_validator(mode="after")
    def _open_loop_verdicts(self) -> "Experiment":
        """At a set rate, tok/s follows the offered rate whatever the server; an open loop is decided
        on latency (and goodput, where [slo] sets targets) unless `verdicts` says otherwise."""
        if self.workload.mode == "open" and "verdicts" not in self.measure.model_fields_set:
            slo = self.slo is not None and bool(self.slo.ttft_ms or self.slo.itl_ms)
            self.measure.verdicts = (["goodput"] if slo else []) + ["ttft_p99", "itl_p99"]
        return self

    @model_validator(mode="after")
    def _goodput_needs_slo(self) -> "Experiment":
        if "goodput" in self.measure.verdicts and (self.slo is None or not (self.slo.ttft_ms or self.slo.itl_ms)):
            raise ValueError("[measure].verdicts has 'goodput': give the latency targets it counts against in "
                             "[slo] (ttft_ms and/or itl_ms)")
        return self

    @model_validator(mode="after")
    def _tune_goodput(self) -> "Experiment":
        """Goodput is counted against the latency targets, at an offered rate."""
        t = self.tune
        if t is None:
            return self
        if t.objective == "goodput":
            if self.slo is None or not (self.slo.ttft_ms or self.slo.itl_ms):
                raise ValueError("[tune] objective = 'goodput': give the latency targets it counts against in "
                                 "[slo] (ttft_ms and/or itl_ms)")
            if t.rate is None and not self.workload.rates:
                raise ValueError("[tune] objective = 'goodput' is measured at an offered rate: give [tune] rate = R "
                                 "(requests/s) or [workload] rates = [...]")
        elif t.rate is not None:
            raise ValueError(f"[tune] rate is the offered rate of a goodput objective; objective = {t.objective!r} "
                             "is measured at a concurrency ([tune] level)")
        return self

    @model_validator(mode="after")
    def _consistent(self) -> "Experiment":
        names = [v.name for v in self.variant]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"variant names must be unique; repeated: {', '.join(dupes)}")
        if not self.variant:
            raise ValueError("at least one [[variant]] is needed (the baseline may be one with no changes)")
        if self.experiment.baseline not in names:
            raise ValueError(
                f"[experiment].baseline = {self.experiment.baseline!r} names no variant; variants are: {', '.join(names)}"
            )
        return self

    def simulate_on(self, gpu: str | None, model: str | None) -> list[str]:
        """Point the simulator at a GPU and a model profile without editing the file (`run --sim-gpu
        --sim-model`): `[hardware]` gets that GPU, as many as the base command's tensor x pipeline
        parallel size (or the file's count, if larger), and `[model]` that profile. Returns what was
        set, in words, for the run's record (a resume and the reports apply the same)."""
        from truthput.experiment.argv import ServerArgv

        said = []
        if gpu:
            base = ServerArgv.parse(self.server.command, engine="vllm")
            gpus = 1
            for flag in ("--tensor-parallel-size", "--pipeline-parallel-size"):
                value = base.get(flag) if base.has(flag) else None
                text = value[-1] if isinstance(value, list) else value
                if isinstance(text, str) and text.isdigit():
                    gpus *= int(text)
            count = max(gpus, self.hardware.count if self.hardware else 1)
            self.hardware = HardwareSection(gpu=gpu, count=count)
            said.append(f"[hardware] gpu = {gpu!r}, count = {count}")
        if model:
            self.model = ModelSection(profile=model)
            said.append(f"[model] profile = {model!r}")
        return said


def _loc(loc: tuple[Any, ...]) -> str:
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        elif not parts:
            parts.append(f"[{item}]")
        else:
            parts.append(f".{item}")
    return "".join(parts) or "(top level)"


def format_validation_error(path: str, exc: ValidationError) -> str:
    """One line per problem: `file: [section].key: what was expected`."""
    lines = []
    for err in exc.errors():
        loc = _loc(tuple(err.get("loc", ())))
        kind = err.get("type", "")
        msg = err.get("msg", "invalid")
        if kind == "extra_forbidden":
            msg = "unknown key"
        elif msg.startswith("Value error, "):
            msg = msg[len("Value error, ") :]
        got = err.get("input")
        if kind not in ("extra_forbidden", "missing", "value_error") and not isinstance(got, (dict, list)):
            msg = f"{msg} (got {got!r})"
        if kind in ("literal_error", "enum") and isinstance(got, str):
            import difflib
            import re

            choices = re.findall(r"'([^']*)'", str((err.get("ctx") or {}).get("expected", "")))
            near = difflib.get_close_matches(got, choices, n=1, cutoff=0.6)
            if near:
                msg = f"{msg}: did you mean {near[0]!r}?"
        lines.append(f"{path}: {loc}: {msg}")
    return "; ".join(lines)


def parse_experiment(text: str, path: str = "<experiment>") -> Experiment:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"{path}: not valid TOML: {exc}") from exc
    try:
        exp = Experiment.model_validate(data)
    except ValidationError as exc:
        raise InputError(format_validation_error(path, exc)) from None
    if exp.claim:
        from truthput.experiment.claims import parse_claims

        parse_claims(exp.claim, where=f"{path}: [[claim]]")
    return exp


def load_experiment(path: str | Path) -> tuple[Experiment, str]:
    """Read and validate an experiment file; returns the model and the exact text (stored with the run)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(f"{p}: cannot read experiment file: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise InputError(f"{p}: not UTF-8 text: byte {exc.start} (0x{exc.object[exc.start]:02x}) cannot be "
                        "decoded; save the file as UTF-8") from None
    return parse_experiment(text, str(p)), text
