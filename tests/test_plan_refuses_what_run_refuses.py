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
    if case == "engine typo in the file":
        return text.replace('engine = "sim"', 'engine = "vlm"', 1), []
    if case == "arrival typo":
        return text.replace("[workload]\n", '[workload]\narrival = "poison"\n', 1), []
    if case == "port in use":
        return text.replace("[server]\n", f"[server]\nport = {port}\n", 1), []
    if case == "baseline flag typo":
        return text.replace('"--max-num-seqs"', '"--max-num-seq"', 1), []
    return text.replace(VARIANT, f"set = {{ {VARIANT_SETS[case]} }}", 1), []


CASES = ["engine typo", "engine typo in the file", "arrival typo", "port in use", "baseline flag typo", *VARIANT_SETS]
SAYS = {"engine typo": "did you mean 'vllm'?", "engine typo in the file": "did you mean 'vllm'?",
        "arrival typo": "did you mean 'poisson'?"}
"""What the line must say (a typo: the nearest word), where a case has more to say than refusing alike."""


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
        assert SAYS.get(case, "") in said["plan"], said
        assert not (tmp_path / "r.db").exists(), "run opened a store for an experiment it refuses"
    finally:
        listener.close()


LLAMA = """[experiment]
name = "llama"
baseline = "t1"

[server]
engine = "llamacpp"
command = ["{server}", "-m", "/models/m.gguf", {args}, "-ngl", "0"{extra}]

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
    # llama-server b11434 exits "error: invalid argument: --ctx-size=2048" on the = form of any flag
    "llama.cpp the = form in the baseline": (', "--threads=2"', 'set = { "-t" = 3 }',
                                            "--threads=2: llama-server b11434 takes no --flag=value form"),
    "llama.cpp the = form of a flag a variant changes": (', "--ctx-size=4096"', 'set = { "--ctx-size" = 1024 }',
                                                         "--ctx-size=4096: llama-server b11434 takes no"),
    # without --metrics /metrics answers 501: no counter
    "llama.cpp a baseline without --metrics": ("", 'set = { "-t" = 2 }', "llama-server needs --metrics"),
    # -c over -np slots (no unified KV with -np set): 1024 / 4 = 256 a slot; prompt 128 + 256 output
    "llama.cpp a slot smaller than a request": ("", 'set = { "-t" = 2 }',
                                                "-c 1024 over -np 4 slots is 256 tokens a slot, fewer than a request's "
                                                "128 prompt + 256 output tokens: every request would stop short"),
    "llama.cpp a variant with more slots than the context holds": (
        "", 'set = { "-np" = 16 }', "[[variant]] 't2': -c 2048 over -np 16 slots is 128 tokens a slot"),
    "llama.cpp a per-slot limit below the prompt": (
        "", 'set = { "--kv-unified-per-slot" = 200 }', "200 tokens a slot, fewer than a request's 256 prompt + 256 "
        "output tokens: every request would be refused HTTP 400"),
}
LLAMA_WORKLOAD = {"llama.cpp cache reset without --slot-save-path": 'cache = "reset"',
                  "llama.cpp a slot smaller than a request": "input_tokens = 128\noutput_tokens = 256"}
LLAMA_ARGS = {"llama.cpp a baseline without --metrics": '"-c", "2048", "-np", "2"',
              "llama.cpp a slot smaller than a request": '"--metrics", "-c", "1024", "-np", "4"'}


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
    exp.write_text(LLAMA.format(server=server, extra=extra, variant=variant, workload=LLAMA_WORKLOAD.get(case, ""),
                                args=LLAMA_ARGS.get(case, '"--metrics", "-c", "2048", "-np", "2"')))
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


@pytest.mark.parametrize("env_file", ["EnvironmentFile=/etc/vllm.env\n", ""])
def test_a_unit_whose_port_and_host_are_variables_is_planned(tmp_path, env_file):
    """truthput sets --host and --port on every start itself: an imported unit's `--port ${PORT}` (set in an
    EnvironmentFile truthput does not read) is never run, so it is no reason to refuse the experiment."""
    program = tmp_path / "vllm"
    program.write_text("#!/bin/sh\nexit 1\n")
    program.chmod(0o755)
    unit = tmp_path / "v.service"
    unit.write_text(f"[Service]\n{env_file}ExecStart={program} serve /models/m --port ${{PORT}} "
                    "--host ${HOST} --max-num-seqs 8\n")
    run = [sys.executable, "-m", "truthput"]
    made = subprocess.run([*run, "import", str(unit), "-o", str(tmp_path / "v.toml")], capture_output=True, text=True,
                          cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    with open(tmp_path / "v.toml", "a") as fh:
        fh.write('\n[[variant]]\nname = "s16"\nset = { "--max-num-seqs" = 16 }\n')
    plan = subprocess.run([*run, "plan", str(tmp_path / "v.toml")], capture_output=True, text=True, cwd=tmp_path)
    assert plan.returncode == 0, plan.stderr
    assert "+ --max-num-seqs 16" in plan.stdout or "--max-num-seqs 8 -> 16" in plan.stdout


def test_run_warns_as_plan_does_when_no_flag_table_matches_the_engine_version(tmp_path):
    """Issue 62: `engine_version` naming a vLLM truthput has no flag table for drew plan's warning and
    nothing from run."""
    program = tmp_path / "vllm"
    program.write_text("#!/bin/sh\nexit 1\n")
    program.chmod(0o755)
    exp = tmp_path / "e.toml"
    exp.write_text(f"""[experiment]
name = "ev"
baseline = "a"

[server]
engine = "vllm"
engine_version = "0.1.0"
command = ["{program}", "serve", "/models/m", "--max-num-seqs", "8"]
ready_timeout_s = 5

[[variant]]
name = "a"

[[variant]]
name = "b"
set = {{ "--max-num-seqs" = 16 }}

[workload]
concurrency = [1]
duration_s = 1
warmup_s = 0

[measure]
starts = 1
""")
    run = [sys.executable, "-m", "truthput"]
    plan = subprocess.run([*run, "plan", str(exp)], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    ran = subprocess.run([*run, "run", str(exp), "--store", str(tmp_path / "r.db"), "--no-reports"],
                         capture_output=True, text=True, cwd=tmp_path, timeout=120)
    said = [" ".join(x.split()) for x in (plan.stdout + plan.stderr, ran.stderr)]
    assert all("flags not checked: truthput has no table of vLLM 0.1.0" in x for x in said), said
