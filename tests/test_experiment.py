"""The experiment file: clear one-line errors that name the file and the key; valid files parse."""

from __future__ import annotations

from pathlib import Path

import pytest

from truthput.errors import InputError
from truthput.experiment.file import load_experiment, parse_experiment

ROOT = Path(__file__).resolve().parents[1]

MINIMAL = """
[experiment]
name = "t"
baseline = "a"
[server]
engine = "sim"
[hardware]
gpu = "RTX 3090"
[model]
profile = "qwen3.6-27b-5.5bit"
[[variant]]
name = "a"
"""


def test_examples_parse():
    for path in sorted((ROOT / "examples").glob("*.toml")):
        if "claims" in path.name:
            continue
        exp, text = load_experiment(path)
        assert exp.experiment.baseline in [v.name for v in exp.variant]
        assert text == path.read_text()


def test_minimal_defaults():
    exp = parse_experiment(MINIMAL, "m.toml")
    assert exp.workload.concurrency == [1]
    assert exp.measure.repeats >= 1


@pytest.mark.parametrize(
    "mutate, expected",
    [
        (lambda s: s + "\n[workload]\nbogus = 1\n", "m.toml: [workload].bogus: unknown key"),
        (lambda s: s.replace('baseline = "a"', 'baseline = "zzz"'), "baseline = 'zzz' names no variant"),
        (lambda s: s + "\n[workload]\nconcurrency = [0]\n", "m.toml: [workload].concurrency"),
        (lambda s: s + "\n[workload]\nconcurrency = 'x'\n", "m.toml: [workload].concurrency"),
        (lambda s: s.replace('engine = "sim"', 'engine = "vllm"'), "needs command"),
        (lambda s: s.replace('engine = "sim"', 'engine = "nope"'), "m.toml: [server].engine"),
        (lambda s: s + "\n[[variant]]\nname = \"a\"\n", "variant names must be unique"),
        (lambda s: s + "\n[measure\n", "not valid TOML"),
    ],
)
def test_errors_are_one_line_and_say_where(mutate, expected):
    with pytest.raises(InputError) as info:
        parse_experiment(mutate(MINIMAL), "m.toml")
    msg = str(info.value)
    assert expected in msg
    assert "\n" not in msg


def test_missing_file_is_clear(tmp_path):
    with pytest.raises(InputError, match="cannot read experiment file"):
        load_experiment(tmp_path / "nope.toml")


def test_target_percentage():
    exp = parse_experiment(MINIMAL + '\n[measure]\ntarget = "±2%"\n', "m.toml")
    assert exp.measure.target_rel == pytest.approx(0.02)


@pytest.mark.parametrize("section,line,where", [
    ("server", "port = 70000", "[server].port"),
    ("server", "port = -1", "[server].port"),
    ("workload", "duration_s = inf", "[workload].duration_s"),
    ("workload", "duration_s = nan", "[workload].duration_s"),
    ("workload", "output_tokens = 0", "[workload].output_tokens"),
    ("measure", 'target = "abc"', "[measure].target"),
])
def test_nonsense_values_are_refused_when_the_file_is_read(tmp_path, section, line, where):
    """Refused with one line naming the file and the key, before any server starts (`plan` too)."""
    from truthput.errors import InputError
    from truthput.experiment.file import load_experiment

    sections = {"server": 'engine = "sim"', "workload": "", "measure": ""}
    sections[section] = (sections[section] + "\n" + line).strip()
    text = '[experiment]\nname = "x"\nbaseline = "a"\n[[variant]]\nname = "a"\n' + "".join(
        f"[{name}]\n{body}\n" for name, body in sections.items() if body)
    path = tmp_path / "e.toml"
    path.write_text(text)
    with pytest.raises(InputError) as err:
        load_experiment(path)
    msg = str(err.value)
    assert str(path) in msg and where.split(".")[-1] in msg and "\n" not in msg.strip()


def test_a_non_utf8_experiment_file_is_one_line_with_the_byte_offset(tmp_path):
    from truthput.errors import InputError
    from truthput.experiment.file import load_experiment

    path = tmp_path / "latin1.toml"
    path.write_bytes('[experiment]\nname = "caf\u00e9"\n'.encode("latin-1"))
    with pytest.raises(InputError, match=r"not UTF-8 text: byte 24 \(0xe9\)"):
        load_experiment(path)


PLAN_BASE = """
[experiment]
name = "t"
baseline = "a"
[server]
engine = "sim"
command = ["vllm", "serve", "m", "--tensor-parallel-size", "2"]
{server}
[hardware]
gpu = "{gpu}"
count = 2
[model]
profile = "{model}"
[[variant]]
name = "a"
[[variant]]
name = "b"
{variant}
[workload]
concurrency = {conc}
"""


@pytest.mark.parametrize("change, message", [
    (dict(variant='set = { "-tp" = 3 }'), "[[variant]] 'b': --tensor-parallel-size 3 x --pipeline-parallel-size 1 = 3 GPUs, but [hardware].count = 2"),
    (dict(variant='set = { "-tp" = 1, "--pipeline-parallel-size" = 4 }'), "= 4 GPUs, but [hardware].count = 2"),
    (dict(variant='set = { "--served-model-name" = "x\\u0000y" }'), "[[variant]] 'b': argument"),
    (dict(variant='set = { "--tensor-parallel-size" = "two" }'), "--tensor-parallel-size 'two': vLLM 0.32.0 expects a whole number"),
    (dict(gpu="RTX 9999"), "[hardware].gpu: unknown GPU 'RTX 9999'"),
    (dict(model="no-such-model"), "[model]: unknown model 'no-such-model'"),
    (dict(server='host = "no-such-host.invalid"'), "[server].host 'no-such-host.invalid': cannot be resolved"),
    (dict(conc="[100000]"), "100000 streams: at most 8192"),
    (dict(variant='set = { "--max-num-seqs" = "lots" }'), "[[variant]] 'b': --max-num-seqs 'lots': vLLM 0.32.0 expects a whole number"),
    (dict(variant='set = { "--gpu-memory-utilization" = 1.5 }'), "--gpu-memory-utilization '1.5': expected a fraction"),
])
def test_what_no_start_can_survive_is_refused_by_plan(change, message):
    """Checked when the plan is built (`truthput plan`, and `run` before any store or server): one
    line naming the file's section or variant."""
    from truthput.errors import TruthputError
    from truthput.run.plan import build_plan

    fields = {"server": "", "gpu": "RTX 3090", "model": "qwen3.6-27b-5.5bit", "variant": "", "conc": "[1]", **change}
    with pytest.raises(TruthputError) as info:
        build_plan(parse_experiment(PLAN_BASE.format(**fields), "p.toml"))
    assert message in str(info.value) and "\n" not in str(info.value).strip()


def test_plan_warns_when_concurrency_exceeds_max_num_seqs():
    from truthput.run.plan import build_plan, max_num_seqs_warnings

    fields = {"server": "", "gpu": "RTX 3090", "model": "qwen3.6-27b-5.5bit",
              "variant": 'set = { "--max-num-seqs" = 4 }', "conc": "[1, 8]"}
    exp = parse_experiment(PLAN_BASE.format(**fields), "p.toml")
    (line,) = max_num_seqs_warnings(exp, build_plan(exp))
    assert line == "b: concurrency 8 is above its --max-num-seqs 4: 4 streams will wait in the server's queue"


@pytest.mark.parametrize("field, value, says", [
    ("variant name", "spec1[/]", "holds '['"),
    ("variant name", "", "is empty"),
    ("variant name", "a\\u0000b", "control characters"),
    ("experiment name", "   ", "is empty"),
    ("server env", "A\\u0000", "NUL"),
    ("variant env key", "BAD-NAME", "letters, digits and _"),
])
def test_names_and_env_that_would_break_a_view_or_a_process_are_refused_at_plan(tmp_path, field, value, says):
    """A variant name with [ ] (terminal markup read `[/]` as a closing tag: a traceback), an empty
    name, a NUL in a name or an env value: one line at `plan`, exit 2, before anything starts."""
    import subprocess
    import sys

    text = (ROOT / "examples" / "quickstart.toml").read_text()
    if field == "variant name":
        text = text.replace('name = "spec1"', f'name = "{value}"', 1)
    elif field == "experiment name":
        text = text.replace('name = "quickstart"', f'name = "{value}"', 1)
    elif field == "server env":
        text = text.replace("[server]\n", f'[server]\nenv = {{ X = "{value}" }}\n', 1)
    else:
        text = text.replace('name = "spec1"\n', f'name = "spec1"\nenv = {{ "{value}" = "1" }}\n', 1)
    path = tmp_path / "e.toml"
    path.write_text(text)
    res = subprocess.run([sys.executable, "-m", "truthput", "plan", str(path)], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 2, res.stdout + res.stderr
    assert says in res.stderr and "Traceback" not in res.stderr


@pytest.mark.parametrize("command", ["plan", "run"])
def test_a_flag_typo_is_refused_before_any_start_naming_the_real_flag(tmp_path, command):
    """`--spec-token` (for `--spec-tokens`) used to run on the simulator as the baseline and read as
    "spec-tokens 1 is the same as 3". Now `plan` and `run` refuse it, name the nearest vLLM flag,
    exit 2, and start nothing."""
    import sqlite3
    import subprocess
    import sys

    text = (ROOT / "examples" / "quickstart.toml").read_text().replace('"--spec-tokens" = 1', '"--spec-token" = 1')
    assert '"--spec-token" = 1' in text
    path = tmp_path / "typo.toml"
    path.write_text(text)
    args = [sys.executable, "-m", "truthput", command, str(path)]
    if command == "run":
        args += ["--store", str(tmp_path / "s.db"), "--reports", str(tmp_path / "rep")]
    res = subprocess.run(args, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert res.returncode == 2, res.stdout[-2000:] + res.stderr[-2000:]
    assert "--spec-token (did you mean --spec-tokens?)" in res.stderr and "Traceback" not in res.stderr
    if (tmp_path / "s.db").exists():
        assert sqlite3.connect(tmp_path / "s.db").execute("SELECT COUNT(*) FROM starts").fetchone()[0] == 0


@pytest.mark.parametrize("program, says", [
    ("/no/such/dir/llama-server", "no such file (the server's program)"),
    ("no-such-server-program", "is not on PATH"),
])
def test_a_missing_server_program_fails_plan(tmp_path, program, says):
    import subprocess
    import sys

    text = (ROOT / "examples" / "quickstart.toml").read_text().replace('engine = "sim"', 'engine = "command"')
    text = text.replace('"/opt/vllm/bin/python"', f'"{program}"', 1)
    assert program in text
    path = tmp_path / "e.toml"
    path.write_text(text)
    res = subprocess.run([sys.executable, "-m", "truthput", "plan", str(path)], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 2 and says in res.stderr and "Traceback" not in res.stderr, res.stderr


def test_version_and_short_help():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "truthput", "--version"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.startswith("truthput ")
    out = subprocess.run([sys.executable, "-m", "truthput", "plan", "-h"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "Usage: " in out.stdout and "plan" in out.stdout


def test_the_docker_example_changes_only_vllms_argv_after_the_image():
    """examples/docker-vllm.toml: the variant's flag lands in vLLM's argv after the image; docker's
    own options (-p {port}:8000, --gpus, -v) are left as written, and {port} is filled per start."""
    from truthput.run.plan import build_plan

    exp, _text = load_experiment(ROOT / "examples" / "docker-vllm.toml")
    plan = build_plan(exp)
    by_name = {v.name: v.argv.to_argv() for v in plan.variants}
    base, more = by_name["seqs64"], by_name["seqs128"]
    image = base.index("vllm/vllm-openai:v0.11.0")
    assert base[:image] == more[:image] == ["docker", "run", "--rm", "--gpus", "all", "-p", "{port}:8000", "-v",
                                           "/models:/models"]
    assert more[more.index("--max-num-seqs") + 1] == "128" and more.index("--max-num-seqs") > image
    assert base[base.index("--max-num-seqs") + 1] == "64"
