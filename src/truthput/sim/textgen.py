"""The simulator's tokenizer and text: deterministic word pieces with a known words-per-token ratio.

Why a fixed ratio: the seed's word-count probe under-counted tokens by ~25-30%; truthput's audit
must be able to show that, so the sim's text has an exactly known whitespace-words-per-token ratio
(WORDS_PER_TOKEN). Tokens come in blocks of four: three start a new word (" piece") and one
continues the previous word ("piece"), so every whole block holds exactly three words.

Greedy output is a pure function of (prompt, position), so speculation, batching and timing can
never change it; `--kv-cache-dtype fp8` perturbs a seeded small fraction of prompts' outputs
(FP8_PERTURBED_FRACTION) so an output-equality guard has something to find.
"""

from __future__ import annotations

import hashlib
import math
from typing import Protocol, Sequence

#: Whitespace-separated words per generated token, exact over every 4-token block.
WORDS_PER_TOKEN = 0.75
TOKENS_PER_BLOCK = 4
#: Fraction of prompts whose greedy output differs under an fp8 KV cache.
FP8_PERTURBED_FRACTION = 0.05
#: Prompt tokens added per chat message (role markers), and once for the assistant prefix.
CHAT_TOKENS_PER_MESSAGE = 4
CHAT_TOKENS_PER_REPLY = 3

_WORD_STARTS = tuple(
    " " + w
    for w in (
        "the of and to in is that for it as was with be by on not he this are or his from at "
        "which but have an they you were her she there one all we their can has been if more when "
        "will would who so no time out up said about other into than its some could them these two "
        "may first then do any like my now over such our man me even most made after also did many "
        "before must through back years where much your way well down should because each just "
        "those people how too little state good very make world still own see men work long get "
        "here between both life being under never day same another know while last might us great "
        "old year off come since against go came right used take three"
    ).split()
)
_CONTINUATIONS = tuple(
    "ing ed er ly tion s es al ment ness able ful less ous ive ize ity ance ence ship ward"
    .split()
)
_N_START = len(_WORD_STARTS)
_N_CONT = len(_CONTINUATIONS)


def word_ids(text: str, vocab: int) -> list[int]:
    """Token ids of a text when the simulator has no tokenizer: one per whitespace word, the same
    id for the same word, so repeats in the text are repeats in the ids."""
    return [text_key(w) % vocab for w in text.split()]


def text_key(text: str) -> int:
    """A stable 64-bit key of a prompt (Python's hash() is salted per process)."""
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "little")


def count_text_tokens(text: str) -> int:
    """Prompt tokens of a text: words / WORDS_PER_TOKEN rounded up, at least 1."""
    words = len(text.split())
    return max(1, math.ceil(words / WORDS_PER_TOKEN))


def count_chat_tokens(messages: list[dict]) -> int:
    """Prompt tokens of a chat: each message's content plus role markers, plus the reply prefix."""
    total = CHAT_TOKENS_PER_REPLY
    for m in messages:
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, list):  # OpenAI content parts
            content = " ".join(p.get("text", "") for p in content if isinstance(p, dict))
        total += CHAT_TOKENS_PER_MESSAGE + (count_text_tokens(content) if content else 0)
    return total


def chat_key_text(messages: list[dict]) -> str:
    """The text greedy output is keyed on for a chat request (role and content of each message)."""
    parts = []
    for m in messages:
        if isinstance(m, dict):
            parts.append(f"{m.get('role', '')}\x1f{m.get('content', '')}")
    return "\x1e".join(parts)


def _mix(x: int) -> int:
    """splitmix64 finaliser: a cheap, well-spread integer hash."""
    x = (x + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return x ^ (x >> 31)


def fp8_perturbs(key: int) -> bool:
    """Whether an fp8 KV cache changes this prompt's greedy output (a seeded FP8_PERTURBED_FRACTION)."""
    return (_mix(key ^ 0xF8F8F8F8) % 10_000) < FP8_PERTURBED_FRACTION * 10_000


class TokenStream:
    """The text of one request: token i's id comes from `tokens` (the output process, which may
    copy spans: see sim/speculation.py) and its piece from that id, while whether position i starts
    a word stays a function of (key, i) alone, so WORDS_PER_TOKEN holds exactly whatever is copied.
    Without `tokens` every id is fresh, a pure function of (key, i)."""

    __slots__ = ("key", "tokens")

    def __init__(self, key: int, tokens: "TokenIds | None" = None) -> None:
        self.key = key
        self.tokens = tokens

    def token_id(self, i: int) -> int:
        if self.tokens is not None:
            return self.tokens.upto(i + 1)[i]
        return _mix(self.key ^ (i * 0x9E3779B1 + 0xC0C0))

    def piece(self, i: int) -> str:
        return self._render(i, self.token_id(i))

    def _render(self, i: int, token_id: int) -> str:
        block, pos = divmod(i, TOKENS_PER_BLOCK)
        h = _mix(self.key ^ (block * 0x100000001B3))
        cont_pos = 1 + (h % (TOKENS_PER_BLOCK - 1))  # positions 1..3; position 0 always starts a word
        t = _mix(token_id)
        if pos == cont_pos:
            return _CONTINUATIONS[t % _N_CONT]
        return _WORD_STARTS[t % _N_START]

    def alternative(self, i: int, j: int) -> str:
        """A piece the model might have said instead at position i (logprobs' other candidates)."""
        return _WORD_STARTS[_mix(self.key ^ (i * 7919 + j)) % _N_START]

    def text(self, start: int, stop: int) -> str:
        if self.tokens is None:
            return "".join([self.piece(i) for i in range(start, stop)])
        ids = self.tokens.upto(stop)  # generated once for the span, not once per piece
        render = self._render
        return "".join([render(i, ids[i]) for i in range(start, stop)])


class TokenIds(Protocol):
    """The output process a TokenStream renders (speculation.OutputTokens)."""

    def upto(self, n: int) -> list[int]: ...

    def prompt(self) -> Sequence[int]: ...


def stream_key(prompt_key: int, *, greedy: bool, seed: int | None, fp8_kv: bool, fallback: int) -> int:
    """The key a request's token stream is drawn from.

    Greedy: the prompt alone (fp8 KV may flip it for a seeded fraction of prompts). Sampled with a
    seed: prompt and seed. Sampled without one: `fallback`, a server-drawn random number.
    """
    if greedy:
        if fp8_kv and fp8_perturbs(prompt_key):
            return _mix(prompt_key ^ 0x0F8)
        return prompt_key
    if seed is not None:
        return _mix(prompt_key ^ _mix(seed & 0xFFFFFFFFFFFFFFFF))
    return fallback


def natural_length(key: int, mean_tokens: float = 256.0) -> int:
    """Output length when the model "stops by itself" (no ignore_eos): seeded, geometric-like."""
    u = (_mix(key ^ 0xE05) % 1_000_000 + 0.5) / 1_000_000
    return max(1, int(-math.log(u) * mean_tokens))
