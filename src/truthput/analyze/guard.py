"""Output guard: does a variant change greedy output?

Why: a faster configuration is only a win if it computes the same thing.  Speculative
decoding must not change greedy (temperature 0) output; a quantised KV cache may.  The guard
compares the texts the baseline and the variant produced for the same prompts, in order.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from truthput.errors import MeasurementError


@dataclass(frozen=True)
class GuardResult:
    """Exact-match comparison of greedy outputs, prompt by prompt."""

    n: int
    exact_matches: int
    exact_match_rate: float
    first_divergence: list[int | None]
    """Character index of the first difference per prompt; None where the outputs are identical."""
    verdict: str
    """"identical" or "diverges: k/n prompts differ (first at char i in prompt j)"."""

    @property
    def identical(self) -> bool:
        return self.exact_matches == self.n


def compare_outputs(baseline_texts: Sequence[str], variant_texts: Sequence[str]) -> GuardResult:
    """Compare outputs prompt by prompt; the lists must be aligned (same prompts, same order)."""
    if len(baseline_texts) != len(variant_texts):
        raise MeasurementError(
            f"output guard: baseline has {len(baseline_texts)} outputs but variant has "
            f"{len(variant_texts)}; they must answer the same prompts"
        )
    if not baseline_texts:
        raise MeasurementError("output guard: no outputs to compare")
    first: list[int | None] = []
    for b, v in zip(baseline_texts, variant_texts, strict=True):
        first.append(None if b == v else len(os.path.commonprefix([b, v])))
    n = len(first)
    differ = [(i, d) for i, d in enumerate(first) if d is not None]
    matches = n - len(differ)
    if not differ:
        verdict = "identical"
    else:
        j, i = min(differ, key=lambda x: x[1])
        verdict = f"diverges: {len(differ)}/{n} prompts differ (earliest at char {i} of prompt {j})"
    return GuardResult(n=n, exact_matches=matches, exact_match_rate=matches / n,
                       first_divergence=first, verdict=verdict)
