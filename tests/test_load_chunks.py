"""The typed chunk decoder reads what the generic decode would, and never rejects a quirky server."""

from __future__ import annotations

import orjson
import pytest

from truthput.load.chunks import MalformedChunk, chunk_from_json, decode_chunk

VLLM_COMPLETION = (b'{"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,'
                   b'"text":" the","logprobs":null,"finish_reason":null,"stop_reason":null}],'
                   b'"usage":{"prompt_tokens":16,"total_tokens":19,"completion_tokens":3}}')
VLLM_CHAT = (b'{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,'
             b'"delta":{"content":" river","reasoning_content":null},"logprobs":null,"finish_reason":"length"}]}')


def test_vllm_shaped_chunks() -> None:
    c = decode_chunk(VLLM_COMPLETION)
    assert c.choices[0].text == " the" and c.usage.completion_tokens == 3 and c.usage.prompt_tokens == 16
    assert c.error is None
    c = decode_chunk(VLLM_CHAT)
    assert c.choices[0].delta.content == " river" and c.choices[0].finish_reason == "length" and c.usage is None


@pytest.mark.parametrize("payload", [
    VLLM_COMPLETION, VLLM_CHAT,
    b'{"choices":null,"usage":{"completion_tokens":4,"prompt_tokens":5},"system_fingerprint":7}',
    b'{"choices":[{"delta":"odd"}, 3],"usage":[]}',  # fields truthput does not count by: dropped
    b'{"error":{"message":"out of memory","code":500}}',
    b'{"error":"bare string"}',
])
def test_typed_decode_equals_the_generic_reading(payload: bytes) -> None:
    assert decode_chunk(payload) == chunk_from_json(orjson.loads(payload))


def test_wrong_types_of_uncounted_fields_are_dropped_not_fatal() -> None:
    c = decode_chunk(b'{"choices":[{"text":"a","finish_reason":7,"delta":"odd"}],"usage":{"completion_tokens":3}}')
    assert c.choices[0].text == "a" and c.choices[0].finish_reason is None and c.usage.completion_tokens == 3


@pytest.mark.parametrize("payload, why", [
    (b'{"choices":5}', "`choices` is int"),
    (b'{"choices":{"text":"a"}}', "`choices` is dict"),
    (b'{"choices":[{"text":7}]}', "`text` is int"),
    (b'{"usage":{"completion_tokens":-1}}', "usage.completion_tokens is -1"),
    (b'{"usage":{"completion_tokens":1e308}}', "usage.completion_tokens is 1e+308"),
    (b'{"usage":{"completion_tokens":"3"}}', "usage.completion_tokens is '3'"),
    (b'{"usage":{"completion_tokens":3,"prompt_tokens":true}}', "usage.prompt_tokens is True"),
    (b'{"usage":{"completion_tokens":4294967296}}', "not a token count"),
    (b'null', "JSON NoneType"),
    (b'[1, 2]', "JSON list"),
    (b'"text"', "JSON str"),
])
def test_impossible_counted_fields_are_malformed(payload: bytes, why: str) -> None:
    """Fields truthput counts by, with a value no server can mean, fail the request with the reason."""
    with pytest.raises(MalformedChunk, match=__import__("re").escape(why)):
        decode_chunk(payload)


def test_non_objects_and_malformed_json() -> None:
    with pytest.raises(MalformedChunk):
        decode_chunk(b'{"choices": [')
    with pytest.raises(MalformedChunk):
        decode_chunk(b'not json')


@pytest.mark.parametrize("delta, text", [
    (b'{"content":"answer"}', "answer"),
    (b'{"content":null,"reasoning":"thinking"}', "thinking"),  # vLLM >= 0.10
    (b'{"content":"","reasoning_content":"thinking"}', "thinking"),  # older vLLM, SGLang, llama.cpp
    (b'{"tool_calls":[{"index":0,"function":{"arguments":"{\\"city\\": "}}]}', '{"city": '),
    (b'{"role":"assistant","content":""}', ""),
    (b'{}', None),
])
def test_every_kind_of_generated_text_is_kept(delta: bytes, text: str | None) -> None:
    """The counter counts reasoning and tool-call tokens too: text-based methods must see them."""
    payload = b'{"choices":[{"index":0,"delta":' + delta + b',"finish_reason":null}]}'
    c = decode_chunk(payload)
    assert c.choices[0].delta.text() == text
    assert c == chunk_from_json(orjson.loads(payload))
