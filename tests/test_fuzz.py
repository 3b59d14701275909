"""Property-based fuzzing of everything truthput reads from outside: experiment files, systemd units,
SSE streams and /metrics text. Each target runs 500 examples; the property is "a clear error of
truthput's own kind, or a result", never another exception (a traceback for the user)."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tomlwrite import toml_text

from truthput.errors import TruthputError

FUZZ = settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow],
                derandomize=True)

BASE = {
    "experiment": {"name": "f", "baseline": "a", "seed": 1},
    "server": {"engine": "sim", "command": ["vllm", "serve", "m", "--tensor-parallel-size", "2"],
               "ready_timeout_s": 30},
    "hardware": {"gpu": "RTX 3090", "count": 2},
    "model": {"profile": "qwen3.6-27b-5.5bit"},
    "variant": [{"name": "a"}, {"name": "b", "set": {"--spec-tokens": 1}}],
    "workload": {"concurrency": [1, 8], "duration_s": 3, "input_tokens": 64, "output_tokens": 32},
    "measure": {"starts": 3, "max_starts": 6, "target": "±2%", "verdicts": ["tok/s"]},
}

KEYS = [("experiment", "name"), ("experiment", "seed"), ("server", "engine"), ("server", "command"),
        ("server", "port"), ("server", "host"), ("server", "ready_timeout_s"), ("hardware", "gpu"),
        ("hardware", "count"), ("model", "profile"), ("workload", "concurrency"), ("workload", "duration_s"),
        ("workload", "input_tokens"), ("workload", "output_tokens"), ("workload", "warmup_s"),
        ("measure", "starts"), ("measure", "max_starts"), ("measure", "target"), ("measure", "min_effect"),
        ("measure", "verdicts"), ("measure", "confidence"), ("measure", "sequential")]

toml_scalars = st.one_of(
    st.integers(min_value=-(2**40), max_value=2**40), st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(), st.text(max_size=20), st.sampled_from(["±2%", "abc", "0%", "100%", "-5%", "", "0.0.0.0", "\x00"]))
toml_values = st.one_of(toml_scalars, st.lists(toml_scalars, max_size=4),
                        st.dictionaries(st.text(max_size=8), toml_scalars, max_size=3))


@FUZZ
@given(changes=st.lists(st.tuples(st.sampled_from(KEYS), toml_values), max_size=4),
       variant_set=st.dictionaries(st.sampled_from(["--spec-tokens", "-tp", "--max-num-seqs", "--speculative-config",
                                                    "--speculative-config.num_speculative_tokens", "--port",
                                                    "--kv-cache-dtype"]), toml_values, max_size=3))
def test_experiment_files_parse_or_fail_clearly(changes, variant_set):
    from truthput.run.plan import build_plan
    from truthput.experiment.file import parse_experiment

    doc = json.loads(json.dumps(BASE))
    for (section, key), value in changes:
        doc[section][key] = value
    doc["variant"][1]["set"] = variant_set
    try:
        text = toml_text(doc)
    except (TypeError, ValueError):
        return
    try:
        build_plan(parse_experiment(text, "fuzz.toml"))
    except TruthputError as exc:
        assert str(exc).strip()


@FUZZ
@given(data=st.binary(max_size=400))
def test_arbitrary_bytes_as_an_experiment_file_fail_clearly(data, tmp_path_factory):
    from truthput.experiment.file import load_experiment

    path = tmp_path_factory.mktemp("fz") / "x.toml"
    path.write_bytes(data)
    try:
        load_experiment(path)
    except TruthputError as exc:
        assert "\n" not in str(exc).strip() or "x.toml" in str(exc)


unit_lines = st.lists(st.one_of(
    st.sampled_from(["[Unit]", "[Service]", "[Install]", "ExecStart=", "Environment=", "# c", ""]),
    st.builds(lambda k, v: f"{k}={v}", st.sampled_from(["ExecStart", "Environment", "WorkingDirectory", "User",
                                                      "ExecStartPre", "Restart", "X"]),
              st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40)),
    st.text(max_size=30)), max_size=12)


@FUZZ
@given(unit_lines)
def test_systemd_units_parse_or_fail_clearly(lines):
    from truthput.experiment.unit import parse_unit

    try:
        unit = parse_unit("\n".join(lines), "fuzz.service")
        unit.exec_start_argv()
    except TruthputError as exc:
        assert str(exc).strip()


sse_pieces = st.lists(st.one_of(
    st.sampled_from([b"data: ", b"data:", b"\n", b"\r\n", b"\n\n", b": keep-alive\n", b"event: x\n",
                     b'{"choices":[{"text":"a"}]}', b'{"choices":5}', b"null", b"[DONE]", b'{"usage":',
                     b'{"completion_tokens":-3}}', b'{"choices":[{"delta":{"content":"x"}}]}', b"\xff\xfe"]),
    st.binary(max_size=12)), max_size=30)


@FUZZ
@given(sse_pieces, st.lists(st.integers(min_value=1, max_value=40), min_size=1, max_size=8))
def test_sse_streams_give_payloads_or_clear_errors(pieces, cuts):
    from truthput.load.chunks import MalformedChunk, decode_chunk
    from truthput.load.sse import EventTooLarge, SSEParser

    data = b"".join(pieces)
    parser = SSEParser()
    payloads = []
    pos = 0
    i = 0
    try:
        while pos < len(data):
            n = cuts[i % len(cuts)]
            payloads += parser.feed(data[pos:pos + n])
            pos += n
            i += 1
        payloads += parser.flush()
    except EventTooLarge:
        return
    for p in payloads:
        if p == b"[DONE]":
            continue
        try:
            decode_chunk(bytes(p))
        except MalformedChunk as exc:
            assert str(exc)


metric_lines = st.lists(st.one_of(
    st.sampled_from(["# HELP vllm:generation_tokens_total x", "# TYPE vllm:generation_tokens_total counter",
                     "vllm:generation_tokens_total 12", 'vllm:generation_tokens_total{model_name="m"} 1e3',
                     "vllm:num_requests_running 4", "# TYPE vllm:x histogram", 'vllm:x_bucket{le="+Inf"} 3',
                     "vllm:x_sum NaN", "vllm:x_count 3", "# EOF", "}{", 'a{b="c} 1', "x 1 2 3"]),
    st.text(max_size=40)), max_size=15)


@FUZZ
@given(metric_lines)
def test_metrics_text_is_read_or_kept_as_an_error(lines):
    from truthput.measure.prom import Scrape, by_label, histogram, parse_scrape, sum_samples

    parsed = parse_scrape(Scrape("pre", 0.0, "\n".join(lines) + "\n"))
    assert parsed.ok or parsed.error
    sum_samples(parsed, "vllm:generation_tokens_total")
    by_label(parsed, "vllm:generation_tokens_total", "model_name")
    histogram(parsed, "vllm:x")
