"""The layout is the pipeline, one way: `experiment/ -> engines/ -> load/ -> measure/ -> analyze/ ->
store/, report/`, with `run/` (the run loop), `tune/` and `commands/` on top and `sim/` beside.
Every import counts, a function's own included (ast.walk sees them all): no module imports one of a
package later in the pipeline, no two modules import each other round a circle, and nothing but
the command line imports the simulator (the core launches it as a subprocess).
Each check is shown to bite on a planted module (the negative control)."""

from __future__ import annotations

import ast
import pathlib

import truthput

SRC = pathlib.Path(truthput.__file__).parent

RANK = {
    "": 0, "errors": 0, "text": 0,
    "experiment": 1, "hardware": 1, "events": 1.5,
    "engines": 2, "cluster": 2.5,
    "load": 3, "measure": 4, "analyze": 5,
    "store": 6, "report": 6.5,
    "run": 7, "tune": 8, "commandline": 8, "commands": 9, "cli": 10, "__main__": 11,
}
"""A package's place in the pipeline: it may import only packages placed before it (and itself)."""
BESIDE = {"sim": {"", "errors", "experiment", "hardware", "load", "store"}}
"""The simulator stands beside the pipeline: what it may import; only the command line imports it."""


def module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(sources: dict[str, tuple[str, bool]]) -> dict[str, set[str]]:
    """module -> the truthput modules it imports (`sources`: module -> (its text, is a package))."""
    known = set(sources)
    out: dict[str, set[str]] = {}
    for mod, (text, is_pkg) in sources.items():
        pkg = mod if is_pkg else mod.rsplit(".", 1)[0]
        found: set[str] = set()
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names if a.name.split(".")[0] == "truthput"}
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = pkg.split(".")[:len(pkg.split(".")) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                if target.split(".")[0] == "truthput":
                    found |= {f"{target}.{a.name}" if f"{target}.{a.name}" in known else target for a in node.names}
        out[mod] = {m for m in found if m in known and m != mod}
    return out


def package(mod: str) -> str:
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 else ""


def upward(graph: dict[str, set[str]]) -> list[str]:
    """Imports of a package placed later in the pipeline, and of the simulator from outside it."""
    bad = []
    for a, targets in graph.items():
        for b in sorted(targets):
            pa, pb = package(a), package(b)
            if pa == pb:
                continue
            if pa in BESIDE:
                ok = pb in BESIDE[pa]
            elif pb in BESIDE:
                ok = pa == "commands"
            else:
                ok = RANK[pb] < RANK[pa]
            if not ok:
                bad.append(f"{a} -> {b}")
    return bad


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Groups of modules that import each other round a circle (Tarjan's strongly connected parts)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _sources() -> dict[str, tuple[str, bool]]:
    return {module_name(p): (p.read_text(), p.name == "__init__.py") for p in SRC.rglob("*.py")}


def test_every_package_is_placed() -> None:
    assert {package(m) for m in _sources()} - set(RANK) - set(BESIDE) == set()


def test_no_import_goes_up_the_pipeline() -> None:
    assert upward(imports(_sources())) == []


def test_no_modules_import_each_other_round_a_circle() -> None:
    assert circles(imports(_sources())) == []


def test_a_planted_upward_import_and_circle_are_found() -> None:
    sources = _sources()
    sources["truthput.store.planted"] = ("def f():\n    from truthput.report.data import run_summary\n", False)
    sources["truthput.analyze.planted"] = ("from truthput.sim.engine import Engine\n"
                                           "from truthput.analyze import planted_too\n", False)
    sources["truthput.analyze.planted_too"] = ("def g():\n    import truthput.analyze.planted\n", False)
    graph = imports(sources)
    assert sorted(upward(graph)) == ["truthput.analyze.planted -> truthput.sim.engine",
                             "truthput.store.planted -> truthput.report.data"]
    assert circles(graph) == [["truthput.analyze.planted", "truthput.analyze.planted_too"]]
