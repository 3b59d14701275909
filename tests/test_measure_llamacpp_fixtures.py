"""Real llama.cpp server artefacts (tests/fixtures/llamacpp, recorded here from a source build):
its metric names map onto the same measurement, and the counter identity holds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from truthput.measure.counters import counter_delta
from truthput.measure.names import metric_names
from truthput.measure.prom import Scrape, parse_scrape

FIX = Path(__file__).parent / "fixtures" / "llamacpp"
RUNS = ["plain", "ngram", "draft"]


def scrape(name: str, phase: str, t: float):
    return parse_scrape(Scrape(phase, t, (FIX / name).read_text()))


@pytest.mark.parametrize("run", RUNS)
def test_llamacpp_names_exist_in_recorded_metrics(run):
    p = scrape(f"{run}_metrics_pre.txt", "pre", 0.0)
    assert p.ok, p.error
    names = metric_names("llamacpp")
    assert p.first_present(names.candidates("emitted_tokens")) == "llamacpp:tokens_predicted_total"
    assert p.first_present(names.candidates("prompt_tokens"))


@pytest.mark.parametrize("run", RUNS)
def test_llamacpp_counter_delta_equals_sum_of_usage(run):
    rec = json.loads((FIX / "recording.json").read_text())[run]["load"]
    pre, post = scrape(f"{run}_metrics_pre.txt", "pre", 0.0), scrape(f"{run}_metrics_post.txt", "post", 10.0)
    name = metric_names("llamacpp").emitted_tokens
    d = counter_delta([(0.0, pre.total(name)), (10.0, post.total(name))])
    assert d.resets == 0 and not d.went_backwards_without_reset
    assert d.value == rec["sum_completion_tokens"] == rec["requests"] * rec["max_tokens"]


def test_llamacpp_draft_model_speculation_counters_move():
    pre, post = scrape("draft_metrics_pre.txt", "pre", 0.0), scrape("draft_metrics_post.txt", "post", 10.0)
    names = metric_names("llamacpp")
    drafts = post.total(names.spec_drafts) - pre.total(names.spec_drafts)
    draft_tokens = post.total(names.spec_draft_tokens) - pre.total(names.spec_draft_tokens)
    accepted = post.total(names.spec_accepted) - pre.total(names.spec_accepted)
    assert drafts > 0
    assert accepted <= draft_tokens <= 3 * drafts  # --spec-draft-n-max 3


def test_llamacpp_hit_rate_is_its_cached_tokens_over_cached_plus_computed():
    """llama.cpp counts no lookups: the prompt tokens it took from a slot's cache
    (`prompt_tokens_cached_total`) over those plus the ones it computed (`prompt_tokens_total`,
    which leaves the cached out), in the recorded run 350 / (350 + 168 - 86)."""
    from truthput.measure.trial import _prefix_cache, _Scrapes

    sc = _Scrapes([Scrape("window_start", 0.0, (FIX / "plain_metrics_pre.txt").read_text()),
                   Scrape("window_end", 5.0, (FIX / "plain_metrics_post.txt").read_text())])
    fig = _prefix_cache(sc, metric_names("llamacpp"), sc.all[0], sc.all[1])
    assert fig.value == pytest.approx(350 / (350 + 168 - 86)) and fig.source == "server_counter"
    assert "350 of 432 prompt tokens" in (fig.note or "")
