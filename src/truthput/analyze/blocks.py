"""Nodes as blocks: a run placed on several nodes of one hardware class compares within nodes.

Two nodes of the same GPU type still differ (cooling, clocks, a neighbour on the PCIe switch), and
a variant that happened to get more starts on the faster node would look faster. With starts
dealt interleaved to every node, each node sees every variant, so the node's own effect can be
taken out: at each load level, log(start mean) = variant effect + node effect, fitted by least
squares across all variants, and each start's values are divided by its node's factor before the
comparison. Only where the data show a node effect: an F test of the additive model against the
variant-only one (p < NODE_P, with residual degrees of freedom left); fitting node effects that
are noise would narrow the intervals for nothing. One node (or a local run): nothing changes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from truthput.experiment.levels import Level, level_label

Key = tuple[str, Level]
NODE_P = 0.05


@dataclass
class NodeBlocks:
    nodes: int
    classes: list[str]
    effects: dict[str, float] = field(default_factory=dict)
    """Largest node factor removed at any level, per node (empty: none removed)."""
    tests: list[str] = field(default_factory=list)
    """Per load level: the node-effect test and what was done."""

    def line(self) -> str:
        cls = "; ".join(self.classes) or "unknown"
        head = (f"placement: the measurements rest on {self.nodes} node(s) of {len(self.classes)} hardware "
                f"class(es) ({cls})")
        if self.nodes > 1:
            head += "; node as a block: " + "; ".join(self.tests)
        return head


def remove_node_effects(values: Mapping[Key, Sequence[Sequence[float]]],
                        nodes: Mapping[Key, Sequence[str | None]]) -> tuple[dict[Key, list[list[float]]],
                                                                            dict[str, float], list[str]]:
    """`values` with each start's entries divided by its node's fitted factor, per load level where
    an F test finds a node effect; the node factors removed; one line per level saying what the
    test found."""
    from scipy import special

    out = {k: [list(v) for v in vs] for k, vs in values.items()}
    factors: dict[str, float] = {}
    lines: list[str] = []
    for level in sorted({k[1] for k in values}, key=float):
        rows = []  # (variant, node, log start mean, key, index)
        for k, starts in values.items():
            if k[1] != level:
                continue
            labels = list(nodes.get(k, []))
            for i, vals in enumerate(starts):
                pos = [x for x in vals if x > 0]
                node = labels[i] if i < len(labels) else None
                if pos and node is not None:
                    rows.append((k[0], node, sum(math.log(x) for x in pos) / len(pos), k, i))
        node_names = sorted({r[1] for r in rows})
        if len(node_names) < 2:
            continue
        variants = sorted({r[0] for r in rows})
        mu = {v: 0.0 for v in variants}
        beta = {n: 0.0 for n in node_names}
        for _ in range(200):  # alternating least squares on the additive model (converges fast)
            for v in variants:
                ys = [y - beta[n] for vv, n, y, _, _ in rows if vv == v]
                mu[v] = sum(ys) / len(ys)
            for n in node_names:
                ys = [y - mu[v] for v, nn, y, _, _ in rows if nn == n]
                beta[n] = sum(ys) / len(ys)
            center = sum(beta[r[1]] for r in rows) / len(rows)
            beta = {n: b - center for n, b in beta.items()}
        means = {v: sum(y for vv, _, y, _, _ in rows if vv == v) / sum(1 for r in rows if r[0] == v) for v in variants}
        ss0 = sum((y - means[v]) ** 2 for v, _, y, _, _ in rows)
        ss1 = sum((y - mu[v] - beta[n]) ** 2 for v, n, y, _, _ in rows)
        df1, df2 = len(node_names) - 1, len(rows) - len(variants) - len(node_names) + 1
        label = level_label(level)
        if df2 < 1 or ss1 <= 0:
            lines.append(f"{label}: node effects not testable ({len(rows)} starts on {len(node_names)} nodes), "
                         "not removed")
            continue
        p = float(special.fdtrc(df1, df2, ((ss0 - ss1) / df1) / (ss1 / df2)))
        spread = math.exp(max(beta.values()) - min(beta.values())) - 1
        if p >= NODE_P:
            lines.append(f"{label}: no node effect (F test p = {p:.2f}), not removed")
            continue
        lines.append(f"{label}: node effects up to {spread:.1%} (F test p = {p:.3f}), removed before comparing")
        for _v, n, _y, k, i in rows:
            out[k][i] = [x * math.exp(-beta[n]) for x in out[k][i]]
        for n, b in beta.items():
            f = math.exp(b)
            if abs(math.log(f)) > abs(math.log(factors.get(n, 1.0))):
                factors[n] = f
    return out, factors, lines
