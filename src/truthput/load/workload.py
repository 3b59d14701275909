"""Request bodies: input/output lengths drawn from distributions, prompts synthetic or from JSONL.

Why deterministic per (seed, i): an A/B comparison must send arm A and arm B the same requests, and
a rerun must be reproducible, so request i's body depends only on the workload seed and i (each
request gets its own `random.Random`, no shared stream whose order could depend on timing).

Prompt length: with a `tokenizers.Tokenizer` the prompt has exactly the requested number of tokens
as that tokenizer counts them with its special tokens (what a completions endpoint reports as
`prompt_tokens`; a chat template adds its own tokens on top). Without one, the prompt has
round(0.75 * n) words of English-like text (`WORDS_PER_TOKEN`): the usual ratio for English under
BPE vocabularies; the token count it gives is an estimate (provenance `words`), typically within
+-25 % for LLM tokenizers, so the server's `usage.prompt_tokens` is the figure to report.

Every prompt starts with a few random words, so prefix caching cannot share prompts across requests
(except in the `shared-prefix` workload, which is made to share them).

Prompt sources (`WorkloadSpec.prompt_source`):
- `synthetic`: generated English-like text of the drawn input length;
- a JSONL path: one `prompt` or `messages` per line (optionally `max_tokens`);
- `sharegpt` / `sharegpt:PATH`: ShareGPT-format conversations (JSON list or JSONL of
  `{"conversations": [{"from": "human", "value": ...}, {"from": "gpt", "value": ...}]}`); the
  prompt is the first human turn and the output length is the first reply's length (tokenizer
  tokens, else words / 0.75). Without PATH the small generated sample shipped in
  `truthput/load/data/sharegpt_sample.json` is used (nothing is fetched at run time);
- `shared-prefix`: `prefixes` (N) shared prefixes of `prefix_tokens` tokens x `suffixes` (M)
  suffixes of the drawn input length: request i uses prefix i % N and suffix (i // N) % M, so the
  prompt has exactly prefix + suffix tokens with a tokenizer (for `--enable-prefix-caching`);
- `multi-turn`: conversations of `turns` user turns; request i is turn i % turns of conversation
  i // turns and carries the earlier turns (user: input length, assistant: output length) as
  history (chat endpoint); a turn is sent once the previous turn's answer has arrived, as a
  user's client would (`Workload.chain`);
- `tool-call`: chat requests with `tools` (function definitions) and `tool_choice` in the body.
`thinking` (True/False) sends `chat_template_kwargs.enable_thinking` (chat endpoint).
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from truthput.errors import InputError

WORDS_PER_TOKEN = 0.75

# Common English words, mixed lengths, so synthetic text tokenizes like prose.
_VOCAB = (
    "the of and to in is that it was for on are as with his they be at one have this from or had by "
    "word but what some we can out other were all there when up use your how said an each she which do "
    "their time if will way about many then them write would like so these her long make thing see him "
    "two has look more day could go come did number sound no most people my over know water than call "
    "first who may down side been now find any new work part take get place made live where after back "
    "little only round man year came show every good me give our under name very through just form "
    "sentence great think say help low line differ turn cause much mean before move right boy old too "
    "same tell does set three want air well also play small end put home read hand port large spell add "
    "even land here must big high such follow act why ask men change went light kind off need house "
    "picture try us again animal point mother world near build self earth father head stand own page "
    "should country found answer school grow study still learn plant cover food sun four between state "
    "keep eye never last let thought city tree cross farm hard start might story saw far sea draw left "
    "late run while press close night real life few north open seem together next white children begin "
    "got walk example ease paper group always music those both mark often letter until mile river car "
    "feet care second book carry took science eat room friend began idea fish mountain stop once base "
    "hear horse cut sure watch color face wood main enough plain girl usual young ready above ever red "
    "list though feel talk bird soon body dog family direct pose leave song measure door product black "
    "short numeral class wind question happen complete ship area half rock order fire south problem piece "
    "told knew pass since top whole king space heard best hour better true during hundred five remember "
    "step early hold west ground interest reach fast verb sing listen six table travel less morning"
).split()


@dataclass(frozen=True)
class Distribution:
    """A length distribution: `fixed` (value), `uniform` (low..high inclusive), `normal` (mean,
    std, clamped to [low, high]), `histogram` (values with weights)."""

    kind: str = "fixed"
    value: int = 0
    low: int = 1
    high: int = 1
    mean: float = 0.0
    std: float = 0.0
    values: tuple[int, ...] = ()
    weights: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        k = self.kind
        if k == "fixed":
            if self.value < 1:
                raise InputError(f"distribution fixed value {self.value}: must be >= 1")
        elif k == "uniform":
            if not 1 <= self.low <= self.high:
                raise InputError(f"distribution uniform [{self.low}, {self.high}]: need 1 <= low <= high")
        elif k == "normal":
            if self.std < 0 or not 1 <= self.low <= self.high:
                raise InputError(
                    f"distribution normal mean {self.mean} std {self.std} clamp [{self.low}, {self.high}]: "
                    "need std >= 0 and 1 <= low <= high"
                )
        elif k == "histogram":
            if not self.values or len(self.values) != len(self.weights) or min(self.values) < 1:
                raise InputError("distribution histogram: need values >= 1 and one weight per value")
            if min(self.weights) < 0 or sum(self.weights) <= 0:
                raise InputError("distribution histogram: weights must be >= 0 with a positive sum")
        else:
            raise InputError(f"distribution kind {k!r}: expected fixed, uniform, normal or histogram")

    def draw(self, rng: random.Random) -> int:
        k = self.kind
        if k == "fixed":
            return self.value
        if k == "uniform":
            return rng.randint(self.low, self.high)
        if k == "normal":
            return min(self.high, max(self.low, int(round(rng.gauss(self.mean, self.std)))))
        return rng.choices(self.values, weights=self.weights, k=1)[0]

    @property
    def expected(self) -> float:
        k = self.kind
        if k == "fixed":
            return float(self.value)
        if k == "uniform":
            return (self.low + self.high) / 2.0
        if k == "normal":
            return float(self.mean)
        return sum(v * w for v, w in zip(self.values, self.weights)) / sum(self.weights)


_DIST_FIELDS = ("kind", "value", "low", "high", "mean", "std", "values", "weights")


def _as_dist(v: int | Distribution | dict[str, Any], what: str) -> Distribution:
    """An int, a Distribution, or the experiment file's table, e.g.
    `{kind = "uniform", low = 100, high = 900}` or `{kind = "histogram", values = [..], weights = [..]}`."""
    if isinstance(v, Distribution):
        return v
    if isinstance(v, int) and not isinstance(v, bool):
        return Distribution("fixed", value=v)
    if isinstance(v, dict):
        unknown = sorted(set(v) - set(_DIST_FIELDS))
        if unknown:
            raise InputError(f"workload {what}: unknown key(s) {', '.join(unknown)}; expected {', '.join(_DIST_FIELDS)}")
        kw: dict[str, Any] = {k: tuple(x) if isinstance(x, list) else x for k, x in v.items()}
        try:
            return Distribution(**kw)
        except InputError as exc:
            raise InputError(f"workload {what}: {exc}") from None
        except TypeError as exc:
            raise InputError(f"workload {what} {v!r}: {exc}") from None
    raise InputError(f"workload {what} {v!r}: expected an integer, a table or a Distribution")


@dataclass
class WorkloadSpec:
    """What each request asks for. `prompt_source` is "synthetic" or a JSONL path whose lines hold
    `prompt` (str) or `messages` (chat list), optionally `max_tokens` (overrides output_tokens)."""

    input_tokens: int | Distribution | dict[str, Any]  # dict: the experiment file's table
    output_tokens: int | Distribution | dict[str, Any]
    ignore_eos: bool = True
    temperature: float | None = 0.0
    top_p: float | None = None
    seed: int | None = None  # the server-side sampling seed sent in the body
    prompt_source: str = "synthetic"
    endpoint: str = "completions"  # or "chat"
    extra_body: dict[str, Any] = field(default_factory=dict)
    prefixes: int = 4  # shared-prefix: N
    suffixes: int = 16  # shared-prefix: M
    prefix_tokens: int = 256  # shared-prefix: tokens of each shared prefix
    turns: int = 3  # multi-turn: user turns per conversation
    tool_choice: str = "auto"  # tool-call: "auto", "required" or "none"
    thinking: bool | None = None  # chat_template_kwargs.enable_thinking; None: not sent
    trace: Any = None  # trace:PATH: its `load.trace.TraceOptions` (None: replayed as recorded)


ROW_SOURCES = ("jsonl", "sharegpt")
"""Prompt sources that are the user's rows (a file of prompts): each row is sent once, in one
seeded order per run (`Workload.row_of`), unless the run needs more rows than the file has."""


class Workload:
    """Deterministic request bodies: `body(i)` is the same for the same (spec, seed, i, rows).

    A row source (`ROW_SOURCES`) is read as the user's traffic arrives: one seeded order of the
    file's rows per run (`order_seed`; None: the file's own order), request i sending the row at
    place `rows_from + lane + lanes * i` of it. A run's round of starts begins after the places
    earlier rounds used (`rows_from`), and each of a start's trials has its own lane of that
    stretch, so every arm's trial j sends the same rows in the same order whatever its speed, and
    no two trials of one server share a row. A warm-up (`backward`) takes rows from the order's
    end, which no window reaches before the file is used up. A place past the file's rows wraps:
    the row is sent again (`truthput.load.rows` counts it)."""

    def __init__(self, spec: WorkloadSpec, seed: int, tokenizer: Any = None, *, order_seed: int | None = None,
                 rows_from: int = 0, lane: int = 0, lanes: int = 1, backward: bool = False) -> None:
        if spec.endpoint not in ("completions", "chat"):
            raise InputError(f"workload endpoint {spec.endpoint!r}: expected 'completions' or 'chat'")
        self.spec = spec
        self.seed = seed
        self.tokenizer = tokenizer
        self.input_dist = _as_dist(spec.input_tokens, "input_tokens")
        self.output_dist = _as_dist(spec.output_tokens, "output_tokens")
        self._rows: list[dict[str, Any]] | None = None
        self._pairs: list[tuple[str, str]] | None = None
        self.kind = _source_kind(spec.prompt_source)
        if not 0 <= lane < lanes:
            raise ValueError(f"lane {lane} of {lanes}")
        self.rows_from, self.lane, self.lanes, self.backward = rows_from, lane, lanes, backward
        self.trace: Any = None  # a `load.trace.Trace` where the source is one
        self._blocks: dict[tuple[int, int], str] = {}
        if self.kind == "trace":
            from truthput.load.trace import TraceOptions

            self.trace = cached_trace(spec.prompt_source[len("trace:"):]).replayed(spec.trace or TraceOptions())
            chat_only = any(r.body and "prompt" not in r.body for r in self.trace.requests)
            if chat_only and spec.endpoint != "chat":
                raise InputError(f"trace {self.trace.path}: its requests are chat messages: use the chat endpoint")
        if self.kind == "jsonl":
            self._rows = _load_jsonl(Path(spec.prompt_source.removeprefix("jsonl:")))
        elif self.kind == "sharegpt":
            _, _, path = spec.prompt_source.partition(":")
            self._pairs = load_sharegpt(Path(path) if path else SHAREGPT_SAMPLE)
        elif self.kind in ("multi-turn", "tool-call") and spec.endpoint != "chat":
            raise InputError(f"workload {self.kind}: needs the chat endpoint (--endpoint chat)")
        elif self.kind == "shared-prefix":
            if spec.prefixes < 1 or spec.suffixes < 1 or spec.prefix_tokens < 1:
                raise InputError(f"workload shared-prefix: prefixes ({spec.prefixes}), suffixes ({spec.suffixes}) "
                                f"and prefix_tokens ({spec.prefix_tokens}) must be >= 1")
        self.n_rows = len(self._rows or self._pairs or ())
        self._order = list(range(self.n_rows))
        if order_seed is not None:  # None: the file's own order
            random.Random(f"truthput:rows:{order_seed}").shuffle(self._order)
        if self.kind == "multi-turn" and spec.turns < 1:
            raise InputError(f"workload multi-turn turns {spec.turns}: must be >= 1")
        if spec.tool_choice not in ("auto", "required", "none"):
            raise InputError(f"workload tool_choice {spec.tool_choice!r}: expected auto, required or none")
        if spec.thinking is not None and spec.endpoint != "chat":
            raise InputError("workload thinking on/off: chat_template_kwargs apply to the chat endpoint only")
        self._special = 0
        if tokenizer is not None:
            self._special = len(tokenizer.encode("the", add_special_tokens=True).ids) - len(
                tokenizer.encode("the", add_special_tokens=False).ids
            )

    @classmethod
    def of_experiment(cls, exp: Any, seed: int, tokenizer: Any = None, **rows: Any) -> Workload:
        """The workload of an experiment's `[workload]` (`experiment.file.Experiment`), the run's
        order of rows seeded by its `[experiment] seed`."""
        wl = exp.workload
        spec = WorkloadSpec(input_tokens=wl.input_tokens, output_tokens=wl.output_tokens, ignore_eos=wl.ignore_eos,
                            temperature=wl.temperature, top_p=wl.top_p, seed=wl.seed, prompt_source=wl.prompt_source,
                            endpoint=wl.endpoint, extra_body=dict(wl.extra_body), prefixes=wl.prefixes,
                            suffixes=wl.suffixes, prefix_tokens=wl.prefix_tokens, turns=wl.turns,
                            trace=_trace_options(wl.trace) if wl.prompt_source.startswith("trace:") else None)
        return cls(spec, seed=seed, tokenizer=tokenizer, order_seed=exp.experiment.seed, **rows)

    @property
    def chain(self) -> int:
        """Requests in a row that go one after another: request i (i % chain != 0) is sent only once
        request i - 1 has been answered -- a conversation's turns. 1: every request stands alone."""
        return self.spec.turns if self.kind == "multi-turn" else 1

    def position(self, i: int) -> int | None:
        """Request i's place in the run's order of rows (None: not a row source); >= n_rows: sent again."""
        if not self.n_rows:
            return None
        return self.n_rows - 1 - i if self.backward else self.rows_from + self.lane + self.lanes * i

    def row_of(self, i: int) -> int | None:
        """The file row (0-based) request i sends (None: not a row source)."""
        pos = self.position(i)
        return None if pos is None else self.row_at(pos)

    def row_at(self, position: int) -> int:
        """The file row at a place in the run's order (wrapping past the end)."""
        return self._order[position % self.n_rows]

    def _rng(self, i: int, stream: str) -> random.Random:
        return random.Random(f"truthput:{self.seed}:{i}:{stream}")

    def lengths(self, i: int) -> tuple[int, int]:
        """(input tokens, output tokens) requested for request i."""
        if self.trace is not None:
            r = self.trace.requests[i % len(self.trace.requests)]
            return (r.input_tokens or self.input_dist.draw(self._rng(i, "in")),
                    r.output_tokens or self.output_dist.draw(self._rng(i, "out")))
        return self.input_dist.draw(self._rng(i, "in")), self.output_dist.draw(self._rng(i, "out"))

    def trace_offsets(self) -> list[float] | None:
        """A trace's replay: each request's send time after the first (None: not a trace)."""
        return self.trace.offsets if self.trace is not None else None

    def _trace_prompt(self, i: int, n_tokens: int, hash_ids: tuple[int, ...]) -> str:
        """Request i's prompt of n tokens: one text per hash id at the trace's block size (the same id,
        the same text, so the server's cache sees the trace's sharing; text of this trial's seed, so two
        trials of one server share nothing), the rest its own."""
        if not hash_ids:
            return self.prompt(i, n_tokens)
        assert self.trace is not None
        bt = self.trace.block_tokens
        parts = []
        for k, h in enumerate(hash_ids):
            size = min(bt, n_tokens - k * bt)
            if size <= 0:
                break
            key = (h, size)
            if key not in self._blocks:
                rng = random.Random(f"truthput:{self.seed}:hash:{h}")
                self._blocks[key] = self.text(rng, size) if self.tokenizer is None else \
                    self._exact_prompt(rng, size, special=False)
            parts.append(self._blocks[key])
        return " ".join(parts)

    def prompt(self, i: int, n_tokens: int) -> str:
        """Synthetic prompt for request i: exactly n tokens with a tokenizer, else ~n (words)."""
        rng = self._rng(i, "text")
        if self.tokenizer is None:
            n_words = max(1, int(round(n_tokens * WORDS_PER_TOKEN)))
            return " ".join(rng.choices(_VOCAB, k=n_words))
        return self._exact_prompt(rng, n_tokens)

    def _exact_prompt(self, rng: random.Random, n_tokens: int, head: str = "", special: bool = True) -> str:
        """Text of exactly n_tokens tokens (counting the tokenizer's special tokens when `special`)
        that starts with `head` (whose own tokens must stay as they are: a shared prefix)."""
        tok = self.tokenizer
        target = n_tokens - (self._special if special else 0)
        if target < 1:
            raise InputError(f"workload input_tokens {n_tokens}: below the tokenizer's {self._special} special tokens")
        words = rng.choices(_VOCAB, k=target + 8)
        lead = head + " " if head else ""
        while True:
            text = lead + " ".join(words)
            enc = tok.encode(text, add_special_tokens=False)
            if len(enc.ids) >= target:
                break
            words += rng.choices(_VOCAB, k=target - len(enc.ids) + 8)
        # Cut at the end of the target-th token, then fix up any merge across the cut.
        cut = max(enc.offsets[target - 1][1], len(lead))
        text = text[:cut]
        for _ in range(64):
            n = len(tok.encode(text, add_special_tokens=False).ids)
            if n == target:
                return text
            if n > target and len(text) > len(lead):
                text = text[:-1].rstrip() or text[:-1]
                if len(text) < len(lead):
                    text = lead
            else:
                text = text + " " + rng.choice(("a", "I", "x", "o"))
        raise InputError(f"workload: could not build a prompt of exactly {n_tokens} tokens with the given tokenizer")

    def text(self, rng: random.Random, n_tokens: int, head: str = "") -> str:
        """Generated text of n tokens (exact with a tokenizer, else round(0.75 n) words)."""
        if self.tokenizer is None:
            n_words = max(1, int(round(n_tokens * WORDS_PER_TOKEN)))
            words = rng.choices(_VOCAB, k=n_words)
            return (head + " " + " ".join(words)) if head else " ".join(words)
        return self._exact_prompt(rng, n_tokens, head)

    def count_tokens(self, text: str) -> int:
        """Tokens of `text` with the tokenizer (no special tokens), else round(words / 0.75)."""
        if self.tokenizer is None:
            return max(1, int(round(len(text.split()) / WORDS_PER_TOKEN)))
        return len(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def shared_prefix(self, p: int) -> str:
        """Shared prefix p of the shared-prefix workload (prefix_tokens tokens, no special tokens)."""
        rng = random.Random(f"truthput:{self.seed}:prefix:{p}")
        if self.tokenizer is None:
            return self.text(rng, self.spec.prefix_tokens)
        return self._exact_prompt(rng, self.spec.prefix_tokens, special=False)

    def shared_texts(self) -> list[str]:
        """The text this workload's requests share by design, once each (what `cache = "warm"`
        sends before a window): the shared-prefix workload's prefixes; none for the others."""
        if self.kind == "shared-prefix":
            return [self.shared_prefix(p) for p in range(self.spec.prefixes)]
        return []

    def sharing(self) -> str:
        """What the workload shares by design, in words (said beside the server's hit rate)."""
        spec = self.spec
        if self.trace is not None:
            share = self.trace.shared_share()
            return f"{spec.prompt_source}: " + (
                "the recorded requests' own text, each sent once: only what they themselves share" if share is None
                else f"{100 * share:.0f}% of the prompt tokens are in {self.trace.block_tokens}-token blocks an earlier "
                     "request of the replayed slice had (its hash ids): what a cache that keeps everything would serve")
        return f"{spec.prompt_source}: " + {
            "shared-prefix": f"{spec.prefixes} prefixes of {spec.prefix_tokens} tokens, each shared by every "
                             f"{spec.prefixes}th request",
            "multi-turn": f"conversations of {spec.turns} turns: each turn carries the earlier turns as history "
                          "and is sent after the previous turn's answer",
            "jsonl": "the user's rows, each sent once: only what the rows themselves share",
            "sharegpt": "the user's rows, each sent once: only what the rows themselves share",
        }.get(self.kind, "nothing: every prompt begins with its own random words")

    def asked(self, i: int) -> tuple[int | None, int | None]:
        """(prompt tokens, completion tokens) request i asked for: the prompt's only where truthput
        built it to a length from one draw (the synthetic workload); the completion's where the
        output length is a setting (under `ignore_eos`, what each request should get)."""
        n_in, n_out = self.lengths(i)
        if self.trace is not None:  # the recorded lengths, where truthput makes the text
            r = self.trace.requests[i % len(self.trace.requests)]
            return (None, n_out) if r.body is not None else (n_in, n_out)
        return (n_in if self.kind == "synthetic" else None,
                n_out if self.kind in ("synthetic", "shared-prefix", "multi-turn", "tool-call") else None)

    def body(self, i: int) -> dict[str, Any]:
        """The request body for request i (without `model` unless the JSONL row names one)."""
        spec = self.spec
        n_in, n_out = self.lengths(i)
        body: dict[str, Any] = {}
        chat = spec.endpoint == "chat"
        kind = self.kind
        if kind == "trace":
            assert self.trace is not None
            r = self.trace.requests[i % len(self.trace.requests)]
            if r.body is not None:
                body = dict(r.body)
                if chat and "messages" not in body:
                    body["messages"] = [{"role": "user", "content": body.pop("prompt")}]
                n_out = int(body.pop("max_tokens", n_out))
            else:
                text = self._trace_prompt(i, n_in, r.hash_ids)
                body["messages" if chat else "prompt"] = [{"role": "user", "content": text}] if chat else text
        elif kind == "jsonl":
            assert self._rows is not None
            row = self._rows[self.row_of(i) or 0]
            if "max_tokens" in row:
                n_out = int(row["max_tokens"])
            if chat:
                body["messages"] = row.get("messages") or [{"role": "user", "content": row["prompt"]}]
            else:
                if "prompt" not in row:
                    raise InputError(f"workload {spec.prompt_source}: the completions endpoint needs a 'prompt' per line")
                body["prompt"] = row["prompt"]
        elif kind == "sharegpt":
            assert self._pairs is not None
            prompt, reply = self._pairs[self.row_of(i) or 0]
            n_out = self.count_tokens(reply)
            if chat:
                body["messages"] = [{"role": "user", "content": prompt}]
            else:
                body["prompt"] = prompt
        elif kind == "shared-prefix":
            p = i % spec.prefixes
            m = (i // spec.prefixes) % spec.suffixes
            prefix = self.shared_prefix(p)
            rng = random.Random(f"truthput:{self.seed}:suffix:{p}:{m}")
            n_suffix = self.input_dist.draw(random.Random(f"truthput:{self.seed}:{p}:{m}:in"))
            text = self.text(rng, spec.prefix_tokens + n_suffix, head=prefix) if self.tokenizer is not None \
                else prefix + " " + self.text(rng, n_suffix)
            if chat:
                body["messages"] = [{"role": "user", "content": text}]
            else:
                body["prompt"] = text
        elif kind == "multi-turn":
            conv, turn = divmod(i, spec.turns)
            messages: list[dict[str, Any]] = []
            for t in range(turn + 1):
                j = conv * spec.turns + t
                t_in, t_out = self.lengths(j)
                messages.append({"role": "user", "content": self.prompt(j, t_in)})
                if t < turn:
                    messages.append({"role": "assistant", "content": self.text(self._rng(j, "reply"), t_out)})
            body["messages"] = messages
        elif kind == "tool-call":
            rng = self._rng(i, "text")
            body["messages"] = [{"role": "user", "content": self.text(rng, n_in, head=TOOL_PROMPT_HEAD)}]
            body["tools"] = TOOLS
            body["tool_choice"] = spec.tool_choice
        else:
            text = self.prompt(i, n_in)
            if chat:
                body["messages"] = [{"role": "user", "content": text}]
            else:
                body["prompt"] = text
        body["max_tokens"] = max(1, n_out)
        if spec.ignore_eos:
            body["ignore_eos"] = True
        if spec.temperature is not None:
            body["temperature"] = spec.temperature
        if spec.top_p is not None:
            body["top_p"] = spec.top_p
        if spec.seed is not None:
            body["seed"] = spec.seed
        body.update(spec.extra_body)
        if spec.thinking is not None:
            kwargs = dict(body.get("chat_template_kwargs") or {})
            kwargs["enable_thinking"] = spec.thinking
            body["chat_template_kwargs"] = kwargs
        return body


SHAREGPT_SAMPLE = Path(__file__).with_name("data") / "sharegpt_sample.json"

TOOL_PROMPT_HEAD = "Use the tools if they help."

# Two small function tools in the OpenAI format (what a server's tool-call parser sees).
TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather for a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "City name"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "search_notes", "description": "Search the user's notes for a phrase.",
        "parameters": {"type": "object", "properties": {
            "query": {"type": "string"}, "limit": {"type": "integer", "minimum": 1, "maximum": 20}},
            "required": ["query"]}}},
]


GENERATED_SOURCES = ("synthetic", "shared-prefix", "multi-turn", "tool-call")
"""Prompt sources whose text truthput generates (word salad of English words): no user's text."""


def is_generated_text(source: str) -> bool:
    """Whether the prompts of `source` are text truthput made up rather than people's text (a trace
    of lengths and hash ids is given text made up here; a trace of the user's own requests is not)."""
    if source.startswith("trace:"):
        try:
            return bool(cached_trace(source[len("trace:"):]).format != "jsonl")
        except InputError:
            return True
    return source in GENERATED_SOURCES


def _trace_options(section: Any) -> Any:
    """`[workload.trace]` as the replay's `load.trace.TraceOptions`."""
    from truthput.load.trace import TraceOptions

    return TraceOptions(speedup=section.speedup, max_gap_s=section.max_gap_s, start_s=section.start_s,
                        duration_s=section.duration_s, block_tokens=section.block_tokens)


@functools.lru_cache(maxsize=8)
def _trace_at(path: str, mtime_ns: int) -> Any:
    from truthput.load.trace import read_trace

    return read_trace(path)


def cached_trace(path: str) -> Any:
    """The trace in `path` (`load.trace.Trace`), read once while the file is unchanged."""
    try:
        mtime = Path(path).stat().st_mtime_ns
    except OSError as exc:
        raise InputError(f"trace {path}: cannot read ({exc.strerror})") from None
    return _trace_at(path, mtime)


def _source_kind(source: str) -> str:
    if source in GENERATED_SOURCES:
        return source
    if source.startswith("trace:"):
        if not source[len("trace:"):]:
            raise InputError("prompt_source trace:PATH: the path is missing")
        return "trace"
    if source == "sharegpt" or source.startswith("sharegpt:"):
        return "sharegpt"
    if source == "jsonl:":
        raise InputError("prompt_source jsonl:PATH: the path is missing")
    return "jsonl"  # a path, or jsonl:PATH as `load --workload` takes it


def load_sharegpt(path: Path) -> list[tuple[str, str]]:
    """(first human turn, first reply) of every ShareGPT conversation that has both."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise InputError(f"workload sharegpt {path}: cannot read ({exc.strerror})") from None
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        try:
            data = [orjson.loads(line) for line in raw.splitlines() if line.strip()]
        except orjson.JSONDecodeError as exc:
            raise InputError(f"workload sharegpt {path}: neither a JSON list nor JSONL ({exc})") from None
    if not isinstance(data, list):
        raise InputError(f"workload sharegpt {path}: expected a list of conversations")
    pairs: list[tuple[str, str]] = []
    for conv in data:
        turns = conv.get("conversations") if isinstance(conv, dict) else None
        if not isinstance(turns, list):
            continue
        human = next((k for k, t in enumerate(turns) if isinstance(t, dict) and t.get("from") in ("human", "user")), None)
        if human is None or human + 1 >= len(turns):
            continue
        reply = turns[human + 1]
        if not isinstance(reply, dict) or reply.get("from") not in ("gpt", "assistant", "chatgpt", "bard"):
            continue
        q, a = str(turns[human].get("value") or ""), str(reply.get("value") or "")
        if q.strip() and a.strip():
            pairs.append((q, a))
    if not pairs:
        raise InputError(f"workload sharegpt {path}: no conversation with a human turn followed by a reply")
    return pairs


def _load_jsonl(path: Path) -> list[dict[str, Any]]:
    from truthput.load.trace import json_objects

    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise InputError(f"workload prompt_source {path}: cannot read ({exc.strerror})") from None
    rows: list[dict[str, Any]] = []
    for n, row in json_objects(raw, f"workload prompt_source {path}"):
        if not ("prompt" in row or "messages" in row):
            raise InputError(f"workload prompt_source {path}:{n}: expected an object with 'prompt' or 'messages'")
        rows.append(row)
    if not rows:
        raise InputError(f"workload prompt_source {path}: no prompts")
    return rows
