"""The search: rank the space on the simulator, measure only the best on the real server.

One decision per question lives here, shared by `truthput tune` and the search benchmark:
- `objective_value` / `feasible`: what a configuration scores and whether it meets the constraints;
- `Correction`: how far the real server is from the simulator, learnt from every real measurement
  (a ridge fit of log(real / simulated) on the configuration's features, so a model-form error that
  grows with, say, the batch size is learnt as such, not as one scale factor);
- `SimFirst.next_candidates`: the unmeasured configurations with the best corrected predictions,
  skipping those next to a configuration that failed to start on the real server;
- `SimFirst.done`: stop when no unmeasured configuration's corrected prediction, at its upper
  bound (2 sd of the correction's leave-one-out error), beats the best real measurement;
- `spearman`: how well the simulator's ranking matched the real one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from truthput.experiment.file import TuneSection
from truthput.tune.space import Space

#: A configuration this many grid steps (or fewer) from one that failed to start on the server is not
#: proposed: one value up or down in one dimension.
FAILURE_STEPS = 1
PRIOR_LOG_SD = 0.15  # the simulator's error before any real measurement: about +-35% at 2 sd
RIDGE = 1.0


@dataclass
class Evaluation:
    """One configuration's figures from one source (the simulator, or the real server's counter)."""

    config: dict[str, Any]
    source: str
    ok: bool
    values: list[float] = field(default_factory=list)
    """The objective's figure per server start: the counter's tok/s; for goodput the output tok/s
    of requests that met the SLOs; for tok/s per watt the counter's tokens per joule."""
    ttft_p99_s: float | None = None
    itl_p99_s: float | None = None
    failure: str | None = None
    reason: str = ""
    starts: int = 0
    server_s: float = 0.0

    @property
    def mean(self) -> float | None:
        """Geometric mean over starts (the verdict's scale: per-start means of log tok/s); the plain
        mean where a start scored zero (goodput when no request met the SLOs)."""
        vals = [float(v) for v in self.values if v is not None]
        if not self.ok or not vals:
            return None
        if min(vals) > 0:
            return math.exp(sum(math.log(v) for v in vals) / len(vals))
        return sum(vals) / len(vals)

    def to_dict(self) -> dict[str, Any]:
        return {"config": self.config, "source": self.source, "ok": self.ok, "values": self.values,
                "ttft_p99_s": self.ttft_p99_s, "itl_p99_s": self.itl_p99_s, "failure": self.failure,
                "reason": self.reason, "starts": self.starts, "server_s": self.server_s}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Evaluation":
        d = {**d, "values": d["values"] if "values" in d else d.get("tokps", [])}
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})


_OBJECTIVES = {  # objective -> (verdict metric, the figure's name in every view, the `sim batch` field)
    "tokps": ("tok/s", "tok/s", "tokps"),
    "pareto": ("tok/s", "tok/s", "tokps"),
    "goodput": ("goodput", "goodput tok/s", "goodput"),
    "tokps_per_watt": ("tok/s/W", "tok/s per W", "tokps_per_w"),
}


def objective_metric(tune: TuneSection) -> str:
    """The verdict metric the objective is decided on (`truthput.analyze.decide`)."""
    return _OBJECTIVES[tune.objective][0]


def objective_figure(tune: TuneSection) -> str:
    """How the objective's figure is named in every view."""
    return _OBJECTIVES[tune.objective][1]


def screen_field(tune: TuneSection) -> str:
    """The field of a `sim batch` result that holds the objective's figure per start."""
    return _OBJECTIVES[tune.objective][2]


def feasible(e: Evaluation, tune: TuneSection) -> bool:
    """Started, measured, and inside the latency constraints."""
    if not e.ok or e.mean is None:
        return False
    if tune.ttft_p99_ms is not None and e.ttft_p99_s is not None and e.ttft_p99_s * 1000 > tune.ttft_p99_ms:
        return False
    if tune.itl_p99_ms is not None and e.itl_p99_s is not None and e.itl_p99_s * 1000 > tune.itl_p99_ms:
        return False
    return True


def objective_value(e: Evaluation, tune: TuneSection) -> float:
    """What the search maximises: tok/s, or 0 for a configuration that failed or broke a constraint
    (a result the search learns from, not a gap)."""
    return float(e.mean or 0.0) if feasible(e, tune) else 0.0


def pareto_front(evals: Sequence[Evaluation], tune: TuneSection) -> list[Evaluation]:
    """Feasible configurations no other beats on both tok/s (higher) and p99 ITL (lower)."""
    from truthput.analyze.pareto import pareto_front as front_indices

    pts = [e for e in evals if feasible(e, tune) and e.itl_p99_s is not None]
    idx = front_indices([(e.itl_p99_s or 0.0, e.mean or 0.0) for e in pts])
    return sorted((pts[i] for i in idx), key=lambda e: e.itl_p99_s or 0.0)


def spearman(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Rank correlation of two equally long series (None below three pairs)."""
    if len(xs) < 3:
        return None
    from scipy.stats import spearmanr

    rho = spearmanr(xs, ys).statistic
    return None if rho is None or not math.isfinite(float(rho)) else float(rho)


class Correction:
    """log(real / simulated) as a ridge regression on the configuration's features."""

    def __init__(self, space: Space) -> None:
        self.space = space
        self.intercept = 0.0
        self.weights: np.ndarray | None = None
        self.sd = PRIOR_LOG_SD
        self.n = 0

    def fit(self, pairs: Sequence[tuple[dict[str, Any], float, float]]) -> None:
        """Pairs of (config, simulated tok/s, real tok/s), both measured and positive."""
        pts = [(c, s, r) for c, s, r in pairs if s > 0 and r > 0]
        self.n = len(pts)
        if not pts:
            self.intercept, self.weights, self.sd = 0.0, None, PRIOR_LOG_SD
            return
        y = np.array([math.log(r / s) for _, s, r in pts])
        x = np.array([self.space.features(c) for c, _, _ in pts], dtype=float)
        xm = x.mean(axis=0)
        ym = float(y.mean())
        xc = x - xm
        inverse = np.linalg.inv(xc.T @ xc + RIDGE * np.eye(x.shape[1]))
        w = inverse @ xc.T @ (y - ym)
        self.weights = w
        self.intercept = ym - float(xm @ w)
        resid = y - (self.intercept + x @ w)
        if len(pts) >= 3:
            # the error at a configuration not measured, not the scatter about a fit that saw every
            # point: leave-one-out residuals (ridge's hat matrix, the mean's share included)
            leverage = 1.0 / len(pts) + np.einsum("ij,jk,ik->i", xc, inverse, xc)
            loo = resid / np.maximum(1.0 - leverage, 1e-3)
            self.sd = max(0.02, float(np.sqrt((loo ** 2).mean())))
        else:  # too few to judge the fit's error: shrink the prior by what was seen
            self.sd = max(0.05, PRIOR_LOG_SD / math.sqrt(len(pts) + 1))

    def factor(self, config: dict[str, Any]) -> float:
        if self.weights is None:
            return math.exp(self.intercept)
        return math.exp(self.intercept + float(np.array(self.space.features(config)) @ self.weights))


@dataclass
class Candidate:
    config: dict[str, Any]
    predicted: float
    """Corrected prediction (simulator x correction)."""
    simulated: float


def _same(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return all(abs(x - y) <= 1e-3 * max(abs(x), abs(y), 1e-12) for x, y in zip(a, b))


class SimFirst:
    """The state of a simulator-first search: simulated and real evaluations keyed by config."""

    def __init__(self, space: Space, tune: TuneSection) -> None:
        self.space = space
        self.tune = tune
        self.sim: dict[str, Evaluation] = {}
        self.real: dict[str, Evaluation] = {}
        self.correction = Correction(space)
        self.incumbent: str | None = None
        """The baseline's key: measured beside every round, never proposed."""

    def add_sim(self, e: Evaluation) -> None:
        self.sim[self.space.key(e.config)] = e

    def add_real(self, e: Evaluation) -> None:
        self.real[self.space.key(e.config)] = e
        pairs = []
        for k, r in self.real.items():
            s = self.sim.get(k)
            if s is not None and s.mean and r.mean and feasible(s, self.tune):
                pairs.append((r.config, s.mean, r.mean))
        self.correction.fit(pairs)

    def _near_failure(self, config: dict[str, Any]) -> bool:
        """One grid step or less from a configuration that failed to start on the server."""
        return any(not r.ok and self.space.steps(r.config, config) <= FAILURE_STEPS for r in self.real.values())

    def ranked(self) -> list[Candidate]:
        """Every simulated, feasible configuration by corrected prediction, best first."""
        out = []
        for k, e in self.sim.items():
            if not feasible(e, self.tune):
                continue
            sim_v = float(e.mean or 0.0)
            out.append(Candidate(e.config, sim_v * self.correction.factor(e.config), sim_v))
        out.sort(key=lambda c: -c.predicted)
        return out

    def _signature(self, key: str) -> tuple[float, float] | None:
        e = self.sim.get(key)
        return (float(e.mean or 0.0), float(e.itl_p99_s or 0.0)) if e is not None else None

    def next_candidates(self, k: int, exclude: Callable[[dict[str, Any]], bool] | None = None) -> list[Candidate]:
        """The best `k` unmeasured candidates. One the simulator cannot tell from a configuration
        already measured or picked (the same tok/s and p99 ITL to 0.1%: a flag that changes nothing
        at this load, such as --max-num-seqs above the concurrency) is left for later: measuring it
        would spend server time on what is known."""
        out: list[Candidate] = []
        seen = [sig for sig in (self._signature(k) for k in self.real) if sig is not None]
        later: list[Candidate] = []
        for c in self.ranked():
            key = self.space.key(c.config)
            if key in self.real or key == self.incumbent or self._near_failure(c.config) \
                    or (exclude and exclude(c.config)):
                continue
            sig = self._signature(key)
            if sig is not None and any(_same(sig, o) for o in seen):
                later.append(c)
                continue
            out.append(c)
            if sig is not None:
                seen.append(sig)
            if len(out) >= k:
                return out
        return out + later[:k - len(out)]

    def best_real(self) -> Evaluation | None:
        ok = [e for e in self.real.values() if feasible(e, self.tune)]
        return max(ok, key=lambda e: e.mean or 0.0) if ok else None

    def done(self) -> bool:
        """No unmeasured configuration could still beat the best real one (at 2 sd of the correction)."""
        best = self.best_real()
        if best is None:
            return False
        nxt = self.next_candidates(1)
        if not nxt:
            return True
        return nxt[0].predicted * math.exp(2 * self.correction.sd) < (best.mean or 0.0)

    def rank_agreement(self) -> tuple[float | None, int]:
        """Spearman's rho between simulated and real tok/s over the configurations measured on both."""
        xs, ys = [], []
        for k, r in self.real.items():
            s = self.sim.get(k)
            if s is not None and s.mean and r.mean:
                xs.append(s.mean)
                ys.append(r.mean)
        return spearman(xs, ys), len(xs)
