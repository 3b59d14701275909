"""A `[[claim]]` entry as a user wrote it: a figure somebody believes, and how they got it.

Claims are checked (truthput.analyze.claims) against a run's measurements and against physics, so
the model keeps what the user said (text, figure, method, conditions) and nothing inferred.

    [[claim]]
    text = "+107% single-stream with spec-tokens 1 over no-spec"
    figure = { value = 107, unit = "%" }
    method = "counter"
    conditions = { kind = "speedup", concurrency = 1, spec_tokens = 1, baseline_spec_tokens = 0 }
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from truthput.errors import InputError

ClaimMethod = Literal["counter", "usage", "words", "log_line", "unknown"]
ClaimKind = Literal["throughput", "speedup", "ceiling", "log_overcount"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ClaimFigure(_Strict):
    """The number claimed: tok/s for throughput and ceilings, % (or x) for a speedup."""

    value: float
    unit: Literal["tok/s", "%", "x"] = "tok/s"


class ClaimConditions(_Strict):
    """Where the figure applies. Unset fields match anything in the run."""

    kind: ClaimKind = "throughput"
    variant: str | None = None
    concurrency: int | None = Field(default=None, ge=1)
    spec_tokens: int | None = Field(default=None, ge=0)  # 0 = no speculation
    baseline: str | None = None  # speedup: the variant compared against
    baseline_spec_tokens: int | None = Field(default=None, ge=0)
    stat: Literal["mean", "peak"] = "mean"  # a log-line "peak" is not a mean
    # a ceiling claim may state its own physics: weights read per step and memory bandwidth
    weights_gb: float | None = Field(default=None, gt=0)
    bandwidth_tb_s: float | None = Field(default=None, gt=0)


class Claim(_Strict):
    text: str
    figure: ClaimFigure
    method: ClaimMethod = "unknown"
    conditions: ClaimConditions = Field(default_factory=ClaimConditions)
    id: str | None = None
    source: str | None = None  # where the user read it (a notes file, an issue)

    @field_validator("text")
    @classmethod
    def _text(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("text must not be empty")
        return v


def parse_claims(entries: list[dict[str, Any]], where: str = "[[claim]]") -> list[Claim]:
    """Validate raw `[[claim]]` tables; a bad one raises InputError naming its position and key."""
    out = []
    for i, raw in enumerate(entries):
        try:
            out.append(Claim.model_validate(raw))
        except ValidationError as exc:
            err = exc.errors()[0]
            loc = ".".join(str(x) for x in err["loc"])
            raise InputError(f"{where} #{i + 1} ({raw.get('text', '?')!r}): {loc}: {err['msg']}") from None
    return out


def load_claims_file(path: str) -> tuple[list[Claim], dict[str, Any]]:
    """Claims from a TOML file (a claims file or an experiment file), and its optional [bounds] table."""
    import tomllib

    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError:
        raise InputError(f"{path}: no such claims file") from None
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"{path}: not valid TOML: {exc}") from None
    entries = data.get("claim", [])
    if not isinstance(entries, list) or not entries:
        raise InputError(f"{path}: no [[claim]] entries")
    bounds = data.get("bounds", {})
    if not isinstance(bounds, dict):
        raise InputError(f"{path}: [bounds] must be a table")
    return parse_claims(entries, where=f"{path}: [[claim]]"), bounds
