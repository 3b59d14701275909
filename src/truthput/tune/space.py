"""The search space of `truthput tune`: configurations as parsed-argv edits of the baseline.

A configuration is a mapping flag -> value, one entry per `[[tune.param]]`. It becomes a variant
(`set`/`remove` on the baseline's argv) exactly as a hand-written `[[variant]]` does, so every
configuration the search proposes is checked and applied by the one argv model.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any

from truthput.errors import InputError
from truthput.experiment.argv import ServerArgv, speculative_settings, variant_argv
from truthput.experiment.file import TuneParam, TuneSection, VariantSection

OFF = "off"
DEFAULT = "default"
"""A baseline's value for a flag it does not give (the server's own default): never set."""
SPECULATIVE_CONFIG = "--speculative-config"
GRID_LIMIT = 100_000


def _range_values(p: TuneParam) -> list[Any] | None:
    """The grid of a stepped range (None for a continuous one)."""
    assert p.low is not None and p.high is not None
    if p.step is None:
        return None
    n = int(math.floor((p.high - p.low) / p.step + 1e-9)) + 1
    vals = [p.low + i * p.step for i in range(n)]
    integral = all(float(x).is_integer() for x in (p.low, p.high, p.step))
    return [int(round(v)) if integral else round(v, 10) for v in vals]


@dataclass(frozen=True)
class Space:
    """The params of a [tune] section, in file order."""

    params: tuple[TuneParam, ...]

    @classmethod
    def of(cls, tune: TuneSection) -> "Space":
        return cls(tuple(tune.param))

    @property
    def flags(self) -> list[str]:
        return [p.flag for p in self.params]

    def choices(self, p: TuneParam) -> list[Any] | None:
        return list(p.values) if p.values is not None else _range_values(p)

    def size(self) -> int | None:
        """Configurations in the space; None when a range is continuous."""
        n = 1
        for p in self.params:
            c = self.choices(p)
            if c is None:
                return None
            n *= len(c)
        return n

    def grid(self) -> list[dict[str, Any]]:
        """Every configuration, in the file's order (the last param varies fastest)."""
        lists = [self.choices(p) for p in self.params]
        if any(c is None for c in lists):
            raise InputError("[tune]: a continuous range (low/high without step) has no grid")
        if (self.size() or 0) > GRID_LIMIT:
            raise InputError(f"[tune]: the space has {self.size():,} configurations; more than {GRID_LIMIT:,} cannot be "
                            "listed (the search samples it instead)")
        return [dict(zip(self.flags, combo)) for combo in itertools.product(*lists)]  # type: ignore[arg-type]

    def contains(self, config: dict[str, Any]) -> bool:
        """Whether every value is one of the space's (a baseline may lie outside it)."""
        for p in self.params:
            v = config.get(p.flag)
            ch = self.choices(p)
            if ch is not None:
                if v not in ch:
                    return False
            elif not isinstance(v, (int, float)) or not (p.low or 0) <= v <= (p.high or 0):
                return False
        return True

    def distributions(self) -> dict[str, Any]:
        """optuna distributions, one per flag (choices as categorical, ranges as numbers)."""
        import optuna

        out: dict[str, Any] = {}
        for p in self.params:
            if p.values is not None:
                out[p.flag] = optuna.distributions.CategoricalDistribution(list(p.values))
            elif p.step is not None and all(float(x or 0).is_integer() for x in (p.low, p.high, p.step)):
                out[p.flag] = optuna.distributions.IntDistribution(int(p.low or 0), int(p.high or 0),
                                                                   step=int(p.step))
            elif p.step is not None:
                out[p.flag] = optuna.distributions.FloatDistribution(float(p.low or 0), float(p.high or 0),
                                                                     step=float(p.step))
            else:
                out[p.flag] = optuna.distributions.FloatDistribution(float(p.low or 0), float(p.high or 0), log=p.log)
        return out

    def features(self, config: dict[str, Any]) -> list[float]:
        """A numeric encoding for the simulator's correction model: numbers scaled to [0, 1] (log
        where the range spans more than 4x), choices one-hot ("off" is a choice of its own)."""
        out: list[float] = []
        for p in self.params:
            v = config.get(p.flag)
            ch = self.choices(p)
            numeric = ch is not None and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in ch)
            if p.values is None or numeric:
                lo = float(p.low if p.low is not None else min(ch or [0]))
                hi = float(p.high if p.high is not None else max(ch or [1]))
                x = float(v) if isinstance(v, (int, float)) else lo
                if lo > 0 and hi / lo > 4:
                    lo, hi, x = math.log(lo), math.log(hi), math.log(max(x, 1e-12))
                out.append((x - lo) / (hi - lo) if hi > lo else 0.0)
            else:
                out.extend(1.0 if v == c else 0.0 for c in ch or [])
        return out

    def steps(self, a: dict[str, Any], b: dict[str, Any]) -> float:
        """How many grid steps apart two configurations are (a changed choice is one step; a
        continuous range counts tenths of its span)."""
        n = 0.0
        for p in self.params:
            va, vb = a.get(p.flag), b.get(p.flag)
            if va == vb:
                continue
            ch = self.choices(p)
            numeric = ch is not None and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in ch)
            if ch is not None and va in ch and vb in ch and numeric:
                n += abs(ch.index(va) - ch.index(vb))
            elif ch is None and isinstance(va, (int, float)) and isinstance(vb, (int, float)):
                n += abs(va - vb) / (float(p.high or 0) - float(p.low or 0)) * 10
            else:
                n += 1
        return n

    def label(self, config: dict[str, Any]) -> str:
        """A variant name that says what it sets: "max-num-seqs=16,spec-tokens=off"."""
        return ",".join(f"{f.lstrip('-')}={_show(config.get(f))}" for f in self.flags)

    def variant(self, base: ServerArgv, config: dict[str, Any], name: str | None = None) -> VariantSection:
        """The configuration as a variant of the baseline (checked against its argv)."""
        settings: dict[str, Any] = {}
        remove: list[str] = []
        for p in self.params:
            v = config[p.flag]
            if v == DEFAULT:
                continue
            if v == OFF:
                if base.knowledge.is_spec_flag(base.knowledge.canonical(p.flag)):
                    # speculation off: the whole speculative config goes, in whichever form it is spelt
                    if speculative_settings(base) is not None and SPECULATIVE_CONFIG not in remove:
                        remove.append(SPECULATIVE_CONFIG)
                elif (base.has(p.flag) or base.has("--no-" + p.flag[2:])) and p.flag not in remove:
                    remove.append(p.flag)
                continue
            settings.update(p.with_)
            settings[p.flag] = v
        spec_removed = any(base.knowledge.is_spec_flag(base.knowledge.canonical(f)) for f in remove)
        if spec_removed:  # speculation is off: its companions go too
            settings = {k: v for k, v in settings.items() if not base.knowledge.is_spec_flag(base.knowledge.canonical(k))}
        name = name or self.label(config)
        variant_argv(base, settings, remove, where=f"[tune] configuration {name!r}")  # refuse early
        return VariantSection(name=name, set=settings, remove=remove,
                              description="a configuration proposed by truthput tune")

    def key(self, config: dict[str, Any]) -> str:
        """A stable identity of a configuration (for resuming and for matching real and simulated)."""
        return self.label(config)


def _show(v: Any) -> str:
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v).replace("[", "(").replace("]", ")")  # a variant name holds no [ ] (terminal markup)
