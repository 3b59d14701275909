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

Every prompt starts with a few random words, so prefix caching cannot share prompts across requests.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from truthput.errors import SpecError

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
                raise SpecError(f"distribution fixed value {self.value}: must be >= 1")
        elif k == "uniform":
            if not 1 <= self.low <= self.high:
                raise SpecError(f"distribution uniform [{self.low}, {self.high}]: need 1 <= low <= high")
        elif k == "normal":
            if self.std < 0 or not 1 <= self.low <= self.high:
                raise SpecError(
                    f"distribution normal mean {self.mean} std {self.std} clamp [{self.low}, {self.high}]: "
                    "need std >= 0 and 1 <= low <= high"
                )
        elif k == "histogram":
            if not self.values or len(self.values) != len(self.weights) or min(self.values) < 1:
                raise SpecError("distribution histogram: need values >= 1 and one weight per value")
            if min(self.weights) < 0 or sum(self.weights) <= 0:
                raise SpecError("distribution histogram: weights must be >= 0 with a positive sum")
        else:
            raise SpecError(f"distribution kind {k!r}: expected fixed, uniform, normal or histogram")

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
            raise SpecError(f"workload {what}: unknown key(s) {', '.join(unknown)}; expected {', '.join(_DIST_FIELDS)}")
        kw = {k: tuple(x) if isinstance(x, list) else x for k, x in v.items()}
        try:
            return Distribution(**kw)
        except SpecError as exc:
            raise SpecError(f"workload {what}: {exc}") from None
        except TypeError as exc:
            raise SpecError(f"workload {what} {v!r}: {exc}") from None
    raise SpecError(f"workload {what} {v!r}: expected an integer, a table or a Distribution")


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


class Workload:
    """Deterministic request bodies: `body(i)` is the same for the same (spec, seed, i)."""

    def __init__(self, spec: WorkloadSpec, seed: int, tokenizer: Any = None) -> None:
        if spec.endpoint not in ("completions", "chat"):
            raise SpecError(f"workload endpoint {spec.endpoint!r}: expected 'completions' or 'chat'")
        self.spec = spec
        self.seed = seed
        self.tokenizer = tokenizer
        self.input_dist = _as_dist(spec.input_tokens, "input_tokens")
        self.output_dist = _as_dist(spec.output_tokens, "output_tokens")
        self._rows: list[dict[str, Any]] | None = None
        if spec.prompt_source != "synthetic":
            self._rows = _load_jsonl(Path(spec.prompt_source))
        self._special = 0
        if tokenizer is not None:
            self._special = len(tokenizer.encode("the", add_special_tokens=True).ids) - len(
                tokenizer.encode("the", add_special_tokens=False).ids
            )

    def _rng(self, i: int, stream: str) -> random.Random:
        return random.Random(f"truthput:{self.seed}:{i}:{stream}")

    def lengths(self, i: int) -> tuple[int, int]:
        """(input tokens, output tokens) requested for request i."""
        return self.input_dist.draw(self._rng(i, "in")), self.output_dist.draw(self._rng(i, "out"))

    def prompt(self, i: int, n_tokens: int) -> str:
        """Synthetic prompt for request i: exactly n tokens with a tokenizer, else ~n (words)."""
        rng = self._rng(i, "text")
        if self.tokenizer is None:
            n_words = max(1, int(round(n_tokens * WORDS_PER_TOKEN)))
            return " ".join(rng.choices(_VOCAB, k=n_words))
        return self._exact_prompt(rng, n_tokens)

    def _exact_prompt(self, rng: random.Random, n_tokens: int) -> str:
        tok = self.tokenizer
        target = n_tokens - self._special
        if target < 1:
            raise SpecError(f"workload input_tokens {n_tokens}: below the tokenizer's {self._special} special tokens")
        words = rng.choices(_VOCAB, k=target + 8)
        while True:
            text = " ".join(words)
            enc = tok.encode(text, add_special_tokens=False)
            if len(enc.ids) >= target:
                break
            words += rng.choices(_VOCAB, k=target - len(enc.ids) + 8)
        # Cut at the end of the target-th token, then fix up any merge across the cut.
        cut = enc.offsets[target - 1][1]
        text = text[:cut]
        for _ in range(64):
            n = len(tok.encode(text, add_special_tokens=False).ids)
            if n == target:
                return text
            if n > target:
                text = text[:-1].rstrip() or text[:-1]
            else:
                text = text + " " + rng.choice(("a", "I", "x", "o"))
        raise SpecError(f"workload: could not build a prompt of exactly {n_tokens} tokens with the given tokenizer")

    def body(self, i: int) -> dict[str, Any]:
        """The request body for request i (without `model` unless the JSONL row names one)."""
        spec = self.spec
        n_in, n_out = self.lengths(i)
        body: dict[str, Any] = {}
        if self._rows is not None:
            row = self._rows[i % len(self._rows)]
            if "max_tokens" in row:
                n_out = int(row["max_tokens"])
            if spec.endpoint == "chat":
                body["messages"] = row.get("messages") or [{"role": "user", "content": row["prompt"]}]
            else:
                if "prompt" not in row:
                    raise SpecError(f"workload {spec.prompt_source}: the completions endpoint needs a 'prompt' per line")
                body["prompt"] = row["prompt"]
        else:
            text = self.prompt(i, n_in)
            if spec.endpoint == "chat":
                body["messages"] = [{"role": "user", "content": text}]
            else:
                body["prompt"] = text
        body["max_tokens"] = n_out
        if spec.ignore_eos:
            body["ignore_eos"] = True
        if spec.temperature is not None:
            body["temperature"] = spec.temperature
        if spec.top_p is not None:
            body["top_p"] = spec.top_p
        if spec.seed is not None:
            body["seed"] = spec.seed
        body.update(spec.extra_body)
        return body


def _load_jsonl(path: Path) -> list[dict[str, Any]]:
    try:
        lines = path.read_bytes().splitlines()
    except OSError as exc:
        raise SpecError(f"workload prompt_source {path}: cannot read ({exc.strerror})") from None
    rows: list[dict[str, Any]] = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            raise SpecError(f"workload prompt_source {path}:{n}: not JSON ({exc})") from None
        if not isinstance(row, dict) or not ("prompt" in row or "messages" in row):
            raise SpecError(f"workload prompt_source {path}:{n}: expected an object with 'prompt' or 'messages'")
        rows.append(row)
    if not rows:
        raise SpecError(f"workload prompt_source {path}: no prompts")
    return rows
