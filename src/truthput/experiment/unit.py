"""systemd units in and out: read a server's unit, write the winner back as one.

Users keep their inference server in a systemd unit. `parse_unit` reads one keeping every section,
key, comment and blank line in order, so that `render_unit` can write the same file back with only
ExecStart (and, on request, Environment=, Description=, Restart=) changed. `Unit.exec_start_argv`
applies systemd's own rules (systemd.syntax(7), systemd.service(5)): backslash line continuations,
single/double quotes, C escapes, `%` specifiers, `$VAR` / `${VAR}` from Environment=, `$$` -> `$`.
`render_unit` escapes in the opposite direction so systemd reads back exactly the argv given.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from truthput.errors import InputError

# ExecStart= may begin with these prefixes (systemd.service(5), "Table 1").
_EXEC_PREFIX = re.compile(r"^[-@:+!]*")
_WHITESPACE = " \t\n\r"  # systemd's WHITESPACE: other Unicode spaces are word characters
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_SIMPLE_WORD = re.compile(r"[A-Za-z0-9_@%+=:,./-]+")
_C_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v",
              "\\": "\\", '"': '"', "'": "'", "s": " ", " ": " "}  # fmt: skip


@dataclass
class UnitEntry:
    """One logical line of a unit file: a `Key=value` setting, a comment, or a blank line.

    `raw` is the physical text (several lines for a continued setting, newline-terminated) and is
    what `Unit.text()` writes back, so an untouched file renders byte for byte.
    """

    raw: str
    key: str | None = None
    value: str | None = None  # continuation lines joined as systemd joins them


@dataclass
class UnitSection:
    name: str
    header: str  # the "[Service]\n" line as written
    entries: list[UnitEntry] = field(default_factory=list)

    def values(self, key: str) -> list[str]:
        return [e.value or "" for e in self.entries if e.key == key]


@dataclass
class Unit:
    """A parsed unit file. `path` is where it came from (for messages and specifiers like %n)."""

    path: str | None
    preamble: list[UnitEntry]
    sections: list[UnitSection]

    # ------------------------------------------------------------------ reading
    @property
    def where(self) -> str:
        return self.path or "<unit>"

    @property
    def name(self) -> str | None:
        return os.path.basename(self.path) if self.path else None

    def section(self, name: str) -> UnitSection | None:
        for s in self.sections:
            if s.name == name:
                return s
        return None

    def get(self, section: str, key: str) -> str | None:
        """The effective (last) value of a key, or None when absent."""
        s = self.section(section)
        values = s.values(key) if s else []
        return values[-1] if values else None

    def text(self) -> str:
        parts = [e.raw for e in self.preamble]
        for s in self.sections:
            parts.append(s.header)
            parts.extend(e.raw for e in s.entries)
        return "".join(parts)

    def exec_start_value(self) -> str:
        """The one effective ExecStart= value (an empty ExecStart= resets the list, as in systemd)."""
        service = self.section("Service")
        if service is None:
            raise InputError(f"{self.where}: no [Service] section, so no ExecStart= to run")
        effective: list[str] = []
        for value in service.values("ExecStart"):
            if value.strip():
                effective.append(value)
            else:
                effective = []
        if not effective:
            raise InputError(f"{self.where}: [Service] has no ExecStart=")
        if len(effective) > 1:
            raise InputError(
                f"{self.where}: [Service] has {len(effective)} ExecStart= lines; truthput runs one server command"
            )
        return effective[0]

    def exec_start_prefix(self) -> str:
        """Special prefixes of ExecStart= ("-", "@", "+", "!", "!!", ":"), kept when re-rendering."""
        value = self.exec_start_value().lstrip()
        match = _EXEC_PREFIX.match(value)
        return match.group(0) if match else ""

    def exec_start_argv(self) -> list[str]:
        """ExecStart= as the argv systemd would pass to execve()."""
        value = self.exec_start_value().lstrip()
        prefix = self.exec_start_prefix()
        words = split_words(value[len(prefix) :], f"{self.where}: ExecStart=")
        words = [self._specifiers(w) for w in words]
        if ":" in prefix:  # ":" disables environment variable substitution
            return words
        return _expand_env(words, self.environment())

    def environment(self) -> dict[str, str]:
        """Environment= assignments in order (several per line, quoted); an empty one resets."""
        env: dict[str, str] = {}
        service = self.section("Service")
        for value in service.values("Environment") if service else []:
            if not value.strip():
                env = {}
                continue
            for word in split_words(value, f"{self.where}: Environment="):
                word = self._specifiers(word)
                name, eq, val = word.partition("=")
                if not eq or not name:
                    raise InputError(f"{self.where}: Environment=: expected NAME=VALUE, got {word!r}")
                env[name] = val
        return env

    def environment_files(self) -> list[str]:
        """EnvironmentFile= paths (a leading "-" means optional). Their contents are not read."""
        service = self.section("Service")
        return [v.strip() for v in (service.values("EnvironmentFile") if service else []) if v.strip()]

    def unresolved_variables(self) -> list[str]:
        """The $VARs ExecStart= uses that no Environment= line (or script assignment) sets."""
        try:
            value = self.exec_start_value()
        except InputError:
            return []
        env = self.environment()
        return sorted({ref for ref in re.findall(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)", value.replace("$$", ""))
                       if ref not in env})

    def address_variables(self) -> set[str]:
        """The $VARs ExecStart= uses only as the value of --host or --port: truthput sets both on
        every start itself, so such a variable needs no value here."""
        try:
            words = split_words(self.exec_start_value(), self.where)
        except InputError:
            return set()
        pattern = r"\$\{?([A-Za-z_][A-Za-z0-9_]*)"
        address: set[str] = set()
        other: set[str] = set()
        for i, word in enumerate(words):
            refs = set(re.findall(pattern, word.replace("$$", "")))
            head = word.split("=", 1)[0]
            is_address = (head in ("--host", "--port") and "=" in word) or (i > 0 and words[i - 1] in ("--host", "--port"))
            (address if is_address else other).update(refs)
        return address - other

    def notes(self) -> list[str]:
        """What truthput could not resolve from the unit alone (shown by `truthput import`)."""
        notes = [
            f"{self.where}: EnvironmentFile={path} is not read; variables it sets are not in [server].env"
            for path in self.environment_files()
        ]
        try:
            value = self.exec_start_value()
        except InputError:
            return notes
        for word in split_words(value, self.where):
            for m in re.finditer(r"%(.)", word.replace("%%", "")):
                if self._specifier_value(m.group(1)) is None:
                    notes.append(f"{self.where}: ExecStart= specifier %{m.group(1)} is kept literally (not known here)")
        env, address = self.environment(), self.address_variables()
        for ref in sorted(set(re.findall(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)", value.replace("$$", "")))):
            if ref in address and ref not in env:
                notes.append(f"{self.where}: ExecStart= uses ${ref} for the server's address, which truthput sets on "
                             "every start itself")
            elif ref not in env:
                notes.append(f"{self.where}: ExecStart= uses ${ref}, which no Environment= line sets; kept literally")
        return notes

    # ------------------------------------------------------------------ specifiers
    def _specifier_value(self, letter: str) -> str | None:
        user = self.get("Service", "User")
        if letter == "u":  # the unit's User=, else the system manager's user
            return user or "root"
        if letter in ("h", "U", "s") and user in (None, "root", "0"):
            return {"h": "/root", "U": "0", "s": "/bin/sh"}[letter]
        name = self.name
        if name is None:
            return None
        stem, _, _suffix = name.rpartition(".")
        prefix, at, instance = stem.partition("@")
        known = {
            "n": name,
            "N": stem,
            "p": prefix,
            "P": _unescape_unit(prefix),
            "i": instance if at else "",
            "I": _unescape_unit(instance) if at else "",
            "j": prefix.rsplit("-", 1)[-1],
            "J": _unescape_unit(prefix.rsplit("-", 1)[-1]),
            "f": "/" + (_unescape_unit(instance) if at and instance else _unescape_unit(prefix)),
        }
        return known.get(letter)

    def _specifiers(self, word: str) -> str:
        def sub(m: re.Match[str]) -> str:
            letter = m.group(1)
            if letter == "%":
                return "%"
            value = self._specifier_value(letter)
            return m.group(0) if value is None else value

        return re.sub(r"%(.)", sub, word)


def _unescape_unit(text: str) -> str:
    """systemd-escape's inverse for unit names: "-" is "/", "\\xNN" is a byte."""
    text = text.replace("-", "/")
    return re.sub(r"\\x([0-9a-fA-F]{2})", lambda m: chr(int(m.group(1), 16)), text)


def split_words(text: str, where: str) -> list[str]:
    """Split like systemd's extract_first_word(EXTRACT_UNQUOTE | EXTRACT_CUNESCAPE).

    Whitespace separates words; '...' and "..." group (anywhere in a word); backslash escapes are
    C escapes (\\n, \\t, \\\\, \\", \\', \\xNN, ...), inside quotes too.
    """
    words: list[str] = []
    current: list[str] = []
    in_word = False
    quote: str | None = None
    i = 0
    n = len(text)
    while i < n:
        c = text[i]
        if c == "\\":
            if i + 1 >= n:
                raise InputError(f"{where}: ends with a lone backslash")
            nxt = text[i + 1]
            if nxt == "x" and i + 3 < n + 1 and re.fullmatch(r"[0-9a-fA-F]{2}", text[i + 2 : i + 4]):
                current.append(chr(int(text[i + 2 : i + 4], 16)))
                i += 4
            elif nxt in "uU" and re.fullmatch(r"[0-9a-fA-F]{%d}" % (4 if nxt == "u" else 8), text[i + 2 : i + (6 if nxt == "u" else 10)]):
                width = 4 if nxt == "u" else 8
                current.append(chr(int(text[i + 2 : i + 2 + width], 16)))
                i += 2 + width
            elif nxt in "01234567" and re.fullmatch(r"[0-7]{3}", text[i + 1 : i + 4]):
                current.append(chr(int(text[i + 1 : i + 4], 8)))
                i += 4
            elif nxt in _C_ESCAPES:
                current.append(_C_ESCAPES[nxt])
                i += 2
            elif nxt == ";":
                current.append(";")  # "\;" is a literal semicolon, not a command separator
                i += 2
            else:
                raise InputError(f"{where}: unknown escape \\{nxt}")
            in_word = True
            continue
        if quote is not None:
            if c == quote:
                quote = None
            else:
                current.append(c)
            i += 1
            continue
        if c in "'\"":
            quote = c
            in_word = True
        elif c in _WHITESPACE:
            if in_word:
                words.append("".join(current))
                current = []
                in_word = False
        else:
            current.append(c)
            in_word = True
        i += 1
    if quote is not None:
        raise InputError(f"{where}: unterminated {quote} quote")
    if in_word:
        words.append("".join(current))
    return words


def _expand_env(words: list[str], env: Mapping[str, str]) -> list[str]:
    """systemd's variable substitution at exec time: "$VAR" alone splits into words, "${VAR}"
    substitutes in place, "$$" is "$". Unknown variables are kept literally (see Unit.notes)."""
    out: list[str] = []
    for word in words:
        whole = re.fullmatch(r"\$([A-Za-z_][A-Za-z0-9_]*)", word)
        if whole:
            name = whole.group(1)
            if name in env:
                out.extend(env[name].split())
            else:
                out.append(word)
            continue

        def sub(m: re.Match[str]) -> str:
            if m.group(0) == "$$":
                return "$"
            name = m.group(1)
            return env[name] if name in env else m.group(0)

        out.append(re.sub(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)\}", sub, word))
    return out


# ---------------------------------------------------------------------- parsing


def parse_unit(text: str, path: str | None = None) -> Unit:
    """Parse a unit file, keeping sections, keys, order, comments and layout."""
    where = path or "<unit>"
    lines = text.split("\n")  # systemd splits on newlines only (not on \x1e, \u2028, ...)
    lines = [line + "\n" for line in lines[:-1]] + ([lines[-1]] if lines[-1] else [])
    preamble: list[UnitEntry] = []
    sections: list[UnitSection] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        target = sections[-1].entries if sections else preamble
        if not stripped or stripped[0] in "#;":
            target.append(UnitEntry(raw=line))
            i += 1
            continue
        if stripped.startswith("["):
            if not stripped.endswith("]"):
                raise InputError(f"{where}:{i + 1}: malformed section header {stripped!r}")
            sections.append(UnitSection(name=stripped[1:-1], header=line))
            i += 1
            continue
        if not sections:
            raise InputError(f"{where}:{i + 1}: setting {stripped!r} outside any [Section]")
        start = i
        logical = line.rstrip("\r\n")
        # a line ending in a backslash continues; comment lines inside are skipped (systemd >= 240)
        while logical.endswith("\\") and i + 1 < len(lines):
            i += 1
            nxt = lines[i].rstrip("\r\n")
            if nxt.lstrip()[:1] in ("#", ";"):
                continue
            logical = logical[:-1] + " " + nxt
        if logical.endswith("\\"):
            logical = logical[:-1]
        i += 1
        key, eq, value = logical.partition("=")
        if not eq:
            raise InputError(f"{where}:{start + 1}: expected Key=value, got {stripped!r}")
        target.append(UnitEntry(raw="".join(lines[start:i]), key=key.strip(), value=value.strip()))
    if text and not text.endswith("\n") and (sections or preamble):
        last = sections[-1].entries if sections and sections[-1].entries else preamble
        if last:
            last[-1].raw += "\n"  # render always ends with a newline
    return Unit(path=path, preamble=preamble, sections=sections)


# ---------------------------------------------------------------------- rendering


def quote_word(word: str, dollars: bool = True) -> str:
    """One argv word written so that systemd reads back exactly `word` (after specifiers and
    variable substitution): "%" -> "%%", "$" -> "$$", quotes where needed. Environment= values
    get no "$" substitution from systemd, so they are written with dollars=False."""
    if "\x00" in word:
        raise InputError(f"argument {word!r} contains a NUL byte, which no command line can carry")
    escaped = word.replace("%", "%%")
    if dollars:
        escaped = escaped.replace("$", "$$")
    if escaped and _SIMPLE_WORD.fullmatch(escaped):
        return escaped
    if escaped and "'" not in escaped and "\\" not in escaped and not _CONTROL.search(escaped):
        return f"'{escaped}'"
    body = escaped.replace("\\", "\\\\").replace('"', '\\"')
    body = _CONTROL.sub(lambda m: f"\\x{ord(m.group(0)):02x}", body)
    return f'"{body}"'


def _groups(argv: Sequence[str]) -> list[list[str]]:
    """Words grouped for line layout: the program (and positionals), then each flag with its values,
    with "--host H --port P" kept on one line as users write it."""
    groups: list[list[str]] = [[]]
    for i, word in enumerate(argv):
        is_flag = word.startswith("-") and len(word) > 1 and not re.match(r"^-\.?\d", word)
        program_part = i < 3 and (i == 0 or argv[i - 1] == "-m" or word == "-m")
        if is_flag and not program_part and groups[-1]:
            groups.append([word])
        else:
            groups[-1].append(word)
    merged: list[list[str]] = []
    for g in groups:
        if merged and g[0] == "--port" and merged[-1][0] == "--host":
            merged[-1] = merged[-1] + g
        else:
            merged.append(g)
    return merged


def render_exec_start(argv: Sequence[str], prefix: str = "") -> str:
    """`ExecStart=...` with one flag group per continued line, as the seed writes it."""
    if not argv:
        raise InputError("cannot write an empty ExecStart=")
    lines = [" ".join(quote_word(w) for w in g) for g in _groups(argv)]
    return "ExecStart=" + prefix + " \\\n  ".join(lines) + "\n"


def render_environment(env: Mapping[str, str]) -> str:
    """Environment= lines, one variable each, quoted when needed."""
    out = []
    for name, value in env.items():
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise InputError(f"environment variable name {name!r} is not valid for systemd")
        out.append("Environment=" + quote_word(f"{name}={value}", dollars=False) + "\n")
    return "".join(out)


def render_unit(
    unit: Unit,
    argv: Sequence[str],
    env: Mapping[str, str] | None = None,
    experiment_mode: bool = False,
    description: str | None = None,
) -> str:
    """The unit with ExecStart= set to `argv`, everything else kept as it was.

    env: replaces the Environment= lines (kept untouched when equal to the unit's).
    experiment_mode: Restart=no and no RestartSec=, so a server that dies (OOM) during a trial is
    a recorded failure, not a restart loop. description: replaces Description=.
    """
    service = unit.section("Service")
    if service is None:
        raise InputError(f"{unit.where}: no [Service] section to write ExecStart= into")
    argv = list(argv)
    unchanged_exec = argv == _safe_argv(unit)
    prefix = unit.exec_start_prefix() if _has_exec(unit) else ""
    new_entries: list[UnitEntry] = []
    exec_written = False
    rewrite_env = env is not None and dict(env) != unit.environment()
    env_written = False
    for entry in service.entries:
        if entry.key == "ExecStart":
            if not exec_written:
                raw = entry.raw if unchanged_exec and len(service.values("ExecStart")) == 1 else render_exec_start(argv, prefix)
                new_entries.append(UnitEntry(raw=raw, key="ExecStart", value=None))
                exec_written = True
            continue
        if entry.key == "Environment" and rewrite_env:
            if not env_written:
                new_entries.append(UnitEntry(raw=render_environment(env or {}), key="Environment"))
                env_written = True
            continue
        if experiment_mode and entry.key == "RestartSec":
            continue
        if experiment_mode and entry.key == "Restart":
            new_entries.append(UnitEntry(raw="Restart=no\n", key="Restart", value="no"))
            continue
        new_entries.append(entry)
    if not exec_written:
        new_entries.insert(_insert_point(new_entries), UnitEntry(raw=render_exec_start(argv, prefix), key="ExecStart"))
    if rewrite_env and not env_written and env:
        at = next(i for i, e in enumerate(new_entries) if e.key == "ExecStart")
        new_entries.insert(at, UnitEntry(raw=render_environment(env), key="Environment"))
    if experiment_mode and not any(e.key == "Restart" for e in new_entries):
        new_entries.insert(_insert_point(new_entries), UnitEntry(raw="Restart=no\n", key="Restart", value="no"))
    parts = [e.raw for e in unit.preamble]
    for s in unit.sections:
        parts.append(s.header)
        entries = new_entries if s is service else s.entries
        if s.name == "Unit" and description is not None:
            entries = _with_description(entries, description)
        parts.extend(e.raw for e in entries)
    return "".join(parts)


def _has_exec(unit: Unit) -> bool:
    try:
        unit.exec_start_value()
    except InputError:
        return False
    return True


def _safe_argv(unit: Unit) -> list[str] | None:
    try:
        return unit.exec_start_argv()
    except InputError:
        return None


def _insert_point(entries: list[UnitEntry]) -> int:
    """After the last setting (before trailing blank lines / comments)."""
    at = len(entries)
    while at > 0 and entries[at - 1].key is None:
        at -= 1
    return at


def _with_description(entries: list[UnitEntry], description: str) -> list[UnitEntry]:
    line = UnitEntry(raw=f"Description={description}\n", key="Description", value=description)
    if "\n" in description:
        raise InputError("a unit Description= must be one line")
    out = [line if e.key == "Description" else e for e in entries]
    if not any(e.key == "Description" for e in entries):
        out.insert(0, line)
    return out


# ---------------------------------------------------------------------- consistency


def consistency_warnings(unit: Unit) -> list[str]:
    """Where the unit's Description= disagrees with its ExecStart= (speculative tokens, TP, model).

    The seed's Description says "MTP spec=5" while ExecStart says --spec-tokens 3: a label that
    lies is how an A/B gets misread, so `truthput import` says so.
    """
    from truthput.experiment.argv import ServerArgv, speculative_settings

    description = unit.get("Unit", "Description") or ""
    if not description or not _has_exec(unit):
        return []
    argv = ServerArgv.parse(unit.exec_start_argv())
    where = unit.where
    warnings: list[str] = []

    spec = speculative_settings(argv)
    tokens = spec.get("num_speculative_tokens") if spec else None
    for m in re.finditer(
        r"\b(?:spec(?:ulative)?(?:[-_ ]?tokens)?|mtp|draft(?:[-_ ]?tokens)?)\s*[=:]\s*(\d+)|\b(\d+)\s+spec(?:ulative)?[-_ ]tokens\b",
        description,
        re.IGNORECASE,
    ):
        said = int(m.group(1) or m.group(2))
        if tokens is None:
            warnings.append(f"{where}: Description says {m.group(0)!r} but ExecStart= has no speculative decoding")
        elif said != tokens:
            warnings.append(f"{where}: Description says {m.group(0)!r} but ExecStart= has --spec-tokens {tokens}")

    tp_value = argv.get("--tensor-parallel-size")
    tp = int(tp_value) if isinstance(tp_value, str) and tp_value.isdigit() else 1
    for m in re.finditer(r"\bTP\s*[=:]?\s*(\d+)\b", description, re.IGNORECASE):
        if int(m.group(1)) != tp:
            warnings.append(f"{where}: Description says {m.group(0)!r} but ExecStart= has --tensor-parallel-size {tp}")

    model = argv.model() or ""
    served = argv.get("--served-model-name")
    names = " ".join([model, *(served if isinstance(served, list) else [served or ""])])
    haystack = _normalise_name(_hub_name(model) + " " + names)
    if model:
        for m in re.finditer(r"\b(\d+(?:\.\d+)?)[Bb]\b", description):
            if _normalise_name(m.group(0)) not in haystack:
                warnings.append(f"{where}: Description says {m.group(0)!r} but the model is {model}")
        for m in re.finditer(r"\b(" + _MODEL_FAMILIES + r")[-_ ]?(\d+(?:\.\d+)?)", description, re.IGNORECASE):
            word = m.group(0)
            if _normalise_name(m.group(1) + m.group(2)) not in haystack:
                warnings.append(f"{where}: Description names {word!r} but the model is {model}")
    return warnings


# Model family names that, followed by a version, name a model in a Description= ("Qwen3.6",
# "Llama-3.1"); a word list keeps GPU names ("RTX3090", "GPU0") from being mistaken for models.
_MODEL_FAMILIES = (
    "qwen|llama|mistral|mixtral|gemma|phi|deepseek|glm|falcon|gpt|olmo|granite|internlm|baichuan|"
    "minimax|kimi|nemotron|smollm|codellama|starcoder|yi"
)


def _hub_name(path: str) -> str:
    """"…/models--org--Name/snapshots/…" -> "org/Name"; anything else unchanged."""
    m = re.search(r"models--([^/]+?)--([^/]+)", path)
    return f"{m.group(1)}/{m.group(2)}" if m else path


def _normalise_name(text: str) -> str:
    return re.sub(r"[^a-z0-9.]", "", text.lower())


# ---------------------------------------------------------------------- import

_SHELLS = ("sh", "bash", "dash", "zsh")
_SHELL_SYNTAX = re.compile(r"[;&|<>`()]|\$\(|\$\{?[A-Za-z_]")


def unwrap_shell(argv: list[str], where: str) -> tuple[list[str], dict[str, str], list[str]]:
    """`bash -c "exec VAR=1 vllm serve ..."` -> the server's own argv, so flags can be edited.

    Only a single simple command is unwrapped (leading NAME=value assignments become env, a
    leading `exec` is dropped); anything with shell syntax is kept as it is, with a note."""
    import shlex

    if len(argv) < 3 or os.path.basename(argv[0]) not in _SHELLS or argv[1] not in ("-c", "-lc", "-ec"):
        return argv, {}, []
    script = argv[2]
    if _SHELL_SYNTAX.search(script) or len(argv) > 3:
        return argv, {}, [
            f"{where} runs a shell script ({argv[0]} {argv[1]} ...); truthput cannot edit flags inside it. "
            "Write the server command directly in ExecStart= (absolute path to the venv's python or vllm)"
        ]
    words = shlex.split(script)
    env: dict[str, str] = {}
    while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    if words and words[0] == "exec":
        words.pop(0)
    if not words:
        return argv, {}, [f"{where}: the shell script runs no command"]
    return words, env, [f"{where}: unwrapped the {os.path.basename(argv[0])} -c script into the server's own command"]


def guess_engine(argv: Sequence[str]) -> str:
    """The [server].engine for a command: by the program it runs."""
    program = " ".join(argv[:3]).lower()
    if "sglang" in program:
        return "sglang"
    if "llama-server" in program or "llama-cpp-server" in program or "llama_cpp" in program:
        return "llamacpp"
    if "vllm" in program:
        return "vllm"
    return "command"



def _toml_str(value: str) -> str:
    """A TOML basic string (JSON's escaping is a subset TOML accepts)."""
    return json.dumps(value, ensure_ascii=False)


def _toml_word(value: str) -> str:
    """A TOML string for an argv word: a literal '...' when that avoids escaping JSON's quotes."""
    if '"' in value and "'" not in value and not re.search(r"[\x00-\x1f\x7f]", value):
        return f"'{value}'"
    return _toml_str(value)


def _toml_multiline_literal(text: str) -> str:
    if "'''" not in text and not re.search(r"[\x00-\x08\x0b-\x1f\x7f]", text.replace("\r\n", "\n")):
        return "'''\n" + text + "'''"
    return _toml_str(text)


def read_unit_text(path: str) -> str:
    """A unit file's text; one line saying what is wrong when it cannot be read or is not UTF-8."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as exc:
        raise InputError(f"{path}: cannot read unit file: {exc.strerror}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[:exc.start].count(b"\n") + 1
        raise InputError(f"{path}:{line}: not UTF-8 text (byte 0x{raw[exc.start]:02x}); systemd reads units as "
                         "UTF-8") from None
    if "\x00" in text:
        raise InputError(f"{path}: holds a NUL byte: not a unit file")
    return text


SERVER_PROGRAMS = ("vllm.entrypoints.openai.api_server", "sglang.launch_server", "llama-server", "llama_cpp.server")
"""Words that mark a shell script's line as the one that starts the server (besides `vllm serve`)."""


def _shell_logical_lines(text: str) -> list[str]:
    """The script's lines with backslash continuations joined."""
    out: list[str] = []
    pending = ""
    for raw in text.splitlines():
        if raw.rstrip().endswith("\\"):
            pending += raw.rstrip()[:-1] + " "
            continue
        out.append(pending + raw)
        pending = ""
    if pending:
        out.append(pending)
    return out


def _starts_a_server(words: Sequence[str]) -> bool:
    if len(words) >= 2 and os.path.basename(words[0]) == "vllm" and words[1] == "serve":
        return True
    return any(w in SERVER_PROGRAMS or os.path.basename(w) in SERVER_PROGRAMS for w in words[:4])


def _expand_script_words(words: Sequence[str], env: Mapping[str, str], where: str) -> list[str]:
    """The server line's $VAR / ${VAR} replaced by the script's own assignments (what the shell
    would pass the server); a variable the script never sets is refused, never guessed or kept as
    a literal "$VAR" the server would receive."""
    missing: list[str] = []

    def sub(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        if name not in env:
            missing.append(name)
            return m.group(0)
        return env[name]

    out = [re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)", sub, w) for w in words]
    if missing:
        said = ", ".join(f"${v}" for v in dict.fromkeys(missing))
        raise InputError(f"{where}: the server's command uses {said}, which the script never sets: set it in the "
                         "script (NAME=value or export NAME=value before this line), or write the value into "
                         "the command")
    return out


def script_as_unit(text: str, path: str) -> str | None:
    """A shell script that starts a server (`vllm serve ...`, `python -m vllm.entrypoints...`,
    `llama-server ...`), as the unit text systemd would run it with: its `export NAME=value` lines
    become Environment=, the server's line ExecStart=. None when `text` is a unit already."""
    import shlex

    if re.search(r"^\s*\[Service\]", text, flags=re.M):
        return None
    env: dict[str, str] = {}
    for number, line in enumerate(_shell_logical_lines(text), start=1):
        try:
            words = shlex.split(line, comments=True)
        except ValueError as exc:
            raise InputError(f"{path}:{number}: cannot split this shell line ({exc})") from None
        if not words:
            continue
        assigned: dict[str, str] = {}
        while words and (words[0] in ("export", "exec", "nohup", "env")
                         or re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0])):
            if "=" in words[0]:
                name, value = words[0].split("=", 1)
                assigned[name] = value
            words = words[1:]
        if not words:
            env.update(assigned)  # `export NAME=value` or `NAME=value` on its own line
            continue
        if _starts_a_server(words):
            env.update(assigned)
            return "[Service]\n" + render_environment(env) + render_exec_start(
                _expand_script_words(words, env, f"{path}:{number}"))
    raise InputError(f"{path}: neither a systemd unit (no [Service] section) nor a shell script with a line that "
                     "starts a server (`vllm serve ...`, `python -m vllm.entrypoints.openai.api_server ...`, "
                     "`llama-server ...`)")


def read_server_definition(path: str) -> str:
    """A unit file's text, or a shell script's server line as a unit's."""
    text = read_unit_text(path)
    return script_as_unit(text, path) or text


def import_unit(path: str) -> str:
    """An experiment TOML whose baseline is the unit's (or the shell script's) server: edit the
    variants and run it."""
    text = read_server_definition(path)
    unit = parse_unit(text, path)
    argv = unit.exec_start_argv()
    env = unit.environment()
    from truthput.experiment.argv import ServerArgv, speculative_settings

    argv, shell_env, shell_notes = unwrap_shell(argv, f"{path}: ExecStart=")
    env = {**env, **shell_env}
    engine = guess_engine(argv)
    server = ServerArgv.parse(argv, engine=engine)
    chat = server.has("--default-chat-template-kwargs") or server.has("--chat-template")
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", os.path.basename(path).rsplit(".", 1)[0]) or "imported"
    tp = server.get("--tensor-parallel-size")
    pp = server.get("--pipeline-parallel-size")
    gpu_count = (int(tp) if isinstance(tp, str) and tp.isdigit() else 1) * (
        int(pp) if isinstance(pp, str) and pp.isdigit() else 1)
    model_dir = server.model()
    spec = speculative_settings(server)
    if spec and isinstance(spec.get("num_speculative_tokens"), int) and spec["num_speculative_tokens"] > 1:
        example = f'# set = {{ "--spec-tokens" = {spec["num_speculative_tokens"] - 1} }}'
    else:
        example = '# set = { "--max-num-seqs" = 64 }'
    out: list[str] = []
    out.append(f"# Imported by `truthput import` from {path}.")
    for note in consistency_warnings(unit) + unit.notes() + shell_notes:
        out.append(f"# WARNING: {note}")
    out += [
        "",
        "[experiment]",
        f"name = {_toml_str(name)}",
        'baseline = "baseline"',
        "",
        "[server]",
        f"engine = {_toml_str(engine)}",
        "# ExecStart= as systemd passes it to the server (quotes, continuations and %/$ resolved).",
        "command = [",
    ]
    for group in _groups(argv):
        out.append("  " + ", ".join(_toml_word(w) for w in group) + ",")
    out.append("]")
    out.append("env = { " + ", ".join(f"{_toml_str(k)} = {_toml_str(v)}" for k, v in env.items()) + " }" if env else "env = {}")
    out += [
        "",
        "# The unit itself, so `truthput unit RUN --variant NAME` writes the winner back with the same sections.",
        "[server.systemd_unit]",
        f"path = {_toml_str(os.path.abspath(path))}",
        f"text = {_toml_multiline_literal(text)}",
        "",
        "# What the unit cannot say: the GPU. Fill it in for the roofline, or run on the simulator without",
        "# editing: truthput run <this file> --engine sim --sim-gpu \"RTX 3090\" --sim-model <profile>",
        "# [hardware]",
        '# gpu = "..."            # a GPU name from the catalog (truthput/hardware/catalog.toml), e.g. "RTX 3090"',
        f"# count = {gpu_count}" + ("              # from ExecStart=: tensor x pipeline parallel size" if gpu_count > 1
                                    else ""),
        *(["", "[model]", f"path = {_toml_str(model_dir)}   # ExecStart='s --model: its tokenizer counts tokens where "
           "the directory exists here; a named profile (profile = \"...\") instead gives the roofline its shape"]
          if model_dir else ["# [model]", '# profile = "..."        # or path = "/path/to/model"']),
        "",
        "[[variant]]",
        'name = "baseline"        # the unit as it is',
        "",
        "# [[variant]]",
        '# name = "example"',
        example,
        '# remove = ["--enforce-eager"]',
        "",
        "[workload]",
        "concurrency = [1, 8]",
        "duration_s = 20",
        "warmup_s = 5",
        f'endpoint = "{"chat" if chat else "completions"}"',
        "input_tokens = 256",
        "output_tokens = 256",
        "ignore_eos = true",
        "",
        "[measure]",
        "starts = 3          # server starts per variant before the verdict's first look",
        "sequential = true   # then add rounds of starts until every comparison is decided ...",
        "max_starts = 8      # ... or this many starts per variant",
        "repeats = 1         # timed trials per level per start (the verdict's unit of replication is the start)",
        "",
    ]
    return "\n".join(out)
