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


def _edit(text: str, case: str, port: int) -> tuple[str, list[str]]:
    if case == "engine typo":
        return text, ["--engine", "vlm"]
    if case == "port in use":
        return text.replace("[server]\n", f"[server]\nport = {port}\n", 1), []
    if case == "baseline flag typo":
        return text.replace('"--max-num-seqs"', '"--max-num-seq"', 1), []
    if case == "variant flag typo":
        return text.replace('set = { "--spec-tokens" = 1 }', 'set = { "--spec-token" = 1 }', 1), []
    if case == "a variant the baseline already is (--flag=value)":
        return text.replace('set = { "--spec-tokens" = 1 }', 'set = { "--spec-tokens=3" = true }', 1), []
    if case == "a value no parser takes":
        return text.replace('set = { "--spec-tokens" = 1 }', 'set = { "--max-num-seqs" = "lots" }', 1), []
    raise AssertionError(case)


CASES = ["engine typo", "port in use", "baseline flag typo", "variant flag typo",
         "a variant the baseline already is (--flag=value)", "a value no parser takes"]


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
