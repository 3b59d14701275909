"""Workload sources: ShareGPT, shared-prefix, multi-turn, tool-call, thinking, JSONL — the token
counts they produce, checked with a BPE tokenizer trained here (and word counts without one)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_workload import train_tokenizer

from truthput.errors import InputError
from truthput.load.workload import (
    SHAREGPT_SAMPLE,
    TOOL_PROMPT_HEAD,
    TOOLS,
    WORDS_PER_TOKEN,
    Distribution,
    Workload,
    WorkloadSpec,
    load_sharegpt,
)


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(byte_level=True, bos=True)


def n_tokens(tok, text: str, special: bool = True) -> int:
    return len(tok.encode(text, add_special_tokens=special).ids)


def test_shipped_sharegpt_sample_is_valid_and_varied() -> None:
    pairs = load_sharegpt(SHAREGPT_SAMPLE)
    assert len(pairs) == 80
    q_words = sorted(len(q.split()) for q, _ in pairs)
    a_words = sorted(len(a.split()) for _, a in pairs)
    assert q_words[0] < q_words[-1] / 4 and a_words[0] < a_words[-1] / 4  # varied lengths


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_sharegpt_prompt_and_output_length_from_the_reply(tok, endpoint: str) -> None:
    wl = Workload(WorkloadSpec(input_tokens=1, output_tokens=1, prompt_source="sharegpt", endpoint=endpoint), 0, tok)
    pairs = load_sharegpt(SHAREGPT_SAMPLE)
    for i in (0, 5, 79, 80):
        q, a = pairs[i % 80]
        body = wl.body(i)
        prompt = body["messages"][0]["content"] if endpoint == "chat" else body["prompt"]
        assert prompt == q
        assert body["max_tokens"] == n_tokens(tok, a, special=False)  # the reply's token count


def test_sharegpt_without_tokenizer_uses_words(tmp_path: Path) -> None:
    path = tmp_path / "conv.jsonl"
    rows = [{"conversations": [{"from": "human", "value": "one two three"}, {"from": "gpt", "value": "a b c d e f"}]},
            {"conversations": [{"from": "gpt", "value": "no human first"}]},
            {"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": " ".join(["w"] * 30)}]}]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    wl = Workload(WorkloadSpec(input_tokens=1, output_tokens=1, prompt_source=f"sharegpt:{path}"), 0)
    assert [wl.body(i)["max_tokens"] for i in range(2)] == [round(6 / WORDS_PER_TOKEN), round(30 / WORDS_PER_TOKEN)]
    assert wl.body(2)["prompt"] == "one two three"  # the conversation without a human turn is skipped


def test_sharegpt_errors_are_one_line(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="cannot read"):
        Workload(WorkloadSpec(input_tokens=1, output_tokens=1, prompt_source=f"sharegpt:{tmp_path}/none.json"), 0)
    bad = tmp_path / "bad.json"
    bad.write_text('[{"conversations": []}]')
    with pytest.raises(InputError, match="no conversation"):
        Workload(WorkloadSpec(input_tokens=1, output_tokens=1, prompt_source=f"sharegpt:{bad}"), 0)


def test_shared_prefix_exact_lengths_and_shared_token_prefix(tok) -> None:
    spec = WorkloadSpec(input_tokens=Distribution("uniform", low=5, high=60), output_tokens=8,
                        prompt_source="shared-prefix", prefixes=3, suffixes=4, prefix_tokens=50)
    wl = Workload(spec, 7, tok)
    prefix_ids = {p: tok.encode(wl.shared_prefix(p), add_special_tokens=True).ids for p in range(3)}
    assert all(len(ids) == 51 for ids in prefix_ids.values())  # 50 + <s>
    prompts = []
    for i in range(24):
        p, m = i % 3, (i // 3) % 4
        prompt = wl.body(i)["prompt"]
        ids = tok.encode(prompt).ids
        n_suffix = spec.input_tokens.draw(__import__("random").Random(f"truthput:7:{p}:{m}:in"))
        assert len(ids) == 50 + n_suffix  # exact: <s> counted in the suffix's share
        assert ids[:51] == prefix_ids[p]  # the prefix's tokens are a real shared prefix (cacheable)
        prompts.append(prompt)
    assert len(set(prompts)) == 12  # N x M distinct prompts, each sent twice in 24 requests
    assert prompts[0] == prompts[12] and prompts[0] != prompts[3]


def test_shared_prefix_without_tokenizer_word_counts() -> None:
    wl = Workload(WorkloadSpec(input_tokens=40, output_tokens=8, prompt_source="shared-prefix", prefixes=2,
                               suffixes=2, prefix_tokens=100), 1)
    a, b = wl.body(0)["prompt"].split(), wl.body(2)["prompt"].split()
    assert len(a) == 75 + 30 and a[:75] == b[:75] and a[75:] != b[75:]


def test_multi_turn_history_has_exact_turn_lengths(tok) -> None:
    spec = WorkloadSpec(input_tokens=Distribution("uniform", low=10, high=40), output_tokens=Distribution("uniform", low=5, high=30),
                        prompt_source="multi-turn", endpoint="chat", turns=3)
    wl = Workload(spec, 3, tok)
    for conv in range(2):
        for turn in range(3):
            i = conv * 3 + turn
            msgs = wl.body(i)["messages"]
            assert [m["role"] for m in msgs] == ["user", "assistant"] * turn + ["user"]
            for t in range(turn + 1):
                t_in, t_out = wl.lengths(conv * 3 + t)
                assert n_tokens(tok, msgs[2 * t]["content"]) == t_in
                if t < turn:
                    assert n_tokens(tok, msgs[2 * t + 1]["content"]) == t_out
            if turn:  # the history is the previous request's messages, unchanged
                assert msgs[: 2 * turn - 1] == wl.body(i - 1)["messages"]
    with pytest.raises(InputError, match="chat endpoint"):
        Workload(WorkloadSpec(input_tokens=5, output_tokens=5, prompt_source="multi-turn"), 0)


def test_tool_call_body_and_prompt_length(tok) -> None:
    wl = Workload(WorkloadSpec(input_tokens=64, output_tokens=32, prompt_source="tool-call", endpoint="chat",
                               tool_choice="required"), 0, tok)
    body = wl.body(4)
    assert body["tools"] == TOOLS and body["tool_choice"] == "required"
    content = body["messages"][0]["content"]
    assert content.startswith(TOOL_PROMPT_HEAD) and n_tokens(tok, content) == 64
    assert {t["function"]["name"] for t in body["tools"]} == {"get_weather", "search_notes"}


@pytest.mark.parametrize("thinking", [True, False])
def test_thinking_switch_goes_to_chat_template_kwargs(thinking: bool) -> None:
    spec = WorkloadSpec(input_tokens=8, output_tokens=8, endpoint="chat", thinking=thinking,
                        extra_body={"chat_template_kwargs": {"custom": 1}})
    body = Workload(spec, 0).body(0)
    assert body["chat_template_kwargs"] == {"custom": 1, "enable_thinking": thinking}
    assert "chat_template_kwargs" not in Workload(WorkloadSpec(input_tokens=8, output_tokens=8, endpoint="chat"), 0).body(0)
    with pytest.raises(InputError, match="chat endpoint only"):
        Workload(WorkloadSpec(input_tokens=8, output_tokens=8, thinking=thinking), 0)


def test_jsonl_prompts_and_max_tokens(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "hello world", "max_tokens": 7}\n\n{"prompt": "second"}\n')
    wl = Workload(WorkloadSpec(input_tokens=1, output_tokens=3, prompt_source=str(path)), 0)
    assert [(wl.body(i)["prompt"], wl.body(i)["max_tokens"]) for i in range(3)] == [
        ("hello world", 7), ("second", 3), ("hello world", 7)]
