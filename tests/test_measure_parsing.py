"""Counter deltas, Prometheus parsing, metric names and log-line formats, each against known values."""

from __future__ import annotations

import pytest

from truthput.errors import InputError
from truthput.measure.counters import counter_delta
from truthput.measure.logparse import lines_in_window, parse_log, parse_spec_line, parse_throughput_line, time_weighted_mean
from truthput.measure.names import metric_names
from truthput.measure.prom import Scrape, by_label, histogram, parse_scrape


# --- counters -------------------------------------------------------------------------------

def test_monotonic_counter_delta_and_rate():
    d = counter_delta([(0.0, 100.0), (1.0, 150.0), (4.0, 400.0)])
    assert d.value == 300 and d.resets == 0 and d.rate() == pytest.approx(75.0)


def test_drop_is_a_restart_and_the_post_reset_value_is_added():
    d = counter_delta([(0.0, 1000.0), (1.0, 1200.0), (2.0, 50.0), (3.0, 80.0)])
    assert d.value == 200 + 50 + 30 and d.resets == 1 and "lost" in d.note


def test_created_change_detects_a_restart_the_value_hides():
    # restarted and already past the old value: value-only rule would see +100, the truth is 1100 since restart
    d = counter_delta([(0.0, 1000.0, 5.0), (1.0, 1100.0, 7.0)])
    assert d.resets == 1 and d.value == 1100


def test_a_dip_that_recovers_is_a_stale_scrape_dropped_at_no_cost():
    # a lagging replica answered the middle scrape: the truth is 1000 -> 1300
    for samples in ([(0.0, 1000.0, 5.0), (1.0, 900.0, 5.0), (2.0, 1300.0, 5.0)],  # same _created
                    [(0.0, 1000.0), (1.0, 900.0), (2.0, 1300.0)],  # no _created: 900 is not near zero
                    [(0.0, 1000.0), (1.0, 1200.0), (2.0, 1100.0), (3.0, 1150.0), (4.0, 1300.0)]):
        d = counter_delta(samples)
        assert d.value == 300 and d.resets == 0 and d.dips >= 1 and not d.went_backwards_without_reset, d
        assert "stale scrape" in d.note


def test_a_dip_to_near_zero_that_recovers_at_once_is_stale_not_a_restart():
    """A fresh replica behind a gateway answers one or two scrapes with its own near-zero counter;
    the next scrape is the old counter again, sooner than a restarted counter could climb there."""
    for samples, truth, n in (([(0.0, 1000.0), (1.0, 1200.0), (2.0, 3.0), (3.0, 1400.0)], 400, 1),
                              ([(0.0, 1000.0), (1.0, 1200.0), (2.0, 3.0), (3.0, 9.0), (4.0, 1600.0)], 600, 2),
                              ([(0.0, 1000.0), (1.0, 1200.0), (2.0, 0.0), (3.0, 1200.0)], 200, 1)):  # idle after
        d = counter_delta(samples)
        assert d.value == truth and d.resets == 0 and d.dips == n, d
        assert "sooner than a restarted counter could climb" in d.note


def test_a_restart_that_climbs_past_the_old_value_at_its_own_pace_stays_a_restart():
    # 20 tok/s before; after the restart 195 tokens in 8 s (24 tok/s): a restart, not a dip
    d = counter_delta([(0.0, 100.0), (1.0, 120.0), (2.0, 5.0), (10.0, 200.0)])
    assert d.resets == 1 and d.value == 20 + 5 + 195 and d.dips == 0, d


def test_a_dip_at_the_last_scrape_loses_the_edge_and_says_so():
    d = counter_delta([(0.0, 1000.0), (1.0, 1300.0), (2.0, 1250.0)])
    assert d.value == 300 and d.went_backwards_without_reset and "end is read at the highest" in d.note


def test_missing_samples_are_reported_never_zero():
    d = counter_delta([(0.0, None), (1.0, 10.0)])
    assert d.value is None and d.missing == [0] and "missing" in d.note
    d = counter_delta([(0.0, 5.0), (1.0, None), (2.0, 25.0)])
    assert d.value == 20 and d.missing == [1] and "invisible" in d.note
    assert counter_delta([(0.0, 5.0)]).value is None


# --- prometheus text -------------------------------------------------------------------------

TEXT = """# TYPE vllm:generation_tokens counter
vllm:generation_tokens_total{engine="0",model_name="m"} 120.0
vllm:generation_tokens_total{engine="1",model_name="m"} 30.0
vllm:generation_tokens_created{engine="0",model_name="m"} 1.7e9
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 9.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 4.0
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",model_name="m",le="0.1"} 2.0
vllm:time_to_first_token_seconds_bucket{engine="0",model_name="m",le="0.2"} 6.0
vllm:time_to_first_token_seconds_bucket{engine="0",model_name="m",le="+Inf"} 10.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} 10.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} 2.5
"""


def test_sum_over_engines_and_label_filter():
    p = parse_scrape(Scrape("pre", 1.0, TEXT))
    assert p.ok
    assert p.total("vllm:generation_tokens_total") == 150.0
    assert p.total("vllm:generation_tokens_total", {"engine": "1"}) == 30.0
    assert p.total("vllm:generation_tokens_total", {"engine": "7"}) is None
    assert p.total("vllm:not_there_total") is None
    assert by_label(p, "vllm:spec_decode_num_accepted_tokens_per_pos_total", "position") == {"0": 9.0, "1": 4.0}


def test_histogram_mean_and_quantiles_from_buckets():
    h = histogram(parse_scrape(Scrape("pre", 1.0, TEXT)), "vllm:time_to_first_token_seconds")
    assert h is not None and h.mean == pytest.approx(0.25)
    assert h.histogram_quantile(0.5) == pytest.approx(0.1 + 0.1 * (5 - 2) / (6 - 2))
    assert h.histogram_quantile(0.9) == pytest.approx(0.2)  # in +Inf bucket -> highest finite bound


def test_unreadable_scrape_is_kept_as_error():
    assert parse_scrape(Scrape("post", 2.0, None, "timeout")).error == "timeout"
    bad = parse_scrape(Scrape("post", 2.0, "vllm:x{engine=0 1\n"))
    assert bad.error is not None and "post" in bad.error


def test_metric_names_per_engine_and_aliases():
    v = metric_names("vllm")
    assert v.emitted_tokens == "vllm:generation_tokens_total"
    assert v.candidates("kv_usage") == ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
    assert v.candidates("itl_hist")[1] == "vllm:time_per_output_token_seconds"
    assert metric_names("sglang").emitted_tokens == "sglang:generation_tokens_total"
    assert metric_names("llamacpp").emitted_tokens == "llamacpp:tokens_predicted_total"
    c = metric_names("command", {"emitted_tokens": "my:tokens_total"})
    assert c.emitted_tokens == "my:tokens_total" and c.prompt_tokens == "vllm:prompt_tokens_total"
    with pytest.raises(InputError, match="unknown metric name field"):
        metric_names("command", {"bogus": "x"})
    with pytest.raises(InputError, match="unknown engine"):
        metric_names("tgi")


# --- log lines -----------------------------------------------------------------------------

LINES = {
    "v1": "INFO 11-30 10:13:31 [loggers.py:335] Engine 000: Avg prompt throughput: 144.0 tokens/s, "
          "Avg generation throughput: 1239.1 tokens/s, Running: 4 reqs, Waiting: 0 reqs, "
          "GPU KV cache usage: 2.5%, Prefix cache hit rate: 0.0%",
    "cpu_preempt": "(APIServer pid=1) INFO [loggers.py:1] Engine 000: Avg prompt throughput: 0.0 tokens/s, "
                   "Avg generation throughput: 66.9 tokens/s, Running: 1 reqs, Waiting: 2 reqs, Preemptions: 3, "
                   "CPU KV cache usage: 0.4%, Prefix cache hit rate: 0.0%",
    "aggregated": "INFO 2 Engines Aggregated: Avg prompt throughput: 1.0 tokens/s, "
                  "Avg generation throughput: 368.9 tokens/s, Running: 8 reqs, Waiting: 0 reqs, "
                  "GPU KV cache usage: 9.0%, Prefix cache hit rate: 1.0%",
    "old": "INFO 05-01 10:00:00 metrics.py:341] Avg prompt throughput: 0.0 tokens/s, "
           "Avg generation throughput: 12.3 tokens/s, Running: 1 reqs, Swapped: 0 reqs, Pending: 0 reqs, "
           "GPU KV cache usage: 0.4%, CPU KV cache usage: 0.0%.",
}


@pytest.mark.parametrize("key,gen,engine,running,waiting,kv", [
    ("v1", 1239.1, "0", 4, 0, "GPU"),
    ("cpu_preempt", 66.9, "0", 1, 2, "CPU"),
    ("aggregated", 368.9, "aggregated", 8, 0, "GPU"),
    ("old", 12.3, "", 1, 0, "GPU"),
])
def test_throughput_line_formats(key, gen, engine, running, waiting, kv):
    tl = parse_throughput_line(5.0, LINES[key])
    assert tl is not None
    assert (tl.generation_tps, tl.engine, tl.running, tl.waiting, tl.kv_kind) == (gen, engine, running, waiting, kv)


def test_spec_line_and_the_seed_peak():
    line = ("INFO [metrics.py:90] SpecDecoding metrics: Mean acceptance length: 1.95, Accepted throughput: 179.11 tokens/s, "
            "Drafted throughput: 189.21 tokens/s, Accepted: 1791 tokens, Drafted: 1892 tokens, "
            "Per-position acceptance rate: 0.947, Avg Draft acceptance rate: 94.7%")
    s = parse_spec_line(3.0, line)
    assert s is not None
    assert (s.accepted_tps, s.drafted_tps, s.accepted, s.drafted) == (179.11, 189.21, 1791, 1892)
    assert s.per_position == [0.947] and s.acceptance_rate_pct == 94.7 and s.mean_acceptance_length == 1.95
    s3 = parse_spec_line(3.0, line.replace("0.947,", "0.9, 0.7, 0.5,"))
    assert s3 is not None and s3.per_position == [0.9, 0.7, 0.5]
    assert parse_throughput_line(1.0, "nothing here") is None


def test_intervals_window_and_time_weighted_mean():
    lines = [(t, f"Engine 000: Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: {g} tokens/s, "
                 "Running: 1 reqs, Waiting: 0 reqs") for t, g in ((10.0, 100.0), (20.0, 200.0), (25.0, 400.0), (45.0, 1.0))]
    tput, _ = parse_log(lines, interval_s=10.0)
    # the 20 s gap before the last line (an idle engine skips lines) counts as one interval, not the gap
    assert [x.t_interval_start for x in tput] == [0.0, 10.0, 20.0, 35.0]
    inside = lines_in_window(tput, (10.0, 25.0))
    assert [x.generation_tps for x in inside] == [200.0, 400.0]
    assert time_weighted_mean(inside, "generation_tps") == pytest.approx((200 * 10 + 400 * 5) / 15)
    # without interval_s the median spacing (10 s) is used for the first line
    assert parse_log(lines)[0][0].t_interval_start == 0.0
    every_second = [(float(t), lines[0][1]) for t in range(100, 106)]
    assert parse_log(every_second)[0][0].t_interval_start == 99.0


def test_spec_decode_line_after_an_idle_gap_covers_the_time_since_the_previous_one():
    """vLLM resets the spec-decode counts only when it logs a SpecDecoding line, and skips the
    line for intervals without drafts: a line 20 s after the previous one covers 20 s (a real
    log showed this), though the throughput lines come every 10 s."""
    spec = ("SpecDecoding metrics: Mean acceptance length: 1.50, Accepted throughput: 5.00 tokens/s, "
            "Drafted throughput: 10.00 tokens/s, Accepted: 100 tokens, Drafted: 200 tokens, "
            "Per-position acceptance rate: 0.500, Avg Draft acceptance rate: 50.0%")
    tput = ("Engine 000: Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 10.0 tokens/s, "
            "Running: 1 reqs, Waiting: 0 reqs, GPU KV cache usage: 1.0%, Prefix cache hit rate: 0.0%")
    lines = [(10.0, tput), (10.0, spec), (20.0, tput), (30.0, tput), (30.0, spec)]
    t, s = parse_log(lines)
    assert [x.t_mono - x.t_interval_start for x in t] == [10.0, 10.0, 10.0]
    assert s[0].t_mono - s[0].t_interval_start == 10.0  # the first: one spacing
    assert s[1].t_mono - s[1].t_interval_start == 20.0  # since the previous SpecDecoding line
    assert lines_in_window(s, (20.0, 30.0)) == []  # its 20 s do not lie in a 10 s window
