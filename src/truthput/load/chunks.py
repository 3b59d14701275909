"""What one streamed chunk says: the few fields the client records, decoded straight from JSON.

Why typed msgspec Structs rather than `orjson.loads` into dicts: a chunk of vLLM's stream carries
a dozen fields (id, model, created, logprobs, stop_reason, ...) and, with
`continuous_usage_stats`, a usage object; the client needs a handful of them. A typed decoder skips the
rest without building dicts for them: 0.47 us per chunk against 0.89 us for orjson plus the dict
lookups (measured on this machine for a vLLM-shaped completion chunk with usage), and that is the
client's largest per-chunk cost after the network read itself.

A chunk with extra fields or fields of another type that truthput does not record (a server's
own dialect) is not an error: it falls back to a generic decode that keeps whatever can be read, so
a quirky server is measured, not rejected. A chunk is malformed -- the request fails with the
reason -- when it does not parse, is not a JSON object, or when a field truthput counts by is
impossible: `choices` not a list, a choice's `text` not a string, `usage.completion_tokens` /
`prompt_tokens` not a whole number from 0 to 2**31.
"""

from __future__ import annotations

from typing import Annotated, Any, Optional

import msgspec
import orjson


MAX_TOKENS_FIELD = 2**31
TokenCount = Annotated[int, msgspec.Meta(ge=0, le=MAX_TOKENS_FIELD)]


class PromptDetails(msgspec.Struct):
    cached_tokens: Optional[TokenCount] = None


class Usage(msgspec.Struct):
    completion_tokens: Optional[TokenCount] = None
    prompt_tokens: Optional[TokenCount] = None
    prompt_tokens_details: Optional[PromptDetails] = None
    """vLLM with --enable-prompt-tokens-details, SGLang: the prompt tokens served from the cache."""


class FunctionDelta(msgspec.Struct):
    arguments: Optional[str] = None


class ToolCallDelta(msgspec.Struct):
    function: Optional[FunctionDelta] = None


class Delta(msgspec.Struct):
    """A chat delta. Every kind of generated text is kept, because the server's token counter
    counts them all: the answer (`content`), a reasoning parser's output (`reasoning` in vLLM
    >= 0.10, `reasoning_content` in older vLLM, SGLang and llama.cpp) and tool-call arguments."""

    content: Optional[str] = None
    reasoning: Optional[str] = None
    reasoning_content: Optional[str] = None
    tool_calls: Optional[list[ToolCallDelta]] = None

    def text(self) -> str | None:
        if self.content:
            return self.content
        if self.reasoning or self.reasoning_content:
            return self.reasoning or self.reasoning_content
        if self.tool_calls:
            args = "".join(c.function.arguments or "" for c in self.tool_calls if c.function is not None)
            return args or None
        return self.content


class Choice(msgspec.Struct):
    text: Optional[str] = None  # /v1/completions
    delta: Optional[Delta] = None  # /v1/chat/completions
    finish_reason: Optional[str] = None


class Timings(msgspec.Struct):
    """llama.cpp's per-request timing, sent in the final chunk: decode tokens and milliseconds."""

    predicted_n: Optional[TokenCount] = None
    predicted_ms: Optional[float] = None
    predicted_per_second: Optional[float] = None
    prompt_n: Optional[TokenCount] = None
    """Prompt tokens it computed for the request."""
    cache_n: Optional[TokenCount] = None
    """Prompt tokens it took from the slot's cache instead."""


class Chunk(msgspec.Struct):
    choices: Optional[list[Choice]] = None
    usage: Optional[Usage] = None
    timings: Optional[Timings] = None
    error: Any = None  # an error event: {"error": {"message": ...}} or a bare string


class MalformedChunk(ValueError):
    """The payload is not JSON, not an object, or a counted field is impossible (the message says which)."""


_typed = msgspec.json.Decoder(Chunk).decode


def decode_chunk(payload: bytes) -> Chunk | None:
    """The chunk's fields (see the module docstring for what is malformed)."""
    try:
        return _typed(payload)
    except msgspec.ValidationError:
        pass  # valid JSON of another shape: read what can be read
    except msgspec.DecodeError as exc:
        raise MalformedChunk(str(exc)) from None
    try:
        doc = orjson.loads(payload)
    except orjson.JSONDecodeError as exc:
        raise MalformedChunk(str(exc)) from None
    return chunk_from_json(doc)


def _count(v: Any, where: str) -> int | None:
    if v is None:
        return None
    if type(v) is not int or not 0 <= v <= MAX_TOKENS_FIELD:
        raise MalformedChunk(f"{where} is {v!r}, not a token count")
    return v


def _str(v: Any) -> str | None:
    return v if isinstance(v, str) else None


def chunk_from_json(doc: Any) -> Chunk | None:
    """A `Chunk` from an already-decoded document of any shape, keeping the fields of the right type."""
    if not isinstance(doc, dict):
        raise MalformedChunk(f"the chunk is JSON {type(doc).__name__} {str(doc)[:40]!r}, not an object")
    usage = None
    u = doc.get("usage")
    if isinstance(u, dict):
        usage = Usage(completion_tokens=_count(u.get("completion_tokens"), "usage.completion_tokens"),
                      prompt_tokens=_count(u.get("prompt_tokens"), "usage.prompt_tokens"))
    choices = None
    cs = doc.get("choices")
    if cs is not None and not isinstance(cs, list):
        raise MalformedChunk(f"`choices` is {type(cs).__name__} {str(cs)[:40]!r}, not a list")
    if isinstance(cs, list):
        choices = []
        for c in cs:
            if not isinstance(c, dict):
                continue
            text = c.get("text")
            if text is not None and not isinstance(text, str):
                raise MalformedChunk(f"a choice's `text` is {type(text).__name__} {str(text)[:40]!r}, not a string")
            d = c.get("delta")
            choices.append(Choice(text=text, delta=_delta(d) if isinstance(d, dict) else None,
                                  finish_reason=_str(c.get("finish_reason"))))
    return Chunk(choices=choices, usage=usage, error=doc.get("error"))


def _delta(d: dict[str, Any]) -> Delta:
    calls = None
    tc = d.get("tool_calls")
    if isinstance(tc, list):
        calls = []
        for c in tc:
            f = c.get("function") if isinstance(c, dict) else None
            calls.append(ToolCallDelta(function=FunctionDelta(arguments=_str(f.get("arguments")))
                                       if isinstance(f, dict) else None))
    return Delta(content=_str(d.get("content")), reasoning=_str(d.get("reasoning")),
                 reasoning_content=_str(d.get("reasoning_content")), tool_calls=calls)
