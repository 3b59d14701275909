"""Speculation judged on generated text says so: a comparison whose arms speculate differently,
measured on text truthput made up, carries `synthetic_text` in its line (every view shows the
verdict's lines) and the verdict's notes say why once; on real text (the ShareGPT sample, a JSONL
of the user's prompts) it does not. Either arm may be the one that speculates."""

from __future__ import annotations

import pytest
from report_fixture import restore_quickstart_db

from truthput.analyze.summary import summary_of
from truthput.store.db import Store
from truthput.store.summary import summary_inputs


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):  # type: ignore[no-untyped-def]
    # the quickstart: original (MTP k=3, the baseline), spec1 (k=1) and nospec, on synthetic prompts
    store = Store(restore_quickstart_db(tmp_path_factory.mktemp("q") / "q.db"), read_only=True)
    return summary_inputs(store, "latest")


def _cautions(inputs, **change):  # type: ignore[no-untyped-def]
    for k, v in change.items():
        setattr(inputs, k, v)
    verdict = summary_of(inputs, fresh=True).verdict
    return {(c.variant, c.level_label): [x.code for x in c.cautions] for c in verdict.comparisons()
            if c.metric == "tok/s"}, verdict


def test_speculation_changed_on_generated_text_is_cautioned_in_both_directions(inputs):
    assert inputs.prompt_source == "synthetic"
    got, verdict = _cautions(inputs)
    assert got and all(codes == ["synthetic_text"] for codes in got.values()), got
    assert all("!synthetic_text (see the notes)" in c.line for c in verdict.comparisons() if c.metric == "tok/s")
    (note,) = [n for n in verdict.run_lines() if "!synthetic_text" in n]
    assert "sharegpt" in note and "may not carry over" in note
    # the arm without speculation as the baseline: the others now speculate where it does not
    got, _ = _cautions(inputs, baseline="nospec")
    assert got and all(codes == ["synthetic_text"] for codes in got.values()), got


def test_on_real_text_no_comparison_is_cautioned(inputs):
    for source in ("sharegpt", "/data/my-prompts.jsonl"):
        got, verdict = _cautions(inputs, prompt_source=source, baseline="original")
        assert got and all(codes == [] for codes in got.values()), (source, got)
        assert not any("synthetic_text" in line for line in verdict.lines())


def test_the_draft_length_each_arm_ran_with_is_read_from_its_counters(inputs):
    """What "speculates differently" rests on: each cell's k from its spec-decode counters."""
    from truthput.analyze.summary import _speculates

    inputs.baseline, inputs.prompt_source = "original", "synthetic"
    cells = summary_of(inputs, fresh=True).cells
    assert {c.variant: _speculates(c) for c in cells if c.per_start} == {"original": 3, "spec1": 1, "nospec": 0}
