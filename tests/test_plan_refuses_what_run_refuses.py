"""`plan` says everything `run` would refuse (principle 7): both call the one validation
(`truthput.run.plan.build_plan`), so each bad experiment below gets the same one line and exit 2
from both, and `run` creates no store for it."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "quickstart.toml"


VARIANT = 'set = { "--spec-tokens" = 1 }'
"""The quickstart's variant line: most cases below replace it."""

VARIANT_SETS = {
    "variant flag typo": '"--spec-token" = 1',
    "a variant the baseline already is (--flag=value)": '"--spec-tokens=3" = true',
    "a value no parser takes": '"--max-num-seqs" = "lots"',
    "a value outside the parser's choices": '"--kv-cache-dtype" = "fp3"',
    "a number where vLLM wants a whole one": '"--max-num-seqs" = "128.0"',
    "a context shorter than the workload's requests": '"--max-model-len" = 16',
    "a negative number of draft tokens": '"--speculative-config.num_speculative_tokens" = -3',
}


def _edit(text: str, case: str, port: int) -> tuple[str, list[str]]:
    if case == "engine typo":
        return text, ["--engine", "vlm"]
    if case == "port in use":
        return text.replace("[server]\n", f"[server]\nport = {port}\n", 1), []
    if case == "baseline flag typo":
        return text.replace('"--max-num-seqs"', '"--max-num-seq"', 1), []
    return text.replace(VARIANT, f"set = {{ {VARIANT_SETS[case]} }}", 1), []


CASES = ["engine typo", "port in use", "baseline flag typo", *VARIANT_SETS]


@pytest.mark.parametrize("case", CASES)
def test_plan_and_run_refuse_the_same_way(case, tmp_path):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    try:
        text, extra = _edit(EXAMPLE.read_text(), case, listener.getsockname()[1])
        assert text != EXAMPLE.read_text() or extra, f"{case}: the example changed; fix the edit"
        exp = tmp_path / "e.toml"
        exp.write_text(text)
        said = {}
        for command in ("plan", "run"):
            out = subprocess.run([sys.executable, "-m", "truthput", command, str(exp), *extra,
                                  *(["--store", str(tmp_path / "r.db")] if command == "run" else [])],
                                 capture_output=True, text=True, timeout=120, cwd=tmp_path)
            assert out.returncode == 2, (command, out.returncode, out.stdout[-800:], out.stderr[-800:])
            lines = [ln for ln in out.stderr.splitlines() if ln.startswith("truthput: error:")]
            assert len(lines) == 1, out.stderr
            said[command] = lines[0]
        assert said["plan"] == said["run"], said
        assert not (tmp_path / "r.db").exists(), "run opened a store for an experiment it refuses"
    finally:
        listener.close()


LLAMA = """[experiment]
name = "llama"
baseline = "t1"

[server]
engine = "llamacpp"
command = ["{server}", "-m", "/models/m.gguf", "--metrics", "-c", "2048", "-np", "2", "-ngl", "0"{extra}]

[[variant]]
name = "t1"

[[variant]]
name = "t2"
{variant}

[workload]
concurrency = [2]
{workload}
"""

LLAMA_CASES = {
    "llama.cpp variant flag typo": ("", 'set = { "--thread" = 2 }', "--thread (did you mean --threads?)"),
    "llama.cpp baseline flag typo": (', "--ctx-sise", "4096"', 'set = { "-t" = 2 }', "--ctx-sise"),
    "llama.cpp removing --metrics": ("", 'remove = ["--metrics"]', "removes --metrics, which truthput needs"),
    "llama.cpp a no-op through an alias": ("", 'set = { "--gpu-layers" = 0 }', "starts the same server as 't1'"),
    "llama.cpp a value its --help does not list": ("", 'set = { "--spec-type" = "ngram-simpel" }',
                                                   "--spec-type ngram-simpel: llama-server b11434 takes one of none,"),
    "llama.cpp a baseline value its --help does not list": (', "-fa", "yes"', "", "[server].command: -fa yes"),
    "llama.cpp cache reset without --slot-save-path": ("", 'set = { "-t" = 2 }',
                                                        'cache = "reset" needs --slot-save-path DIR'),
}
LLAMA_WORKLOAD = {"llama.cpp cache reset without --slot-save-path": 'cache = "reset"'}


@pytest.mark.parametrize("case", list(LLAMA_CASES))
def test_plan_and_run_refuse_llama_cpp_flags_the_server_would_refuse(case, tmp_path):
    """llama-server's own --help (the bundled llamacpp-b11434-flags.json) is the vocabulary: a typo in
    the baseline or a variant, removing what the measurement needs, and a variant that is the
    baseline through another spelling of one option (`-ngl` / `--gpu-layers`) are refused by both."""
    server = tmp_path / "llama-server"
    server.write_text("#!/bin/sh\nexit 1\n")
    server.chmod(0o755)
    extra, variant, expected = LLAMA_CASES[case]
    exp = tmp_path / "e.toml"
    exp.write_text(LLAMA.format(server=server, extra=extra, variant=variant, workload=LLAMA_WORKLOAD.get(case, "")))
    said = {}
    for command in ("plan", "run"):
        out = subprocess.run([sys.executable, "-m", "truthput", command, str(exp),
                              *(["--store", str(tmp_path / "r.db")] if command == "run" else [])],
                             capture_output=True, text=True, timeout=120, cwd=tmp_path)
        assert out.returncode == 2, (command, out.returncode, out.stdout[-800:], out.stderr[-800:])
        (said[command],) = [ln for ln in out.stderr.splitlines() if ln.startswith("truthput: error:")]
    assert said["plan"] == said["run"] and expected in said["plan"], said
    assert not (tmp_path / "r.db").exists()


def test_the_bundled_llama_cpp_vocabulary_is_the_built_servers():
    """scripts/make_llamacpp_flags.py --check: the shipped file is what the built llama-server's
    --help says (where it is built)."""
    from tests.llamacpp.conftest import llama_server_path

    binary = llama_server_path()
    if binary is None:
        pytest.skip("llama-server not built: run scripts/install-llama-cpp.sh")
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, str(root / "scripts" / "make_llamacpp_flags.py"), str(binary), "--check"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
