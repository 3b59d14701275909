"""Workload bodies: exact prompt lengths with a tokenizer, word-count lengths without, determinism.

The tokenizers are trained here (BPE via the `tokenizers` library) on generated English-like text,
with a small vocabulary so words split into sub-word pieces, the case where exact length is hard.
"""

from __future__ import annotations

import random
import statistics
import sys
from pathlib import Path

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from truthput.errors import InputError
from truthput.load.workload import _VOCAB, WORDS_PER_TOKEN, Distribution, Workload, WorkloadSpec


def corpus(n_lines: int = 400) -> list[str]:
    rng = random.Random(0)
    return [" ".join(rng.choices(_VOCAB, k=30)) + "." for _ in range(n_lines)]


def train_tokenizer(byte_level: bool, bos: bool, vocab_size: int = 300) -> Tokenizer:
    tok = Tokenizer(models.BPE(unk_token=None if byte_level else "[UNK]"))
    if byte_level:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size, special_tokens=["<s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        )
    else:
        tok.pre_tokenizer = pre_tokenizers.Whitespace()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["[UNK]", "<s>"])
    tok.train_from_iterator(corpus(), trainer=trainer)
    if bos:
        tok.post_processor = processors.TemplateProcessing(
            single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))]
        )
    return tok


@pytest.fixture(scope="module", params=[(True, True), (True, False), (False, True)], ids=["bytelevel-bos", "bytelevel", "whitespace-bos"])
def tokenizer(request: pytest.FixtureRequest) -> Tokenizer:
    return train_tokenizer(*request.param)


def test_exact_input_length_with_tokenizer(tokenizer: Tokenizer) -> None:
    wl = Workload(WorkloadSpec(input_tokens=Distribution("uniform", low=2, high=700), output_tokens=8), 5, tokenizer)
    for i in range(60):
        n_in, _ = wl.lengths(i)
        prompt = wl.body(i)["prompt"]
        assert len(tokenizer.encode(prompt).ids) == n_in, (i, n_in)


def test_small_vocab_really_splits_words() -> None:
    tok = train_tokenizer(True, False, vocab_size=300)
    text = " ".join(corpus(20))
    assert len(tok.encode(text).ids) > 1.3 * len(text.split())  # sub-word pieces: exactness is non-trivial


@pytest.mark.parametrize("n", [1, 4, 100, 1000, 4096])
def test_word_count_without_tokenizer(n: int) -> None:
    wl = Workload(WorkloadSpec(input_tokens=n, output_tokens=1), seed=2)
    assert len(wl.body(0)["prompt"].split()) == max(1, round(n * WORDS_PER_TOKEN))


def test_bodies_are_deterministic_and_distinct() -> None:
    spec = WorkloadSpec(input_tokens=Distribution("normal", mean=200, std=50, low=10, high=400),
                        output_tokens=Distribution("uniform", low=5, high=50), seed=11, top_p=0.9,
                        extra_body={"min_tokens": 3})
    a, b, c = Workload(spec, 1), Workload(spec, 1), Workload(spec, 2)
    bodies = [a.body(i) for i in range(20)]
    assert bodies == [b.body(i) for i in range(20)]  # same (seed, i) -> same body
    assert bodies[3] == a.body(3)  # order of calls does not matter
    assert len({x["prompt"] for x in bodies}) == 20  # no shared prompts (prefix cache)
    assert [x["prompt"] for x in bodies] != [c.body(i)["prompt"] for i in range(20)]
    first_words = {x["prompt"].split()[0:4].__str__() for x in bodies}
    assert len(first_words) == 20
    x = bodies[0]
    assert x["ignore_eos"] is True and x["temperature"] == 0.0 and x["top_p"] == 0.9 and x["seed"] == 11
    assert x["min_tokens"] == 3 and "model" not in x and "stream" not in x
    assert all(5 <= y["max_tokens"] <= 50 for y in bodies)


def test_chat_body_has_messages() -> None:
    wl = Workload(WorkloadSpec(input_tokens=40, output_tokens=7, endpoint="chat", ignore_eos=False, temperature=None), 0)
    body = wl.body(0)
    assert body["messages"][0]["role"] == "user" and len(body["messages"][0]["content"].split()) == 30
    assert body["max_tokens"] == 7 and "ignore_eos" not in body and "temperature" not in body and "prompt" not in body


def test_distributions_match_their_parameters() -> None:
    rng = random.Random(0)
    u = [Distribution("uniform", low=10, high=20).draw(rng) for _ in range(5000)]
    assert min(u) == 10 and max(u) == 20 and abs(statistics.mean(u) - 15) < 0.2
    nrm = [Distribution("normal", mean=100, std=10, low=90, high=1000).draw(rng) for _ in range(5000)]
    assert min(nrm) == 90 and abs(statistics.median(nrm) - 100) <= 1
    h = [Distribution("histogram", values=(100, 1000), weights=(3, 1)).draw(rng) for _ in range(8000)]
    assert set(h) == {100, 1000} and abs(h.count(100) / len(h) - 0.75) < 0.02
    assert Distribution("histogram", values=(100, 1000), weights=(3, 1)).expected == 325


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"kind": "fixed", "value": 0}, "fixed value 0"),
        ({"kind": "uniform", "low": 5, "high": 2}, r"uniform \[5, 2\]"),
        ({"kind": "histogram", "values": (1, 2), "weights": (1,)}, "one weight per value"),
        ({"kind": "zipf"}, "kind 'zipf'"),
    ],
)
def test_bad_distributions_are_spec_errors(kwargs: dict, match: str) -> None:
    with pytest.raises(InputError, match=match):
        Distribution(**kwargs)


def test_distribution_tables_from_the_experiment_file() -> None:
    wl = Workload(WorkloadSpec(input_tokens={"kind": "histogram", "values": [100, 200], "weights": [1, 0]},
                               output_tokens={"kind": "uniform", "low": 3, "high": 4}), 0)
    assert {wl.lengths(i)[0] for i in range(20)} == {100} and {wl.lengths(i)[1] for i in range(50)} == {3, 4}
    with pytest.raises(InputError, match="workload output_tokens: unknown key"):
        Workload(WorkloadSpec(input_tokens=1, output_tokens={"kind": "fixed", "val": 3}), 0)
    with pytest.raises(InputError, match="workload input_tokens: distribution uniform"):
        Workload(WorkloadSpec(input_tokens={"kind": "uniform", "low": 9, "high": 2}, output_tokens=1), 0)


def test_jsonl_prompt_source(tmp_path: Path) -> None:
    src = tmp_path / "prompts.jsonl"
    src.write_text('{"prompt": "hello there", "max_tokens": 5}\n\n{"prompt": "second"}\n')
    wl = Workload(WorkloadSpec(input_tokens=1, output_tokens=9, prompt_source=str(src)), 0)
    assert [wl.body(i)["prompt"] for i in range(3)] == ["hello there", "second", "hello there"]
    assert [wl.body(i)["max_tokens"] for i in range(3)] == [5, 9, 5]
    chat = Workload(WorkloadSpec(input_tokens=1, output_tokens=9, prompt_source=str(src), endpoint="chat"), 0)
    assert chat.body(1)["messages"] == [{"role": "user", "content": "second"}]


def test_bad_jsonl_names_file_and_line(tmp_path: Path) -> None:
    src = tmp_path / "bad.jsonl"
    src.write_text('{"prompt": "ok"}\n{not json\n')
    with pytest.raises(InputError, match=r"bad\.jsonl:2: not JSON"):
        Workload(WorkloadSpec(input_tokens=1, output_tokens=1, prompt_source=str(src)), 0)
    with pytest.raises(InputError, match="cannot read"):
        Workload(WorkloadSpec(input_tokens=1, output_tokens=1, prompt_source=str(tmp_path / "none.jsonl")), 0)


def test_load_package_imports_no_heavy_libraries() -> None:
    import subprocess

    code = (
        "import sys, truthput.load.client, truthput.load.schedule, truthput.load.workload, truthput.load.sse;"
        "heavy = [m for m in ('scipy', 'numpy', 'pandas', 'matplotlib') if m in sys.modules];"
        "print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
