"""Malformed and wrong experiment files through `plan` and `run`, as a user runs them.

A generator mutates one valid simulator experiment key by key (wrong types, out-of-range values,
misspelt or self-defeating flags, unsafe names, broken TOML and bytes) into more than 60 files. For
each: `plan` either accepts it or refuses it with one line of truthput's own kind (never a
traceback); a refused file is refused by `run` too, before any server starts; an accepted one is
run for real on the simulator, and `run` may exit 0 only when every variant has a measured trial
(a positive figure from the server's counter): a file that measures nothing must not look like a
success. (The runs write no report files: what they check is the store and the exit status.)
"""

from __future__ import annotations

import json
import math
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from tomlwrite import toml_text

TRUTHPUT = [sys.executable, "-m", "truthput"]

BASE: dict[str, Any] = {
    "experiment": {"name": "fz", "baseline": "a", "seed": 1},
    "server": {"engine": "sim", "ready_timeout_s": 20, "stop_grace_s": 5,
               "command": ["/opt/venv/bin/vllm", "serve", "/models/m", "--tensor-parallel-size", "2",
                           "--max-num-seqs", "64", "--max-model-len", "4096"]},
    "hardware": {"gpu": "H100 SXM", "count": 2},
    "model": {"profile": "llama-3.1-8b"},
    "sim": {"noise": 0.0, "startup_s": 0.1},
    "variant": [{"name": "a"}, {"name": "b", "set": {"--max-num-seqs": 32}}],
    "workload": {"concurrency": [2], "duration_s": 0.5, "warmup_s": 0, "input_tokens": 32, "output_tokens": 16,
                 "ignore_eos": True},
    "measure": {"starts": 1, "sequential": False, "repeats": 1, "output_guard": False},
}


DROP = object()  # a key's value meaning "leave the key out"

# (table, key, wrong values): each value makes one file
KEY_VALUES: list[tuple[str, str, list[Any]]] = [
    ("experiment", "name", [DROP, "", "a[/]b", "x\x00y", 7]),
    ("experiment", "baseline", [DROP, "zz", ""]),
    ("experiment", "seed", ["one", -1, 1.5]),
    ("server", "engine", ["vlm", 3, ""]),
    ("server", "command", [[], "vllm serve m", [1, 2]]),
    ("server", "host", ["0", "::", "0.0.0.0", "[::]", "not a host!"]),
    ("server", "port", [-1, 70000, "80", 0]),
    ("server", "ready_timeout_s", [-5, 0, math.nan]),
    ("server", "stop_grace_s", [-1, math.inf]),
    ("server", "env", [{"A": "x\x00"}, {"A": 3}, {"": "v"}]),
    ("server", "cpus", [[999], [-1], "0-1", []]),
    ("server", "bogus_key", [1]),
    ("hardware", "gpu", [DROP, "NoSuchGPU"]),
    ("hardware", "count", [0, -2, "2"]),
    ("model", "profile", ["no-such-model"]),
    ("model", "path", ["/nonexistent/model"]),
    ("sim", "noise", [-1.0, math.nan]),
    ("sim", "startup_s", [-1]),
    ("sim", "acceptance", [[1.5], [-0.1]]),
    ("workload", "concurrency", [[], [0], [-1], "8", [2, 2]]),
    ("workload", "duration_s", [0, -1, math.nan]),
    ("workload", "input_tokens", [0, -3]),
    ("workload", "output_tokens", [0, -5]),
    ("workload", "warmup_s", [-1]),
    ("workload", "endpoint", ["nope"]),
    ("measure", "starts", [0, -1]),
    ("measure", "repeats", [0]),
    ("measure", "target", ["abc", "-5%"]),
    ("measure", "confidence", [1.5, 0]),
    ("measure", "verdicts", [["nope"]]),
]

# the second variant's flags: misspelt, self-defeating, or the baseline again
VARIANT_SETS: list[tuple[str, dict[str, Any]]] = [
    ("typo --spec-token", {"--spec-token": 1}),
    ("typo --max-num-seq", {"--max-num-seq": 32}),
    ("--max-num-seqs the baseline's", {"--max-num-seqs": 64}),
    ("--max-num-seqs 0", {"--max-num-seqs": 0}),
    ("--max-num-seqs many", {"--max-num-seqs": "many"}),
    ("--max-model-len 16", {"--max-model-len": 16}),
    ("--speculative-config.num_speculative_tokens -3",
     {"--speculative-config": '{"method": "ngram", "prompt_lookup_max": 4}',
      "--speculative-config.num_speculative_tokens": -3}),
    ("dotted and JSON speculative config",
     {"--speculative-config": '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}',
      "--speculative-config.bogus_key": 2}),
    ("--tensor-parallel-size 3 on 2", {"--tensor-parallel-size": 3}),
    ("--kv-cache-dtype nonsense", {"--kv-cache-dtype": "fp3"}),
    ("--port set by a variant", {"--port": 1}),
]


def _mutated(table: str, key: str, value: Any) -> str:
    doc = json.loads(json.dumps(BASE))
    if value is DROP:
        doc[table].pop(key, None)
    else:
        doc[table][key] = value
    return toml_text(doc)


def _with_variants(variants: list[dict[str, Any]]) -> str:
    doc = json.loads(json.dumps(BASE))
    doc["variant"] = variants
    return toml_text(doc)


def _cases() -> list[tuple[str, bytes]]:
    cases: list[tuple[str, bytes]] = []
    for table, key, values in KEY_VALUES:
        for value in values:
            shown = "dropped" if value is DROP else repr(value)
            cases.append((f"{table}.{key}={shown}", _mutated(table, key, value).encode()))
    for label, flags in VARIANT_SETS:
        cases.append((f"variant {label}", _with_variants([{"name": "a"}, {"name": "b", "set": flags}]).encode()))
    variant_cases: list[tuple[str, list[dict[str, Any]]]] = [
        ("no variants", []),
        ("one variant", [{"name": "a"}]),
        ("duplicate variant names", [{"name": "a"}, {"name": "a", "set": {"--max-num-seqs": 32}}]),
        ("a variant with no name", [{"name": "a"}, {"set": {"--max-num-seqs": 32}}]),
        ("a variant named with markup", [{"name": "a"}, {"name": "[bold]b[/]", "set": {"--max-num-seqs": 32}}]),
        ("NUL in a variant's env", [{"name": "a"}, {"name": "b", "env": {"X": "1\x00"}}]),
        ("unset of an absent flag", [{"name": "a"}, {"name": "b", "unset": ["--no-such-flag"]}]),
        ("a variant's unknown key", [{"name": "a"}, {"name": "b", "sett": {"--max-num-seqs": 32}}]),
    ]
    for label, variants in variant_cases:
        cases.append((label, _with_variants(variants).encode()))
    good = toml_text(BASE)
    raw: list[tuple[str, bytes]] = [
        ("empty file", b""),
        ("only a NUL", b"\x00"),
        ("not UTF-8", b"\xff\xfe[experiment]\n"),
        ("unclosed table header", b"[experiment\nname = 1\n"),
        ("the file cut in half", good[: len(good) // 2].encode()),
        ("a table given twice", (good + '[experiment]\nname = "x"\n').encode()),
        ("variant as a number", good.replace("[[variant]]", "", 1).encode() + b"variant = 3\n"),
        ("workload as a string", b'workload = "fast"\n' + good.encode()),
    ]
    cases.extend(raw)
    return cases


CASES = _cases()


def test_the_generator_covers_more_than_sixty_files():
    assert len(CASES) >= 60
    assert len({label for label, _ in CASES}) == len(CASES)


def _cli(args: list[str]) -> tuple[int, str, BaseException | None]:
    """truthput's CLI in this process (typer's runner): exit code, output, and any exception that
    is not truthput's own (which the console entry point would show as a traceback)."""
    from typer.testing import CliRunner

    from truthput.cli import app
    from truthput.errors import TruthputError

    result = CliRunner().invoke(app, args)
    exc = result.exception
    if isinstance(exc, TruthputError):
        return exc.exit_code or 1, str(exc), None
    if isinstance(exc, SystemExit) or exc is None:
        return result.exit_code, result.output, None
    return result.exit_code, result.output, exc


def _measured_variants(db: Path) -> dict[str, int]:
    """Variants with an ok trial whose counter figure is positive and finite, and how many such."""
    if not db.exists():
        return {}
    out: dict[str, int] = {}
    with sqlite3.connect(db) as con:
        for variant, status, doc in con.execute("SELECT variant, status, results_json FROM trials"):
            value = json.loads(doc).get("throughput", {}).get("counter_window", {}).get("value")
            if status == "ok" and isinstance(value, (int, float)) and math.isfinite(value) and value > 0:
                out[variant] = out.get(variant, 0) + 1
    return out


def _starts(db: Path) -> int:
    if not db.exists():
        return 0
    with sqlite3.connect(db) as con:
        try:
            return con.execute("SELECT COUNT(*) FROM starts").fetchone()[0]
        except sqlite3.OperationalError:
            return 0


def _variant_names(text: bytes) -> list[str]:
    import tomllib

    try:
        return [v.get("name") for v in tomllib.loads(text.decode()).get("variant", []) if isinstance(v, dict)]
    except (UnicodeDecodeError, tomllib.TOMLDecodeError):
        return []


@pytest.mark.parametrize("label,text", CASES, ids=[label for label, _ in CASES])
def test_a_malformed_file_is_refused_in_one_line_or_runs_and_measures(label: str, text: bytes, tmp_path: Path):
    path = tmp_path / "exp.toml"
    path.write_bytes(text)
    code, out, exc = _cli(["plan", str(path)])
    assert exc is None, f"{label}: plan raised {type(exc).__name__}: {exc}"
    db = tmp_path / "r.db"
    if code != 0:
        # refused: said in a line of its own, and `run` refuses it too before any server starts
        assert out.strip(), label
        code_run, out_run, exc_run = _cli(["run", str(path), "--store", str(db), "--no-reports"])
        assert exc_run is None, f"{label}: run raised {type(exc_run).__name__}: {exc_run}"
        assert code_run != 0, f"{label}: plan refused it but run exited 0: {out_run[-1500:]}"
        assert _starts(db) == 0, f"{label}: run started a server for a file plan refuses"
        return
    proc = subprocess.run([*TRUTHPUT, "run", str(path), "--store", str(db), "--no-reports"],
                          capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert "Traceback" not in proc.stderr, f"{label}: {proc.stderr[-3000:]}"
    measured = _measured_variants(db)
    names = _variant_names(text)
    if proc.returncode == 0:
        missing = [n for n in names if n not in measured]
        assert not missing, f"{label}: run exited 0 but never measured {missing}: {proc.stderr[-1500:]}"
    else:
        # a file plan accepted may still fail to measure (a flag the server refuses at start-up, a
        # context too short for the prompts): that must be what the run says, not an internal error
        said = proc.stderr[-3000:]
        assert (proc.returncode == 3 and "never measured" in said) or (
            proc.returncode == 1 and "no variant produced a measurement" in said), f"{label}: {said}"



def test_plan_warns_that_a_variants_own_port_is_replaced(tmp_path: Path):
    """A variant setting --port: accepted (truthput's port for the start wins), and `plan` says so."""
    path = tmp_path / "exp.toml"
    path.write_text(_with_variants([{"name": "a"}, {"name": "b", "set": {"--port": 1, "--max-num-seqs": 32}}]))
    code, out, exc = _cli(["plan", str(path)])
    assert exc is None and code == 0, out
    assert "b: sets --port, which truthput replaces on every start" in " ".join(out.split())
