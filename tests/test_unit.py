"""systemd units in and out, checked against the seed unit and systemd's own syntax rules."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from truthput.errors import InputError
from truthput.experiment.argv import ServerArgv, argv_diff
from truthput.experiment.file import parse_experiment
from truthput.experiment.unit import (
    consistency_warnings,
    import_unit,
    parse_unit,
    quote_word,
    render_unit,
    split_words,
)

FIXTURES = Path(__file__).parent / "fixtures" / "units"
SEED_PATH = FIXTURES / "gwen-original-config.service"
SEED_TEXT = SEED_PATH.read_text(encoding="utf-8")
SEED_ARGV: list[str] = json.loads((FIXTURES / "gwen-original-config.argv.json").read_text())


def test_seed_unit_parses_keeping_everything() -> None:
    unit = parse_unit(SEED_TEXT, str(SEED_PATH))
    assert unit.text() == SEED_TEXT
    assert [s.name for s in unit.sections] == ["Unit", "Service", "Install"]
    assert unit.get("Service", "Restart") == "on-failure"
    assert unit.get("Service", "RestartSec") == "10"
    assert unit.exec_start_argv() == SEED_ARGV
    assert len(SEED_ARGV) == 37
    assert unit.exec_start_argv()[-5] == '{"enable_thinking": false}'  # the JSON argument, byte for byte
    assert unit.environment() == {}
    assert unit.notes() == []


def test_systemd_syntax_rules() -> None:
    text = (
        "# leading comment\n"
        "[Unit]\n"
        "Description=demo\n"
        "\n"
        "[Service]\n"
        'Environment="A=1 2" B=x\\ty\n'
        "Environment=C=%%literal D=$$dollar\n"
        "EnvironmentFile=-/etc/default/demo\n"
        "ExecStart=-/usr/bin/srv --name %n --inst %i \\\n"
        "  # a comment inside the continuation is skipped\n"
        "  --pct 50%% --cost $$5 'single \"q\" x' \"double 'q' \\\"esc\\\"\" \\\n"
        "  --json '{\"a\": [1, 2]}' --env ${A} $A --none ${NOPE} a\\x41b\n"
    )
    unit = parse_unit(text, "/etc/systemd/system/demo@gpu0.service")
    assert unit.text() == text
    assert unit.environment() == {"A": "1 2", "B": "x\ty", "C": "%literal", "D": "$$dollar"}  # no $ expansion in Environment=
    assert unit.environment_files() == ["-/etc/default/demo"]
    assert unit.exec_start_prefix() == "-"
    assert unit.exec_start_argv() == [
        "/usr/bin/srv", "--name", "demo@gpu0.service", "--inst", "gpu0",
        "--pct", "50%", "--cost", "$5", 'single "q" x', "double 'q' \"esc\"",
        "--json", '{"a": [1, 2]}', "--env", "1 2", "1", "2", "--none", "${NOPE}", "aAb",
    ]  # fmt: skip
    notes = unit.notes()
    assert any("EnvironmentFile=-/etc/default/demo" in n for n in notes)
    assert any("$NOPE" in n for n in notes)
    # quotes group anywhere in a word; only space, tab, CR and LF separate words (as in systemd)
    assert split_words('a "b c"d \\x41\u3000z \'\\u00e9\'', "t") == ["a", "b cd", "A\u3000z", "\u00e9"]
    # an empty Environment= resets the list, an empty ExecStart= too
    reset = parse_unit("[Service]\nEnvironment=A=1\nEnvironment=\nEnvironment=B=2\nExecStart=/a\nExecStart=\nExecStart=/b x\n")
    assert reset.environment() == {"B": "2"} and reset.exec_start_argv() == ["/b", "x"]


def test_unit_errors_are_one_line_spec_errors() -> None:
    with pytest.raises(InputError, match=r"demo.service: ExecStart=: unterminated ' quote"):
        parse_unit("[Service]\nExecStart=/a 'b\n", "demo.service").exec_start_argv()
    with pytest.raises(InputError, match="no ExecStart="):
        parse_unit("[Service]\nType=simple\n", "x.service").exec_start_argv()
    with pytest.raises(InputError, match="2 ExecStart= lines"):
        parse_unit("[Service]\nExecStart=/a\nExecStart=/b\n", "x.service").exec_start_argv()
    with pytest.raises(InputError, match=r"x.service:1: setting"):
        parse_unit("ExecStart=/a\n", "x.service")


TRICKY = [
    "/opt/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server",
    "--default-chat-template-kwargs", '{"enable_thinking": false}',
    "--chat-template", "{% if x %}'y'{% endif %}",
    "--api-key", "p$ss word",
    "--note", "back\\slash and \"quotes\" and 'single'",
    "--empty", "",
    "--tab", "a\tb",
    "--pct", "100%",
    "--neg", "-1",
]  # fmt: skip


def test_render_quotes_so_systemd_reads_back_exactly() -> None:
    assert quote_word("plain-word_1.0") == "plain-word_1.0"
    assert quote_word('{"enable_thinking": false}') == "'{\"enable_thinking\": false}'"
    assert quote_word("100%") == "100%%" and quote_word("$HOME") == "'$$HOME'"
    unit = parse_unit(SEED_TEXT, str(SEED_PATH))
    text = render_unit(unit, TRICKY)
    again = parse_unit(text, str(SEED_PATH))
    assert again.exec_start_argv() == TRICKY
    assert again.get("Service", "User") == "alex" and again.get("Install", "WantedBy") == "multi-user.target"


@settings(max_examples=150, deadline=None)
@given(st.lists(st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12), min_size=1, max_size=6))
def test_any_words_round_trip(words: list[str]) -> None:
    argv = ["/usr/bin/srv", *words]
    unit = parse_unit(render_unit(parse_unit("[Service]\nExecStart=/x\n"), argv))
    assert unit.exec_start_argv() == argv


def test_seed_renders_back_byte_exact_and_variants_change_one_line() -> None:
    unit = parse_unit(SEED_TEXT, str(SEED_PATH))
    assert render_unit(unit, SEED_ARGV) == SEED_TEXT
    # a re-layout of the same argv (as when a variant changed) is also the seed's layout
    spec1 = ServerArgv.parse(SEED_ARGV).with_set({"--spec-tokens": 1}).to_argv()
    out = render_unit(unit, spec1)
    changed = [(a, b) for a, b in zip(SEED_TEXT.splitlines(), out.splitlines()) if a != b]
    assert changed == [("  --spec-tokens 3 \\", "  --spec-tokens 1 \\")]
    assert len(out.splitlines()) == len(SEED_TEXT.splitlines())


def test_experiment_mode_env_and_description() -> None:
    unit = parse_unit(SEED_TEXT, str(SEED_PATH))
    out = render_unit(unit, SEED_ARGV, env={"VLLM_USE_V1": "1", "NOTE": "a b $x 5%"}, experiment_mode=True,
                      description="vLLM Qwen3.6-27B TP=2 MTP spec=3")  # fmt: skip
    again = parse_unit(out)
    assert again.get("Service", "Restart") == "no"
    assert again.get("Service", "RestartSec") is None
    assert again.get("Unit", "Description") == "vLLM Qwen3.6-27B TP=2 MTP spec=3"
    assert again.environment() == {"VLLM_USE_V1": "1", "NOTE": "a b $x 5%"}
    assert again.exec_start_argv() == SEED_ARGV
    assert consistency_warnings(parse_unit(out, "x.service")) == []
    # same env as the unit's: Environment= lines untouched
    assert render_unit(unit, SEED_ARGV, env={}) == SEED_TEXT


def test_consistency_warnings() -> None:
    unit = parse_unit(SEED_TEXT, str(SEED_PATH))
    assert consistency_warnings(unit) == [
        f"{SEED_PATH}: Description says 'spec=5' but ExecStart= has --spec-tokens 3"
    ]
    liar = SEED_TEXT.replace("TP=2, MTP spec=5", "TP=4, MTP spec=3").replace("Qwen3.6-27B PrismaAURA", "Llama3-70B")
    warnings = consistency_warnings(parse_unit(liar, "liar.service"))
    assert any("'TP=4' but ExecStart= has --tensor-parallel-size 2" in w for w in warnings)
    assert any("'70B' but the model is" in w for w in warnings)
    assert any("names 'Llama3'" in w for w in warnings)
    assert not any("spec" in w for w in warnings)
    honest = SEED_TEXT.replace("(Qwen3.6-27B PrismaAURA 5.5bit CT, TP=2, MTP spec=5)", "on GPU0 RTX3090 (qwen-3.6 27b, tp 2, spec=3)")
    assert consistency_warnings(parse_unit(honest, "honest.service")) == []
    nospec = ServerArgv.parse(SEED_ARGV).without(["--speculative-config"]).to_argv()
    assert any("no speculative decoding" in w for w in consistency_warnings(parse_unit(render_unit(unit, nospec), "n.service")))


def test_import_unit_makes_a_valid_experiment(tmp_path: Path) -> None:
    toml_text = import_unit(str(SEED_PATH))
    exp = parse_experiment(toml_text, "imported.toml")
    assert exp.server.engine == "vllm"
    assert exp.server.command == SEED_ARGV
    assert exp.server.env == {}
    assert exp.server.systemd_unit is not None and exp.server.systemd_unit.text == SEED_TEXT
    assert exp.server.systemd_unit.path == str(SEED_PATH.resolve())
    assert exp.experiment.name == "gwen-original-config" and exp.experiment.baseline == "baseline"
    assert [v.name for v in exp.variant] == ["baseline"]
    assert exp.workload.concurrency == [1, 8] and exp.workload.duration_s == 20 and exp.workload.warmup_s == 5
    assert exp.workload.endpoint == "chat"  # the unit sets a chat template kwarg
    assert exp.workload.input_tokens == 256 and exp.workload.output_tokens == 256 and exp.workload.ignore_eos
    assert exp.measure.repeats == 1 and exp.measure.starts == 3 and exp.measure.sequential
    # what the unit says is filled in: the model directory, and the GPU count (the GPU itself it cannot say)
    assert exp.model is not None and exp.model.path == SEED_ARGV[SEED_ARGV.index("--model") + 1]
    assert exp.hardware is None and "# count = 2" in toml_text and "--sim-gpu" in toml_text
    assert "# WARNING:" in toml_text and "spec=5" in toml_text
    # round trip: import -> argv -> render -> parse gives back the same argv and env
    unit = parse_unit(exp.server.systemd_unit.text, exp.server.systemd_unit.path)
    back = parse_unit(render_unit(unit, exp.server.command, env=exp.server.env))
    assert back.exec_start_argv() == SEED_ARGV and back.environment() == {}
    # a completions server with Environment= lines
    plain = tmp_path / "small@1.service"
    plain.write_text('[Service]\nEnvironment="HF_HOME=/data/hf cache" VLLM_CPU_KVCACHE_SPACE=1\nExecStart=/usr/bin/vllm serve /m --port 8000 -tp 1\n')
    exp2 = parse_experiment(import_unit(str(plain)), "p.toml")
    assert exp2.workload.endpoint == "completions"
    assert exp2.server.env == {"HF_HOME": "/data/hf cache", "VLLM_CPU_KVCACHE_SPACE": "1"}
    assert exp2.server.command == ["/usr/bin/vllm", "serve", "/m", "--port", "8000", "-tp", "1"]
    assert exp2.experiment.name == "small-1"


def test_variant_diff_survives_the_unit_round_trip() -> None:
    base = ServerArgv.parse(SEED_ARGV)
    variant = base.with_set({"--spec-tokens": 1}).without(["--enforce-eager"])
    unit = parse_unit(SEED_TEXT, str(SEED_PATH))
    back = ServerArgv.parse(parse_unit(render_unit(unit, variant.to_argv(), experiment_mode=True)).exec_start_argv())
    assert str(argv_diff(base, back)) == "~ --spec-tokens 3 -> 1"


def _verify(unit_text: str, tmp_path: Path, name: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / name
    path.write_text(unit_text)
    return subprocess.run(["systemd-analyze", "verify", str(path)], capture_output=True, text=True, timeout=60)


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed (Debian package: systemd)")
def test_rendered_units_pass_systemd_analyze_verify(tmp_path: Path) -> None:
    # systemd checks that the program exists and the user is known: point those at this machine
    local = SEED_TEXT.replace("User=alex", "User=root").replace("Group=alex", "Group=root")
    unit = parse_unit(local, "truthput-test.service")
    for i, argv in enumerate([SEED_ARGV, TRICKY]):
        argv = [sys.executable, *argv[1:]]
        result = _verify(render_unit(unit, argv, env={"X": "a b$c%d"}, experiment_mode=True), tmp_path, f"t{i}.service")
        assert result.returncode == 0, result.stderr
        assert "ignoring" not in result.stderr.lower() and "unbalanced" not in result.stderr.lower(), result.stderr
    # and it does catch what we must never write
    broken = _verify("[Service]\nExecStart=/usr/bin/true 'unbalanced\n", tmp_path, "broken.service")
    assert "Unbalanced quoting" in broken.stderr


def test_cli_import_and_unit_round_trip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from truthput.cli import app
    from truthput.store.db import Store

    runner = CliRunner()
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["import", str(SEED_PATH)])
    assert result.exit_code == 0, result.output
    toml_path = tmp_path / "gwen-original-config.toml"
    toml_text = toml_path.read_text()
    assert tomllib.loads(toml_text)["server"]["command"] == SEED_ARGV
    again = runner.invoke(app, ["import", str(SEED_PATH)])
    assert again.exit_code != 0 and "already exists" in str(again.exception or again.output)

    store = Store(tmp_path / "truthput.db")
    run_id = store.create_run("gwen", "vllm", False, str(toml_path), toml_text, 0, {})
    launched = ServerArgv.parse(SEED_ARGV).with_set({"--spec-tokens": 1}).with_host_port("127.0.0.1", 41234)
    store.put_variant(run_id, "spec1", 1, False, launched.to_argv(), {}, {})
    store.close()
    out = tmp_path / "spec1.service"
    result = runner.invoke(app, ["unit", "latest", "--variant", "spec1", "--store", str(tmp_path / "truthput.db"), "-o", str(out)])
    assert result.exit_code == 0, result.output
    written = parse_unit(out.read_text(), str(out))
    expected = ServerArgv.parse(SEED_ARGV).with_set({"--spec-tokens": 1}).to_argv()
    assert written.exec_start_argv() == expected  # the unit's own --host 0.0.0.0 --port 8080 came back
    assert written.get("Service", "Restart") == "on-failure"  # normal mode keeps the user's restart policy
    # the verdict travels with the unit: this variant was never measured, and it says so
    assert "spec1 was never measured" in result.output and "this unit is untested" in result.output
    missing = runner.invoke(app, ["unit", run_id, "--variant", "nope", "--store", str(tmp_path / "truthput.db")])
    assert missing.exit_code != 0 and "no variant 'nope'" in str(missing.exception)
    # without --variant: the verdict's winner, and here there is none
    none = runner.invoke(app, ["unit", run_id, "--store", str(tmp_path / "truthput.db")])
    assert none.exit_code != 0 and "no winner at any level; choose one with --variant" in str(none.exception)


def test_import_unwraps_a_simple_shell_wrapper_and_names_the_engine(tmp_path: Path) -> None:
    wrapped = tmp_path / "wrapped.service"
    wrapped.write_text("[Service]\nUser=root\nExecStart=/bin/bash -c 'HF_HOME=%h/hf exec /opt/v/bin/vllm serve /m --max-num-seqs 8'\n")
    exp = parse_experiment(import_unit(str(wrapped)), "w.toml")
    assert exp.server.command == ["/opt/v/bin/vllm", "serve", "/m", "--max-num-seqs", "8"]
    assert exp.server.env == {"HF_HOME": "/root/hf"}  # %h of User=root
    assert exp.server.engine == "vllm"
    scripted = tmp_path / "scripted.service"
    scripted.write_text("[Service]\nExecStart=/bin/sh -c 'source /v/bin/activate && vllm serve /m'\n")
    text = import_unit(str(scripted))
    assert "cannot edit flags inside it" in text
    assert parse_experiment(text, "s.toml").server.command[:2] == ["/bin/sh", "-c"]
    sglang = tmp_path / "sg.service"
    sglang.write_text("[Service]\nExecStart=/usr/bin/python3 -m sglang.launch_server --model-path /m --tp 2\n")
    assert parse_experiment(import_unit(str(sglang)), "g.toml").server.engine == "sglang"


@pytest.mark.parametrize("argv, kind", [
    (["/usr/bin/llama-server", "-m", "m.gguf", "-np", "4"], "llamacpp"),
    (["/usr/local/bin/llama-cpp-server", "-m", "m.gguf"], "llamacpp"),
    (["python", "-m", "llama_cpp.server", "--model", "m.gguf"], "llamacpp"),
    (["vllm", "serve", "org/model"], "vllm"),
    (["python", "-m", "sglang.launch_server"], "sglang"),
    (["/opt/my-server", "--port", "{port}"], "command"),
])
def test_the_engine_is_guessed_from_the_program(argv, kind):
    from truthput.experiment.unit import guess_engine

    assert guess_engine(argv) == kind


def test_a_unit_that_is_not_utf8_is_one_line_and_exit_2(tmp_path):
    bad = tmp_path / "bad.service"
    bad.write_bytes(b"[Service]\nExecStart=/usr/bin/vllm serve m \xff\xfe\n")
    res = subprocess.run([sys.executable, "-m", "truthput", "import", str(bad), "-o", str(tmp_path / "x.toml")],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert "bad.service:2: not UTF-8" in res.stderr
    assert not (tmp_path / "x.toml").exists()


def test_import_of_a_shell_script_with_vllm_serve_makes_an_experiment(tmp_path):
    """`truthput import serve.sh`: the script's `vllm serve` line (continuations joined, a trailing
    comment dropped, its VAR=value prefix and the exported variables as the environment) is the
    baseline's command; a script that starts no server is one line and exit 2."""
    import subprocess
    import sys
    import tomllib

    script = tmp_path / "serve.sh"
    script.write_text("#!/usr/bin/env bash\nset -euo pipefail\nexport CUDA_VISIBLE_DEVICES=0,1\n"
                      "source /opt/vllm/bin/activate\n"
                      "VLLM_LOG_STATS_INTERVAL=5 exec vllm serve /models/m \\\n"
                      "    --served-model-name m --tensor-parallel-size 2 \\\n"
                      "    --speculative-config '{\"method\": \"ngram\", \"num_speculative_tokens\": 3}'  # spec\n")
    done = subprocess.run([sys.executable, "-m", "truthput", "import", str(script), "-o", str(tmp_path / "e.toml")],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    doc = tomllib.loads((tmp_path / "e.toml").read_text())
    assert doc["server"]["engine"] == "vllm"
    assert doc["server"]["command"] == ["vllm", "serve", "/models/m", "--served-model-name", "m",
                                        "--tensor-parallel-size", "2", "--speculative-config",
                                        '{"method": "ngram", "num_speculative_tokens": 3}']
    assert doc["server"]["env"] == {"CUDA_VISIBLE_DEVICES": "0,1", "VLLM_LOG_STATS_INTERVAL": "5"}
    plan = subprocess.run([sys.executable, "-m", "truthput", "plan", str(tmp_path / "e.toml"), "--engine", "sim",
                           "--sim-gpu", "RTX 3090", "--sim-model", "qwen3.6-27b-5.5bit"],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert plan.returncode == 0, plan.stderr
    (tmp_path / "other.sh").write_text("echo hello\n")
    bad = subprocess.run([sys.executable, "-m", "truthput", "import", str(tmp_path / "other.sh"), "-o", "-"],
                         capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "starts a server" in bad.stderr


def test_import_resolves_a_scripts_variables_or_refuses_to_guess(tmp_path):
    """`vllm serve "$MODEL"`: the script's own MODEL=... gives the server its value (never the
    literal "$MODEL" the server would receive); a variable nothing sets is refused in one line."""
    import subprocess
    import sys
    import tomllib

    def imp(name: str, text: str) -> subprocess.CompletedProcess[str]:
        (tmp_path / name).write_text(text)
        return subprocess.run([sys.executable, "-m", "truthput", "import", name, "-o", name + ".toml", "--force"],
                              capture_output=True, text=True, timeout=60, cwd=tmp_path)

    ok = imp("set.sh", '#!/bin/sh\nMODEL=/models/q\nexport TP=2\nvllm serve "$MODEL" -tp ${TP} --max-num-seqs 64\n')
    assert ok.returncode == 0, ok.stderr
    command = tomllib.loads((tmp_path / "set.sh.toml").read_text())["server"]["command"]
    assert command[:3] == ["vllm", "serve", "/models/q"] and "2" in command and not any("$" in w for w in command)
    bad = imp("unset.sh", '#!/bin/sh\nvllm serve "$MODEL" --max-num-seqs 64\n')
    assert bad.returncode == 2 and "uses $MODEL, which the script never sets" in bad.stderr, bad.stderr
    unit = imp("u.service", "[Service]\nExecStart=/opt/vllm/bin/vllm serve $MODEL --max-num-seqs 64\n")
    assert unit.returncode == 2 and "$MODEL" in unit.stderr and "never sets" in unit.stderr, unit.stderr
    with_file = imp("f.service", "[Service]\nEnvironmentFile=/etc/vllm.env\n"
                                 "ExecStart=/opt/vllm/bin/vllm serve $MODEL --max-num-seqs 64\n")
    assert with_file.returncode == 0 and "EnvironmentFile=/etc/vllm.env is not read" in with_file.stderr
