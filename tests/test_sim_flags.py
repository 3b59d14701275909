"""`sim serve` flag parsing: vLLM's spellings, the three speculation spellings, ignored flags."""

from __future__ import annotations

import pytest

from truthput.errors import InputError
from truthput.sim.flags import parse_serve_args

SIM = ["--sim-gpu", "H100", "--sim-model", "llama-3.1-8b"]


def test_vllm_defaults_and_short_forms():
    cfg = parse_serve_args(["/models/m", "-tp", "2", "--pipeline-parallel-size", "2", *SIM])
    assert cfg.model == "/models/m" and cfg.served_model_name == "/models/m"
    assert cfg.tensor_parallel_size == 2 and cfg.num_gpus == 4
    assert cfg.max_num_seqs == 256 and cfg.max_num_batched_tokens == 2048
    assert cfg.gpu_memory_utilization == 0.9 and cfg.block_size == 16 and cfg.kv_dtype_bytes == 2.0
    assert cfg.spec_k == 0 and cfg.speculative is None and cfg.noise == 0.0


def test_three_speculation_spellings_agree():
    a = parse_serve_args([*SIM, "--speculative-config",
                          '{"method":"ngram","num_speculative_tokens":3,"prompt_lookup_max":4,"prompt_lookup_min":2}'])
    b = parse_serve_args([*SIM, "--spec-method", "ngram", "--spec-tokens", "3",
                          "--speculative-config.prompt_lookup_max", "4", "--speculative-config.prompt_lookup_min", "2"])
    c = parse_serve_args([*SIM, "--speculative-config.method", "ngram",
                          "--speculative-config.num_speculative_tokens=3",
                          "--speculative-config.prompt_lookup_max", "4", "--speculative-config.prompt_lookup_min", "2"])
    assert a.speculative == b.speculative == c.speculative
    assert a.spec_k == 3 and a.spec_method == "ngram"


def test_a_key_given_two_ways_is_refused_as_vllm_refuses_it():
    """vLLM 0.32 rejects a speculative key given by a --spec-* flag and by --speculative-config,
    even with the same value; the simulator parses speculation with truthput's own argv rules."""
    with pytest.raises(InputError, match="conflicting speculative settings"):
        parse_serve_args([*SIM, "--spec-tokens", "2", "--speculative-config", '{"num_speculative_tokens":2}'])
    cfg = parse_serve_args([*SIM, "--spec-method", "ngram", "--spec-tokens", "3",
                            "--speculative-config.prompt_lookup_max", "4"])
    assert cfg.spec_k == 3 and cfg.speculative["prompt_lookup_max"] == 4
    with pytest.raises(InputError, match="conflicting speculative settings"):
        parse_serve_args([*SIM, "--spec-tokens", "3", "--speculative-config", '{"num_speculative_tokens":2}'])
    with pytest.raises(InputError, match="not valid JSON"):
        parse_serve_args([*SIM, "--speculative-config", "{nope"])


def test_unknown_flags_are_listed_and_their_values_not_taken_for_the_model():
    cfg = parse_serve_args(["--model", "/m", "--weird-flag", "7", "--switch", "--enforce-eager", *SIM,
                            "--reasoning-parser", "qwen3"])
    assert cfg.model == "/m"
    assert "--weird-flag" in cfg.ignored and "--switch" in cfg.ignored
    assert "--reasoning-parser" in cfg.ignored and "--enforce-eager" in cfg.ignored
    assert "--sim-gpu" not in cfg.ignored and "--model" not in cfg.ignored


def test_served_model_name_kv_dtype_and_acceptance():
    cfg = parse_serve_args([*SIM, "--served-model-name", "qwen3-27b", "--kv-cache-dtype", "fp8",
                            "--sim-acceptance", "0.8,0.6", "--spec-method", "mtp", "--spec-tokens", "3"])
    assert cfg.served_model_name == "qwen3-27b" and cfg.kv_dtype_bytes == 1.0
    assert cfg.sim_acceptance == [0.8, 0.6]


def test_bad_values_are_one_line_errors():
    with pytest.raises(InputError, match="gpu-memory-utilization"):
        parse_serve_args([*SIM, "--gpu-memory-utilization", "1.5"])
    with pytest.raises(InputError, match="max-num-seqs"):
        parse_serve_args([*SIM, "--max-num-seqs", "0"])


@pytest.mark.parametrize("host,loop", [("127.0.0.1", True), ("::1", True), ("localhost", True), ("127.1", True),
                                       ("[::1]", True), ("0", False), ("", False), ("0.0.0.0", False),
                                       ("::", False), ("0:0:0:0:0:0:0:0", False), ("10.1.2.3", False),
                                       ("example.com", False)])
def test_every_spelling_of_all_interfaces_is_not_loopback(host, loop):
    from truthput.sim.server import is_loopback

    assert is_loopback(host) is loop


def test_sim_port_out_of_range_and_allow_remote():
    from truthput.errors import InputError
    from truthput.sim.flags import parse_serve_args

    with pytest.raises(InputError, match="--port 99999: expected 0..65535"):
        parse_serve_args(["--sim-gpu", "H100 SXM", "--sim-model", "llama-3.1-8b", "--port", "99999"])
    cfg = parse_serve_args(["--sim-gpu", "H100 SXM", "--sim-model", "llama-3.1-8b", "--host", "0", "--allow-remote"])
    assert cfg.allow_remote and cfg.host == "0"


def test_a_speculative_config_key_vllm_does_not_have_is_refused_as_vllm_refuses_it():
    """vLLM 0.32's SpeculativeConfig forbids unknown keys (start-up fails); the simulator, which reads
    only the keys it models, must not measure without the misspelt one."""
    with pytest.raises(InputError, match=r"num_speculative_token \(did you mean num_speculative_tokens\?\)"):
        parse_serve_args(["m", "--speculative-config", '{"method": "ngram", "num_speculative_token": 3}'])
    with pytest.raises(InputError, match="prompt_lookup_mx"):
        parse_serve_args(["m", "--spec-method", "ngram", "--spec-tokens", "3", "--speculative-config.prompt_lookup_mx", "4"])
    ok = parse_serve_args(["m", "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 3, '
                           '"prompt_lookup_max": 4}'])
    assert ok is not None
