"""The package layout (README, "Code map"): sub-packages per phase, imports only downward, no cycles.

The import graph is read with ``ast`` over every module of ``pairaudit/``:
every import statement, at module level or inside a function (a deferred
import still runs), plus the package ``__init__`` that Python runs before a
submodule of another package. The order of the packages is the README's:

    core  <-  formats, gates  <-  serving  <-  boundary, quality, refserver, speed
          <-  datasets, plans, timeplan  <-  answers  <-  diagnostics  <-  bisect  <-  promotion  <-  interop
          <-  configcheck  <-  cli

A package imports only packages of earlier layers (and the root
``pairaudit/__init__.py``, which holds the version and imports nothing).
"""

from __future__ import annotations

import ast
import importlib
import io
import re
import tokenize
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PKG = REPO / "pairaudit"
# Earlier layers first; a package may import any package of an earlier layer, none of its own
# layer or later. configcheck (the load-time checks) is the one top-level module; only the command (cli) sits
# above it.
LAYERS = [
    {"core"},                                    # contracts, artifacts, logs, defaults, code hash, stats
    {"formats", "gates"},                        # answer formats; the registered rules: pure functions
    {"serving"},                                 # servers over HTTP; a failed server's record, in gates' kinds
    {"refserver", "quality", "boundary", "speed"},
    {"datasets", "plans", "timeplan"},           # timeplan: the audit's time plan, from the host's records
    {"answers"},
    {"diagnostics"},                             # reads the answers' journals
    {"bisect"},                                  # probes the diagnostics' divergences on subsets of the change
    {"promotion"},
    {"interop"},                                 # other tools' formats, read and written from the artifacts
    {"configcheck"},
    {"cli"},                                     # `pairaudit plan` runs the workflow's load checks
]
TOP_LEVEL = {"__init__.py", "configcheck.py"}


def modules() -> dict[str, tuple[Path, bool]]:
    """Dotted name -> (file, is a package's __init__) for every module under pairaudit/."""
    found = {}
    for path in sorted(PKG.rglob("*.py")):
        parts = list(path.relative_to(REPO).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        found[".".join(parts[:-1] if is_pkg else parts)] = (path, is_pkg)
    return found


def _absolute(node: ast.ImportFrom, current: str, is_pkg: bool) -> str:
    if node.level == 0:
        return node.module or ""
    parts = current.split(".") if is_pkg else current.split(".")[:-1]
    parts = parts[: len(parts) - (node.level - 1)]
    return ".".join(parts + ([node.module] if node.module else []))


def import_graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports (see the module docstring)."""
    mods = modules()

    def owner(name: str) -> str | None:  # the module a dotted name lives in
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for name, (path, is_pkg) in mods.items():
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets |= {t for a in node.names if (t := owner(a.name))}
            elif isinstance(node, ast.ImportFrom):
                base = _absolute(node, name, is_pkg)
                for alias in node.names:
                    t = owner(f"{base}.{alias.name}") if f"{base}.{alias.name}" in mods else owner(base)
                    if t:
                        targets.add(t)
        ancestors = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
        for t in list(targets):  # Python runs each enclosing package's __init__ first
            parts = t.split(".")
            targets |= {p for i in range(1, len(parts)) if (p := ".".join(parts[:i])) in mods}
        graph[name] = {t for t in targets if t != name and t not in ancestors}
    return graph


def package_of(module: str) -> str:
    parts = module.split(".")
    return "configcheck" if parts[1:] == ["configcheck"] else (parts[1] if len(parts) > 1 else "")


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def layering_violations(graph: dict[str, set[str]]) -> list[str]:
    layer = {pkg: i for i, names in enumerate(LAYERS) for pkg in names}
    bad = []
    for src, targets in sorted(graph.items()):
        for dst in sorted(targets):
            a, b = package_of(src), package_of(dst)
            if a == b or b == "":  # within a package; the root __init__ (the version)
                continue
            if layer[b] >= layer[a]:
                bad.append(f"{src} imports {dst}: {a} (layer {layer[a]}) may import only earlier layers, "
                           f"{b} is layer {layer[b]}")
    return bad


# ---------------------------------------------------------------- the layout

def test_only_the_package_init_and_configcheck_sit_at_the_top():
    assert {p.name for p in PKG.glob("*.py")} == TOP_LEVEL
    assert (PKG / "__init__.py").read_text().count("import") == 0  # the version only: imports nothing
    for d in PKG.iterdir():
        if d.is_dir() and d.name != "__pycache__":
            assert (d / "__init__.py").is_file(), f"{d} is not a package"


def test_every_package_has_its_place_in_the_order():
    packages = {d.name for d in PKG.iterdir() if (d / "__init__.py").is_file()} | {"configcheck"}
    placed = set().union(*LAYERS)
    assert packages == placed, f"not placed in LAYERS: {sorted(packages - placed)}; gone: {sorted(placed - packages)}"


def test_no_import_cycle_between_modules():
    assert cycles(import_graph()) == []


def test_packages_import_only_earlier_layers():
    assert layering_violations(import_graph()) == []


def test_the_readme_code_map_names_every_package_and_states_the_order():
    readme = (REPO / "README.md").read_text()
    code_map = readme[readme.index("## Code map"):readme.index("\n## ", readme.index("## Code map") + 1)]
    for pkg in set().union(*LAYERS) - {"configcheck"}:
        assert f"`{pkg}/`" in code_map, f"README's code map does not name {pkg}/"
    arrows = re.sub(r"\s+", " ", "  <-  ".join(", ".join(sorted(layer)) for layer in LAYERS))
    assert arrows in re.sub(r"\s+", " ", code_map), f"README's code map does not state the order:\n{arrows}"


# ---------------------------------------------------------------- the checks themselves

def test_a_cycle_and_an_upward_import_are_found():
    """Known answers on graphs built to fail: a two-module cycle, and core importing a phase."""
    assert cycles({"pairaudit.a.x": {"pairaudit.a.y"}, "pairaudit.a.y": {"pairaudit.a.x"}, "pairaudit.b": set()}) \
        == [["pairaudit.a.x", "pairaudit.a.y"]]
    assert cycles({"pairaudit.a.x": {"pairaudit.a.y"}, "pairaudit.a.y": set()}) == []
    up = layering_violations({"pairaudit.core.stats": {"pairaudit.quality.scoring"}})
    assert up and up[0].startswith("pairaudit.core.stats imports pairaudit.quality.scoring: core (layer 0)")
    same = layering_violations({"pairaudit.speed.stage": {"pairaudit.quality.scoring"}})
    assert same and "speed (layer 3)" in same[0] and "quality is layer 3" in same[0]
    assert layering_violations({"pairaudit.serving.failures": {"pairaudit.gates.server_failure"}}) == []
    assert layering_violations({"pairaudit.gates.server_failure": {"pairaudit.serving.failures"}})
    assert layering_violations({"pairaudit.promotion.stage": {"pairaudit.core.stats", "pairaudit"}}) == []


def test_the_graph_follows_deferred_imports_and_enclosing_packages():
    graph = import_graph()
    # a function-level import (the reference server imports its model store only once it runs)
    assert "pairaudit.serving.modelstore" in graph["pairaudit.refserver.__main__"]
    # `from pairaudit import gates` runs the registry's __init__, which imports every rule family
    assert "pairaudit.gates" in graph["pairaudit.quality.stage"]
    assert "pairaudit.gates.speed" in graph["pairaudit.gates"]


# ---------------------------------------------------------------- the docs, comments and docstrings follow it

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
# Comments and docstrings point at modules and files as the docs do; a module that moves leaves them
# pointing nowhere unless they are read too.
SOURCES = sorted({*PKG.rglob("*.py"), *(REPO / "scripts").rglob("*.py"), *(REPO / "bench").rglob("*.py"),
                  *(REPO / "tools").rglob("*.py"), *(REPO / "rules").rglob("*.smk"), REPO / "Snakefile"})
# The repository's own folders: a path that starts with one of them names a file or folder of this checkout.
TOP_DIRS = ("pairaudit", "scripts", "bench", "tools", "rules", "docs", "tests", "config", "envs", "profiles", "report")
_PATH = re.compile(rf"(?<![\w/.~$-])(?:{'|'.join(TOP_DIRS)})/[\w/.*{{}}<>\[\]-]*")
_DOTTED = re.compile(r"(?<![\w/.-])pairaudit(?:\.\w+)+(?![\w/])")
# (file, pointer) pairs this branch leaves alone: the file moves out of core/ on another branch, which fixes
# them. An entry that no longer occurs fails the test, so it goes once that move has landed.
PENDING: set[tuple[str, str]] = set()


def dangling(text: str) -> list[str]:
    """The repository paths and ``pairaudit.<module>[.<name>]`` names in ``text`` that point at nothing.

    A path with a pattern in it (``rules/<file>.smk``, ``tests/test_vllm_*.py``) names no one file and is skipped.
    """
    missing = []
    for path in _PATH.findall(text):
        path = path.rstrip(".-")
        if not any(c in path for c in "*{}<>[]") and not (REPO / path).exists():
            missing.append(path)
    for dotted in _DOTTED.findall(text):
        parts = dotted.split(".")
        for i in range(len(parts), 0, -1):  # the longest importable prefix, then attributes
            try:
                obj = importlib.import_module(".".join(parts[:i]))
            except ImportError:
                continue
            for attr in parts[i:]:
                obj = getattr(obj, attr, None)
            if obj is None:
                missing.append(dotted)
            break
        else:
            missing.append(dotted)
    return missing


def prose(source: str) -> list[tuple[int, str]]:
    """(line, text) of every comment and docstring of Python or Snakemake source, a docstring line by line.

    A docstring is any string that is a statement of its own (module, class, function, or a bare string
    in a Snakemake rule); strings inside code are not prose.
    """
    out: list[tuple[int, str]] = []
    previous = None  # the last token that is not a comment or a blank line
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            out.append((tok.start[0], tok.string))
        elif tok.type == tokenize.STRING and previous in (None, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT):
            out += [(tok.start[0] + k, line) for k, line in enumerate(tok.string.splitlines())]
        if tok.type not in (tokenize.COMMENT, tokenize.NL):
            previous = tok.type
    return out


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_the_docs_name_only_modules_that_exist(doc):
    """Every repository path and ``pairaudit.<module>[.<name>]`` a document names is there."""
    missing = dangling(doc.read_text())
    assert not missing, f"{doc.name} names modules or files that do not exist: {sorted(set(missing))}"


def test_comments_and_docstrings_name_only_modules_that_exist():
    """The same for every comment and docstring in pairaudit/, scripts/, bench/, rules/ and the Snakefile."""
    found, pending = [], set()
    for path in SOURCES:
        rel = path.relative_to(REPO).as_posix()
        for line, text in prose(path.read_text()):
            for pointer in dangling(text):
                if (rel, pointer) in PENDING:
                    pending.add((rel, pointer))
                else:
                    found.append(f"{rel}:{line}: {pointer}")
    assert not found, "comments and docstrings name modules or files that do not exist:\n" + "\n".join(found)
    assert pending == PENDING, f"PENDING entries that no longer occur (drop them): {sorted(PENDING - pending)}"


def test_the_pointer_check_finds_a_moved_module_in_a_comment_and_a_docstring():
    """Known answers: stale pointers in prose are found, code strings and patterns are not read as pointers."""
    source = ('"""Writes via pairaudit/slots.py and pairaudit.serving.launch.resolve_spec."""\n'
              'x = "pairaudit/gone.py"  # see pairaudit.serving.slots.acquire_for, rules/<file>.smk\n'
              'def f():\n    """Reads bench/nothing_here.py and pairaudit/quality/harness.py."""\n')
    found = [(line, p) for line, text in prose(source) for p in dangling(text)]
    assert found == [(1, "pairaudit/slots.py"), (1, "pairaudit.serving.launch.resolve_spec"),
                     (4, "bench/nothing_here.py")]
    assert dangling("pairaudit.launch/v1 and tests/test_vllm_*.py and docs/") == []
