"""measure_trial against the known-truth server's ledger (virtual time: every figure is exact)."""

from __future__ import annotations

import json
import time

import pytest

from truthput.measure.prom import Scrape
from truthput.measure.trial import measure_trial as _measure_trial


def measure_trial(*args, **kwargs) -> dict:
    """The trial's figures as the store keeps them (the results model's JSON document)."""
    return _measure_trial(*args, **kwargs).to_json_dict()

from truthserver import Simulated, TruthConfig, simulate, truth_tokenizer


def run(cfg: TruthConfig, tokenizer=None, speculative=None, **kw) -> tuple[Simulated, dict]:
    sim = simulate(cfg)
    res = measure_trial(sim.records, kw.pop("scrapes", sim.scrapes), kw.pop("log_lines", sim.log_lines), sim.window,
                        cfg.concurrency, speculative=speculative, tokenizer=tokenizer, **kw)
    json.dumps(res)  # JSON-able, always
    return sim, res


def row(res: dict, method: str) -> dict:
    return next(r for r in res["methods"] if r["method"] == method)


def test_every_window_method_matches_the_ledger():
    cfg = TruthConfig(concurrency=4, requests=40, tokens_per_chunk=(1, 3, 2))
    sim, res = run(cfg, tokenizer=truth_tokenizer())
    ws, we = sim.window
    dt = we - ws
    tp = res["throughput"]
    truth_tps = sim.ledger.between(ws, we) / dt
    assert tp["counter_window"]["value"] == pytest.approx(truth_tps, rel=1e-12)
    assert tp["counter_window"]["source"] == "server_counter"
    assert tp["usage_window"]["value"] == pytest.approx(truth_tps, rel=1e-12)
    assert tp["tokenizer_window"]["value"] == pytest.approx(truth_tps, rel=1e-12)
    assert tp["chunks_window"]["value"] == pytest.approx(sim.ledger.chunks_between(ws, we) / dt)
    assert tp["words_window"]["value"] == pytest.approx(sim.ledger.between(ws, we, "words") / dt)
    assert res["whole_trial"]["words_per_token"]["value"] == pytest.approx(0.75)
    assert res["whole_trial"]["tokenizer_vs_usage"]["value"] == 0.0
    # whole trial: usage over the client's wall clock includes ramp-up and drain
    ok = [r for r in sim.records if r.status == "ok"]
    wall = max(r.t_end for r in sim.records) - min(r.t_start for r in sim.records)
    assert res["whole_trial"]["usage_trial"]["value"] == pytest.approx(sum(r.completion_tokens for r in ok) / wall)
    # causes
    assert row(res, "counter (window)")["cause"] == "reference"
    assert row(res, "usage placed in time (window)")["cause"] == "agrees"
    assert row(res, "tokenizer (window)")["cause"] == "agrees"
    chunks = row(res, "chunks as tokens (window)")
    assert chunks["cause"] == "unit" and chunks["error_pct_vs_counter"] < -40  # 2 tokens per chunk on average
    words = row(res, "whitespace words (window)")
    assert words["cause"] == "unit"
    assert words["error_pct_vs_counter"] == pytest.approx(-25.0, abs=1.0)  # 3 words per 4 tokens
    assert row(res, "usage whole trial")["cause"] == "window"


def test_integrity_accounts_for_a_request_failing_mid_stream():
    cfg = TruthConfig(concurrency=3, requests=12, fail_request=4, fail_after_tokens=10)
    sim, res = run(cfg)
    integ = res["integrity"]
    assert integ["holds"] is True and integ["difference"] == 0
    assert integ["counter_delta"]["value"] == sim.ledger.total()
    assert integ["failed_partial_tokens"]["value"] == 10
    assert integ["usage_sum_ok"]["value"] == 11 * cfg.max_tokens
    assert res["requests"]["failed"] == 1 and res["requests"]["failed_mid_stream"] == 1
    assert "connection reset" in res["requests"]["errors"][0]["error"]


def test_usage_only_at_the_end_is_missing_data_not_zero():
    cfg = TruthConfig(concurrency=2, requests=8, continuous_usage=False, fail_request=3, fail_after_tokens=10)
    sim, res = run(cfg)
    assert res["throughput"]["usage_window"]["value"] is None
    assert "missing data" in res["throughput"]["usage_window"]["note"]
    assert row(res, "usage placed in time (window)")["cause"] == "missing data"
    assert row(res, "tokenizer (window)")["cause"] == "missing data"  # no tokenizer given
    integ = res["integrity"]
    # the failed request's 10 tokens were counted by the server but the client has no count for them
    assert integ["difference"] == 10 and integ["holds"] is False
    assert integ["failed_without_count"] == 1 and "without a token count" in integ["message"]
    # ITL needs per-chunk token counts: without usage nor tokenizer it is missing data, chunk gaps stay apart
    assert res["latency"]["itl"]["n"] == 0 and "missing data" in res["latency"]["itl"]["mean"]["note"]
    assert res["latency"]["chunk_gap"]["mean"]["value"] == pytest.approx(cfg.step_s)
    # a tokenizer restores ITL
    _, res2 = run(cfg, tokenizer=truth_tokenizer())
    assert res2["latency"]["itl"]["tokens_source"] == "tokenizer"
    assert res2["throughput"]["tokenizer_window"]["value"] == pytest.approx(
        res2["throughput"]["counter_window"]["value"])


def test_counter_reset_in_the_window_follows_prometheus_rule():
    base = simulate(TruthConfig(concurrency=4, requests=40))
    ws, we = base.window
    reset_at = (ws + we) / 2
    cfg = TruthConfig(concurrency=4, requests=40, reset_at=reset_at)
    sim, res = run(cfg)
    cw = res["throughput"]["counter_window"]
    assert cw["resets"] == 1 and "reset" in cw["note"]
    # the post-reset value is added; what was emitted between the window_start scrape and the restart is lost
    assert cw["value"] * (we - ws) == pytest.approx(sim.ledger.between(reset_at, we))
    integ = res["integrity"]
    assert integ["holds"] is False
    assert integ["difference"] == -sim.ledger.between(ws, reset_at)
    assert "reset" in integ["message"]


def test_lagging_metrics_are_flagged_by_the_integrity_identity():
    cfg = TruthConfig(concurrency=4, requests=40, metrics_lag_s=0.05)
    sim, res = run(cfg)
    ws, we = sim.window
    lag = cfg.metrics_lag_s
    assert res["throughput"]["counter_window"]["value"] * (we - ws) == pytest.approx(
        sim.ledger.between(ws - lag, we - lag))
    integ = res["integrity"]
    assert integ["difference"] < 0 and "may lag" in integ["message"]


def test_metrics_lagging_by_one_scrape_is_detected():
    cfg = TruthConfig(concurrency=4, requests=42, metrics_lag_scrapes=True)  # streams end at different times
    sim, res = run(cfg)
    t = [s.t_mono for s in sim.scrapes]  # pre, window_start, window_end, post
    cw = res["throughput"]["counter_window"]
    # what the window scrapes really saw: the states at the pre and window_start scrapes
    assert cw["value"] * (t[2] - t[1]) == pytest.approx(sim.ledger.between(t[0], t[1]))
    assert cw["suspect"] is True
    assert res["scrape_intervals"]["stale_suspected"] is True
    assert "stale" in res["warnings"][0] and row(res, "counter (window)")["note"].startswith("SUSPECT")
    assert res["integrity"]["holds"] is False and "may lag" in res["integrity"]["message"]
    # a clean trial has per-interval agreement and no warning
    _, clean = run(TruthConfig(concurrency=4, requests=40))
    assert clean["scrape_intervals"]["stale_suspected"] is False and clean["warnings"] == []
    assert all(r["difference"] == 0 for r in clean["scrape_intervals"]["rows"])


def test_seed_word_probe_reads_higher_than_the_counter_at_one_stream():
    # 1 stream, long prefill: per-request active time leaves out TTFT, so words/active > tokens/wall
    cfg = TruthConfig(concurrency=1, requests=10, max_tokens=40, prefill_s=0.2, step_s=0.01, tokens_per_chunk=(1,))
    sim, res = run(cfg)
    counter = res["throughput"]["counter_window"]["value"]
    probe = res["whole_trial"]["word_probe_per_request"]["value"]
    active = 39 * cfg.step_s  # 40 tokens, one per step after the first
    assert probe == pytest.approx(30 / active)  # 30 words per request
    ws, we = sim.window
    assert counter == pytest.approx(sim.ledger.between(ws, we) / (we - ws))
    assert probe > counter  # the seed's 75.9 vs 66.9 effect
    r = row(res, "word probe per request")
    assert r["cause"] == "window" and r["breakdown_pct"]["unit"] == pytest.approx(-25.0, abs=1.5)
    # at 8 streams and no prefill the unit effect dominates: the probe reads LOWER (the seed's 245 vs 339.9)
    cfg8 = TruthConfig(concurrency=8, requests=64, prefill_s=0.0, tokens_per_chunk=(1,))
    _, res8 = run(cfg8)
    r8 = row(res8, "word probe per request")
    assert r8["cause"] == "unit" and r8["error_pct_vs_counter"] == pytest.approx(-25.0, abs=3.0)


@pytest.mark.parametrize("k,accept,method", [(1, (1, 1, 0, 1), "qwen3_5_mtp"), (3, (3, 2, 0, 1, 3), "eagle"),
                                             (3, (3, 2, 0, 1, 3), "ngram")])
def test_spec_decode_statistics_and_identities(k, accept, method):
    cfg = TruthConfig(concurrency=4, requests=24, spec_k=k, accept_pattern=accept)
    sim, res = run(cfg, speculative={"method": method, "num_speculative_tokens": k})
    sd = res["spec_decode"]["trial"]
    led = sim.ledger
    drafts, acc = led.total("drafts"), led.total("accepted")
    assert sd["drafts"]["value"] == drafts and sd["accepted_tokens"]["value"] == acc
    assert sd["acceptance_rate"]["value"] == pytest.approx(acc / (k * drafts))
    assert sd["mean_acceptance_length"]["value"] == pytest.approx(1 + acc / drafts)
    assert sd["undrafted_steps"]["value"] == cfg.requests  # exactly the first tokens
    pp = [p["value"] for p in sd["per_position_acceptance"]]
    assert len(pp) == k and pp == sorted(pp, reverse=True)
    assert all(c["ok"] for c in sd["checks"].values()), sd["checks"]
    assert res["spec_decode"]["window"]["checks"]["emitted_identity"]["ok"]
    # the "drafted + accepted" reading is a definition error, small only when k = 1
    da = row(res, "drafted + accepted (counters)")
    assert da["cause"] in ("definition", "agrees")
    if k == 1:
        assert abs(da["error_pct_vs_counter"]) < 6
        assert "k = 1" in res["log_line"]["drafted_plus_accepted_explanation"]
        assert res["log_line"]["drafted_plus_accepted_vs_generation"]["ok"]
    else:
        assert da["error_pct_vs_counter"] > 20 and da["cause"] == "definition"


def test_spec_identity_violation_is_reported():
    # a server claiming MTP but emitting more undrafted steps than first tokens (our pattern always drafts;
    # say the method drafts every step but feed 'k' too small): draft_tokens > k * drafts must fail
    cfg = TruthConfig(concurrency=2, requests=6, spec_k=2, accept_pattern=(2, 1))
    _, res = run(cfg, speculative={"method": "mtp", "num_speculative_tokens": 1})
    chk = res["spec_decode"]["trial"]["checks"]["draft_tokens_le_k_drafts"]
    assert chk["ok"] is False and "VIOLATED" in chk["message"]


def test_log_lines_mean_and_peak_in_window():
    cfg = TruthConfig(concurrency=4, requests=60, log_interval_s=0.25)
    sim, res = run(cfg)
    ws, we = sim.window
    L = cfg.log_interval_s
    ends = [t for t, line in sim.log_lines if t - L >= ws - 0.1 * L and t <= we + 0.1 * L]
    per_line = [float(f"{sim.ledger.between(t - L, t) / L:.1f}") for t in ends]
    lb = res["log_line"]
    assert lb["generation_mean_window"]["value"] == pytest.approx(sum(per_line) / len(per_line))
    assert lb["generation_peak_window"]["value"] == max(per_line)
    assert lb["generation_mean_window"]["source"] == "log_line"
    # no log line inside a window shorter than the interval
    _, res2 = run(TruthConfig(concurrency=4, requests=8, log_interval_s=30.0))
    assert res2["log_line"]["generation_mean_window"]["note"] == "no log line in window"
    assert row(res2, "log line mean (window)")["cause"] == "missing data"


def test_latency_with_several_tokens_per_chunk():
    cfg = TruthConfig(concurrency=2, requests=6, max_tokens=40, prefill_s=0.05, step_s=0.01, tokens_per_chunk=(1, 3, 2))
    sim, res = run(cfg)
    lat = res["latency"]
    assert lat["ttft"]["p50"]["value"] == pytest.approx(cfg.prefill_s)
    # chunks after the first: 1,3,2,1,3,2,... tokens per 10 ms gap -> intervals of 10, 3.33, 5 ms
    itl = lat["itl"]
    assert itl["p50"]["value"] == pytest.approx(0.005)
    assert itl["p99"]["value"] == pytest.approx(0.01)
    assert "g/n" in itl["rule"]
    assert itl["n"] == 6 * 39  # one interval per token after the first
    assert lat["chunk_gap"]["mean"]["value"] == pytest.approx(0.01) and lat["chunk_gap"]["mean"]["source"] == "chunks"
    # TPOT (vLLM definition) equals the mean ITL under the spreading rule
    assert lat["tpot"]["mean"]["value"] == pytest.approx(itl["mean"]["value"])
    srv = lat["server_window"]["ttft"]
    assert srv["mean"]["value"] == pytest.approx(cfg.prefill_s) and srv["mean"]["source"] == "server_counter"
    ps = res["per_stream"]
    assert ps["decode_tps_mean"]["value"] == pytest.approx(39 / itl["mean"]["value"] / 39)


def test_missing_metrics_fall_back_to_usage_reference_and_say_so():
    cfg = TruthConfig(concurrency=2, requests=8)
    sim = simulate(cfg)
    broken = [Scrape(s.phase, s.t_mono, None, "connection refused") for s in sim.scrapes]
    res = measure_trial(sim.records, broken, [], sim.window, 2)
    assert res["throughput"]["counter_window"]["value"] is None
    assert res["integrity"]["holds"] is None and "not checked" in res["integrity"]["message"]
    assert row(res, "counter (window)")["cause"] == "missing data"
    assert row(res, "whitespace words (window)")["reference"].startswith("usage")
    assert res["window"]["seconds"] == pytest.approx(sim.window[1] - sim.window[0])
    # without any window scrape the given window is used, and said so
    res2 = measure_trial(sim.records, [], [], sim.window, 2)
    assert res2["window"]["from"].startswith("given window")
    assert res2["throughput"]["words_window"]["value"] == pytest.approx(
        sim.ledger.between(*sim.window, "words") / (sim.window[1] - sim.window[0]))


def test_measuring_ten_times_the_requests_takes_about_ten_times_as_long():
    """measure_trial scales linearly with the requests of a trial (a quadratic step would make a
    long trial's measurement dominate the run): 10,000 requests against 1,000, timed side by side
    in this process, best of five each, a ratio well under the 100 a quadratic step would give. Timed
    in this process's CPU time: the suite's other workers share the cores, and a wall clock would
    count their time slices (on a saturated 2-core host the larger case read 4x its CPU time)."""
    def best(requests: int) -> float:
        sim = simulate(TruthConfig(concurrency=100, requests=requests, max_tokens=40, log_interval_s=1.0))
        times = []
        for _ in range(5):
            t = time.process_time()
            res = measure_trial(sim.records, sim.scrapes, sim.log_lines, sim.window, 100, tokenizer=None)
            times.append(time.process_time() - t)
            assert res["integrity"]["holds"] is True
        return min(times)

    small, large = best(1_000), best(10_000)
    assert large / small < 30, f"1,000 requests {small:.3f} s, 10,000 requests {large:.3f} s"


def test_sglang_accept_length_from_verify_calls():
    cfg = TruthConfig(concurrency=2, requests=8, spec_k=2, accept_pattern=(2, 1, 0))
    sim = simulate(cfg)

    def to_sglang(text: str) -> str:
        out = []
        for line in text.splitlines():
            if line.startswith("vllm:generation_tokens_total"):
                out.append(line.replace("vllm:generation_tokens_total", "sglang:generation_tokens_total"))
            elif line.startswith("vllm:spec_decode_num_drafts_total"):
                out.append(line.replace("vllm:spec_decode_num_drafts_total", "sglang:spec_verify_calls_total"))
        return "\n".join(out) + "\n"

    scrapes = [Scrape(s.phase, s.t_mono, to_sglang(s.text)) for s in sim.scrapes]
    res = measure_trial(sim.records, scrapes, [], sim.window, 2, engine="sglang",
                        speculative={"method": "eagle", "num_speculative_tokens": 2})
    ws, we = sim.window
    acc = res["spec_decode"]["accept_length_window"]
    assert acc["value"] == pytest.approx(sim.ledger.between(ws, we) / sim.ledger.between(ws, we, "drafts"))
    assert res["emitted_metric"] == "sglang:generation_tokens_total"
    assert res["integrity"]["holds"] is True


def test_pre_to_post_rate_leaves_out_the_wait_for_a_lagging_counter_to_settle():
    """A /metrics 0.2 s behind: the first `post` scrape (the drain's end) still misses tokens, the
    settled one 0.5 s later has them all; the pre->post rate divides the settled count by the
    time to the drain's end, not by truthput's own wait."""
    cfg = TruthConfig(concurrency=2, requests=8, metrics_lag_s=0.2)
    sim = simulate(cfg)
    pre, drained = sim.scrapes[0], sim.scrapes[-1]
    settled = Scrape("post", drained.t_mono + 0.5, sim.metrics.scrape(drained.t_mono + 0.5))
    res = measure_trial(sim.records, [*sim.scrapes, settled], [], sim.window, 2)
    assert res["integrity"]["holds"] is True  # the settled scrape has every token
    rate = res["whole_trial"]["counter_trial"]
    assert rate["value"] == pytest.approx(sim.ledger.total() / (drained.t_mono - pre.t_mono))
    assert "settle" in rate["note"]
