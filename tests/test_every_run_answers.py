"""Every run, `decide` and `report` ends with what was decided or one sentence saying why nothing was
(issue 62): one variant, no values at all, a baseline that failed, a baseline with no figure."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from truthput.analyze.verdict import make_verdict


@pytest.mark.parametrize("cells, failed, says", [
    ({("a", 4): [[100.0], [101.0]]}, {}, "nothing compared: one variant (a) was measured"),
    ({}, {}, "nothing decided: no start of any variant has a measured figure"),
    ({("b", 4): [[100.0], [99.0]]}, {"a": "server did not start"}, "the baseline a failed"),
    ({("b", 4): [[100.0], [99.0]]}, {}, "the baseline a has no measured figure"),
])
def test_a_verdict_that_compares_nothing_says_why(cells, failed, says):
    verdict = make_verdict(cells, "a", failed=failed)
    assert not verdict.comparisons()
    assert any(says in line for line in verdict.lines()), verdict.lines()


def test_decide_on_values_with_no_start_says_so(tmp_path):
    values = tmp_path / "v.json"
    values.write_text(json.dumps({"schema": "truthput-values/1", "baseline": "a", "simulated": False, "starts": []}))
    out = subprocess.run([sys.executable, "-m", "truthput", "decide", str(values)], capture_output=True, text=True)
    assert "nothing decided" in out.stdout, (out.stdout, out.stderr)
