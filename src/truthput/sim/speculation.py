"""n-gram speculation that follows the text: the simulated model's output is a token sequence that
copies spans, and n-gram proposes by real prompt lookup over prompt + output.

Why: whether n-gram (prompt lookup) drafts at all, and how much of a draft is accepted, is a
property of the text: random-token prompts sampled at temperature 1 hold no repeats (real vLLM
proposes nothing), greedy text that loops is drafted and accepted almost whole. A constant
acceptance rate predicts gains real vLLM does not get and misses gains it does.

The output process: at each position not inside a copy, a copy starts with probability q (else a
fresh token is drawn); a copy runs for a geometric number of tokens (mean `span`) from a source
that is either the prompt (a uniform position) or the request's own recent output (a lag of up to
MAX_LAG tokens: a loop). `share`, the stationary share of copied tokens, sets q. The sequence is a
pure function of (stream key, prompt ids, repetition), so speculation and batching never change
it. Sampled text copies less: at temperature T the share is share * max(0, 1 - T) (at T >= 1 it
repeats only by chance) -- a stated simplification, not a measured curve.

The proposer is vLLM's rule: the longest suffix n-gram (prompt_lookup_min..max) of prompt + output
that occurred earlier, at its earliest occurrence; propose the k tokens after it (fewer when the
context ends sooner, none past max-model-len). A draft token is accepted while it equals the token
the model emits there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from truthput.sim.textgen import _mix

#: Fresh-token vocabulary when the simulator has no tokenizer.
DEFAULT_VOCAB = 32000
#: Longest lag (in output tokens) a self-copy looks back: loops are short cycles.
MAX_LAG = 16
#: vLLM's lookup window when neither prompt_lookup_min nor _max is given.
DEFAULT_LOOKUP = (5, 5)


_SCALE = 1.0 / 18446744073709551616.0


@dataclass(frozen=True)
class Repetition:
    """How much the simulated model repeats itself at temperature 0: `share` of its output tokens
    are copies, in spans of `span` tokens on average. Set with --sim-repetition/--sim-copy-span;
    `fit_repetition` recovers both from a real run's n-gram counters."""

    share: float = 0.25
    span: float = 8.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.share < 1.0:
            raise ValueError(f"repetition share must lie in [0, 1), got {self.share}")
        if self.span < 1.0:
            raise ValueError(f"mean copy span must be at least 1 token, got {self.span}")

    def copy_start_prob(self, temperature: float) -> float:
        """q per fresh position, from the share at this temperature: share = qS / (qS + 1 - q)."""
        share = self.share * max(0.0, 1.0 - temperature)
        if share <= 0.0:
            return 0.0
        s = self.span
        return min(1.0, share / (s * (1.0 - share) + share))


class OutputTokens:
    """Token ids of one request's output, generated on demand; a pure function of its inputs."""

    __slots__ = ("key", "_prompt", "_prompt_ids", "q", "_stop_p", "vocab", "ids", "_src", "_left", "_from_prompt")

    def __init__(self, key: int, prompt_ids: Callable[[], Sequence[int]] | Sequence[int], copy_start_prob: float,
                 span: float, vocab: int = DEFAULT_VOCAB) -> None:
        self.key = key
        self._prompt = prompt_ids
        self._prompt_ids: Sequence[int] | None = None
        self.q = copy_start_prob
        self._stop_p = 1.0 / span  # a copy ends after each token with this chance: mean length `span`
        self.vocab = vocab
        self.ids: list[int] = []
        self._src = 0
        self._left = 0
        self._from_prompt = False

    def prompt(self) -> Sequence[int]:
        if self._prompt_ids is None:
            p = self._prompt
            self._prompt_ids = p() if callable(p) else p
        return self._prompt_ids

    def upto(self, n: int) -> list[int]:
        """The first n ids (generating what is missing)."""
        ids = self.ids
        while len(ids) < n:
            ids.append(self._next(len(ids)))
        return ids

    def _next(self, i: int) -> int:
        key = self.key
        if self._left > 0:
            self._left -= 1
            src = self._src
            self._src += 1
            return self.prompt()[src] if self._from_prompt else self.ids[src]
        h = _mix(key ^ (i * 0x9E3779B1 + 0xC0C0))
        if self.q > 0.0 and h * _SCALE < self.q:
            h2 = _mix(h ^ 0x51)
            u = (h2 & 0xFFFFFFFF) / 4294967296.0
            length = 1 + int(math.log1p(-u) / math.log1p(-self._stop_p)) if self._stop_p < 1.0 else 1
            prompt = self.prompt()
            own = len(self.ids)
            use_own = own >= 1 and (not prompt or (h2 >> 32) & 1)
            if use_own:
                lag = 1 + (h2 >> 33) % min(own, MAX_LAG)
                self._src, self._from_prompt = own - lag, False
            elif prompt:
                self._src, self._from_prompt = (h2 >> 33) % len(prompt), True
                length = min(length, len(prompt) - self._src)
            else:
                return _mix(h ^ 0xF2E5) % self.vocab
            self._left = length
            return self._next(i)
        return _mix(h ^ 0xF2E5) % self.vocab


class NgramProposer:
    """vLLM's n-gram (prompt lookup) proposer over one request's prompt + output, kept as an index
    of each n-gram's earliest start so a proposal costs O(max_n), not a scan of the context."""

    __slots__ = ("min_n", "max_n", "tokens", "_first")

    def __init__(self, prompt_ids: Sequence[int], min_n: int, max_n: int) -> None:
        self.min_n, self.max_n = min_n, max_n
        self.tokens: list[int] = []
        self._first: dict[tuple[int, ...], int] = {}
        self.extend(prompt_ids)

    def extend(self, ids: Sequence[int]) -> None:
        toks, first = self.tokens, self._first
        lo, hi = self.min_n, self.max_n
        for t in ids:
            toks.append(t)
            end = len(toks)
            for n in range(lo, min(hi, end) + 1):
                first.setdefault(tuple(toks[end - n:end]), end - n)

    def propose(self, k: int, max_model_len: int) -> list[int]:
        toks = self.tokens
        total = len(toks)
        k = min(k, max_model_len - total)
        if k <= 0 or total < self.min_n:
            return []
        first = self._first
        for n in range(min(self.max_n, total - 1), self.min_n - 1, -1):
            start = first.get(tuple(toks[total - n:]))
            if start is not None and start < total - n:
                begin = start + n
                return toks[begin:begin + k]
        return []


def accepted_prefix(draft: Sequence[int], ids: Sequence[int], at: int) -> int:
    """Leading draft tokens equal to the tokens the model emits from position `at` (ids holds at
    least at + len(draft) of them, or the request's whole output)."""
    n, limit = 0, min(len(draft), len(ids) - at)
    while n < limit and draft[n] == ids[at + n]:
        n += 1
    return n


def lookup_window(speculative: dict | None) -> tuple[int, int]:
    """(prompt_lookup_min, prompt_lookup_max) as vLLM fills them in: both 5 when neither is given,
    the given one for the other when only one is."""
    cfg = speculative or {}
    lo: Any = cfg.get("prompt_lookup_min")
    hi: Any = cfg.get("prompt_lookup_max")
    if lo is None and hi is None:
        return DEFAULT_LOOKUP
    return int(hi if lo is None else lo), int(lo if hi is None else hi)


@dataclass(frozen=True)
class NgramCounters:
    """What vLLM's spec-decode counters say about a set of requests."""

    generated: int
    drafts: int
    draft_tokens: int
    accepted: int

    @property
    def drafts_per_token(self) -> float:
        return self.drafts / self.generated if self.generated else 0.0

    @property
    def mean_acceptance_length(self) -> float:
        """1 + accepted / drafts (vLLM's figure); 1 when nothing was drafted."""
        return 1.0 + self.accepted / self.drafts if self.drafts else 1.0


def replay(prompts: Sequence[Sequence[int]], output_tokens: int, repetition: Repetition, k: int,
           lookup: tuple[int, int], temperature: float = 0.0, vocab: int = DEFAULT_VOCAB,
           max_model_len: int = 1 << 30, seed: int = 0) -> NgramCounters:
    """n-gram's counters for these prompts without a server: each request's first token from
    prefill, then steps of 1 + accepted tokens, exactly as the engine runs them."""
    q = repetition.copy_start_prob(temperature)
    gen = drafts = draft_tokens = accepted = 0
    for i, prompt in enumerate(prompts):
        out = OutputTokens(_mix(seed * 1_000_003 + i), prompt, q, repetition.span, vocab)
        proposer = NgramProposer(prompt, *lookup)
        ids = out.upto(output_tokens)
        emitted = 1
        proposer.extend(ids[:1])
        while emitted < output_tokens:
            draft = proposer.propose(k, max_model_len)
            acc = 0
            if draft:
                acc = min(accepted_prefix(draft, ids, emitted), output_tokens - emitted - 1)
                drafts += 1
                draft_tokens += len(draft)
                accepted += acc
            n = 1 + acc
            proposer.extend(ids[emitted:emitted + n])
            emitted += n
        gen += output_tokens
    return NgramCounters(gen, drafts, draft_tokens, accepted)


def fit_repetition(drafts_per_token: float, mean_acceptance_length: float, k: int, lookup: tuple[int, int],
                   prompt_tokens: int, output_tokens: int, temperature: float = 0.0,
                   vocab: int = DEFAULT_VOCAB, requests: int = 48) -> tuple[Repetition, NgramCounters]:
    """The repetition whose replay on random prompts of this size gives a real run's n-gram
    counters (drafts per generated token and mean acceptance length), by a grid then a local
    refinement; returns it and what its replay gives, so the caller can show the residual."""
    import random

    rng = random.Random(7)
    prompts = [[rng.randrange(vocab) for _ in range(max(1, prompt_tokens))] for _ in range(requests)]

    def loss(rep: Repetition) -> tuple[float, NgramCounters]:
        c = replay(prompts, output_tokens, rep, k, lookup, temperature, vocab)
        return ((c.drafts_per_token - drafts_per_token) / 0.02) ** 2 + \
            ((c.mean_acceptance_length - mean_acceptance_length) / 0.1) ** 2, c

    best: tuple[float, Repetition, NgramCounters] | None = None
    for share in (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95):
        for span in (2.0, 4.0, 8.0, 16.0, 32.0, 64.0):
            rep = Repetition(share, span)
            value, c = loss(rep)
            if best is None or value < best[0]:
                best = (value, rep, c)
    assert best is not None
    step_share, step_span = 0.05, 2.0
    for _ in range(4):
        improved = True
        while improved:
            improved = False
            _, rep, _ = best
            for share, span in ((rep.share + step_share, rep.span), (rep.share - step_share, rep.span),
                                (rep.share, rep.span * step_span), (rep.share, rep.span / step_span)):
                if not 0.0 <= share < 0.995 or span < 1.0:
                    continue
                cand = Repetition(round(share, 4), round(span, 3))
                value, c = loss(cand)
                if value < best[0]:
                    best, improved = (value, cand, c), True
        step_share, step_span = step_share / 2, math.sqrt(step_span)
    return best[1], best[2]
