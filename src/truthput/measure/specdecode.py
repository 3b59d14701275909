"""Speculative-decoding statistics from counter deltas, and the identities they must satisfy.

Formulas as in vLLM's source: acceptance rate = accepted / draft_tokens; mean acceptance length =
1 + accepted / drafts; per-position acceptance = accepted_per_pos[i] / drafts. Identities
(reference/physics.md): draft_tokens <= k * drafts (equal for MTP/EAGLE/draft models);
per-position accepted counts non-increasing; emitted = drafts + accepted + undrafted steps, where
undrafted >= the requests' first tokens (prefill emits one token without a draft; exactly that for
MTP/EAGLE/draft models, more for n-gram steps that found no match).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from truthput.measure.methods import figure
from truthput.measure.model import Check, SpecInterval

# Methods that propose a draft at every decode step (so undrafted == first tokens, draft_tokens == k*drafts).
ALWAYS_DRAFTING = ("mtp", "eagle", "eagle3", "draft_model", "medusa", "deepseek_mtp", "qwen3_5_mtp", "qwen3_next_mtp")


def always_drafts(method: str | None) -> bool:
    m = (method or "").lower()
    return any(m == a or m.endswith("mtp") or m.startswith("eagle") for a in ALWAYS_DRAFTING)


@dataclass(slots=True)
class SpecDeltas:
    """Counter increases over one interval."""

    emitted: float
    drafts: float
    draft_tokens: float
    accepted: float
    accepted_per_pos: dict[int, float] = field(default_factory=dict)


def check(ok: bool | None, message: str, **numbers: Any) -> Check:
    return Check(ok=ok, numbers=numbers, message=message)


def spec_decode_stats(d: SpecDeltas, k: int | None, method: str | None, first_tokens: int | None,
                      label: str) -> SpecInterval:
    """Statistics and checks for one interval (`label` says which: window or whole trial)."""
    out: dict[str, Any] = {"interval": label}
    src = "server_counter"
    out["drafts"] = figure(d.drafts, "drafts", src)
    out["draft_tokens"] = figure(d.draft_tokens, "tokens", src)
    out["accepted_tokens"] = figure(d.accepted, "tokens", src)
    out["acceptance_rate"] = figure(d.accepted / d.draft_tokens if d.draft_tokens else None, "ratio", src,
                                 note=None if d.draft_tokens else "no draft tokens")
    out["mean_acceptance_length"] = figure(1 + d.accepted / d.drafts if d.drafts else None, "tokens/step", src,
                                        note="1 + accepted / drafts" if d.drafts else "no drafts")
    positions = sorted(d.accepted_per_pos)
    out["per_position_acceptance"] = [
        figure(d.accepted_per_pos[p] / d.drafts if d.drafts else None, "ratio", src, position=p) for p in positions
    ]
    undrafted = d.emitted - d.drafts - d.accepted
    out["undrafted_steps"] = figure(undrafted, "steps", src, note="emitted - drafts - accepted")
    steps = d.drafts + undrafted
    out["share_steps_without_draft"] = figure(undrafted / steps if steps > 0 else None, "ratio", src,
                                           note="undrafted / (drafts + undrafted), per sequence-step")
    checks: dict[str, Check] = {}
    if k:
        limit = k * d.drafts
        exact = always_drafts(method)
        ok = d.draft_tokens <= limit + 0.5 and (not exact or abs(d.draft_tokens - limit) < 0.5)
        checks["draft_tokens_le_k_drafts"] = check(
            ok,
            f"draft tokens {d.draft_tokens:g} {'==' if exact else '<='} k*drafts = {k}*{d.drafts:g} = {limit:g}"
            + ("" if ok else " VIOLATED"),
            draft_tokens=d.draft_tokens, k=k, drafts=d.drafts,
        )
    else:
        checks["draft_tokens_le_k_drafts"] = check(None, "k (num_speculative_tokens) unknown: not checked")
    vals = [d.accepted_per_pos[p] for p in positions]
    mono = all(a >= b for a, b in zip(vals, vals[1:]))
    checks["per_position_non_increasing"] = check(
        mono if vals else None,
        ("per-position accepted counts are non-increasing" if mono else "per-position accepted counts INCREASE somewhere")
        if vals else "no per-position counter",
        per_position=vals,
    )
    if vals:
        s = sum(vals)
        checks["per_position_sums_to_accepted"] = check(
            abs(s - d.accepted) < 0.5, f"sum over positions {s:g} vs accepted {d.accepted:g}", sum=s, accepted=d.accepted
        )
    checks["accepted_le_draft_tokens"] = check(
        d.accepted <= d.draft_tokens + 0.5, f"accepted {d.accepted:g} <= draft tokens {d.draft_tokens:g}",
        accepted=d.accepted, draft_tokens=d.draft_tokens,
    )
    if first_tokens is None:
        checks["emitted_identity"] = check(None, "number of first tokens unknown: not checked", undrafted=undrafted)
    else:
        exact = always_drafts(method)
        ok = undrafted >= first_tokens - 0.5 and (not exact or abs(undrafted - first_tokens) < 0.5)
        checks["emitted_identity"] = check(
            ok,
            f"emitted {d.emitted:g} = drafts {d.drafts:g} + accepted {d.accepted:g} + undrafted {undrafted:g}; "
            f"undrafted {'==' if exact else '>='} first tokens {first_tokens}"
            + ("" if ok else " VIOLATED") + (f" (method {method}: a draft every step after prefill)" if exact else ""),
            emitted=d.emitted, drafts=d.drafts, accepted=d.accepted, undrafted=undrafted, first_tokens=first_tokens,
        )
    out["checks"] = checks
    return SpecInterval.model_validate(out)


def drafted_plus_accepted_explanation(k: int | None, emitted: float, drafted: float, accepted: float) -> str:
    """Why a correct throughput log line can look like 'drafted + accepted' (the seed's misreading)."""
    total = drafted + accepted
    rel = (total - emitted) / emitted * 100 if emitted else float("nan")
    if k == 1:
        return (
            f"k = 1: every draft is one token, so drafted tokens == drafts, and emitted = drafts + accepted + "
            f"undrafted steps ~= drafted + accepted ({total:g} vs {emitted:g}, {rel:+.1f}%). The log line's "
            "generation throughput counts emitted tokens (same count as the counter); it only looks like "
            "'drafted + accepted' by this identity, it does not add drafts."
        )
    return (
        f"k = {k}: drafted + accepted = {total:g} vs emitted {emitted:g} ({rel:+.1f}%): with k > 1 they differ, "
        "so the generation throughput line cannot be 'drafted + accepted'."
    )
