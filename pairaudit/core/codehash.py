"""What code a stage runs, derived from its imports rather than kept by hand.

A stage's code hash covers its script and every ``pairaudit`` module the
script imports, directly or through other modules (a package counts with its
``__init__``).  The hash is a rule parameter, so editing any file a stage
imports reruns that stage (and what consumes its outputs), and editing a file
it does not import reruns nothing.  Only the project's own modules are
followed: installed packages are covered by Snakemake's software-env trigger
and the launch receipt's package versions.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
from functools import lru_cache
from pathlib import Path

PACKAGE = "pairaudit"


@lru_cache(maxsize=None)
def _module_file(base: Path, module: str) -> Path | None:
    rel = Path(*module.split("."))
    for cand in (base / rel.with_suffix(".py"), base / rel / "__init__.py"):
        if cand.is_file():
            return cand
    return None


def _resolve(module: str, level: int, current: str, is_package: bool) -> str:
    if level == 0:
        return module
    parts = current.split(".")
    if not is_package:
        parts = parts[:-1]
    parts = parts[: len(parts) - (level - 1)]
    return ".".join(parts + ([module] if module else []))


def imported_modules(source: str, current: str = "", is_package: bool = False) -> set[str]:
    """Every module name an import statement in ``source`` may load (``from x import y``: x and x.y)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            mod = _resolve(node.module or "", node.level, current, is_package)
            if mod:
                out.add(mod)
            out.update(f"{mod}.{alias.name}" if mod else alias.name for alias in node.names)
    return out


def _parents(module: str) -> list[str]:
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


# What each project file imports, kept across processes when the caller names
# a cache file: a no-op rerun then parses nothing. Keyed by path, size and
# mtime; a changed file is parsed again.
_caches: dict[str, dict[str, list]] = {}
_dirty: set[str] = set()


def _cache(path: str) -> dict[str, list]:
    if path not in _caches:
        try:
            _caches[path] = json.loads(Path(path).read_text())
        except (OSError, ValueError):
            _caches[path] = {}  # a missing or cut cache is rebuilt, never trusted
    return _caches[path]


def _save(path: str) -> None:
    if path not in _dirty:
        return
    tmp = Path(f"{path}.{os.getpid()}.tmp")
    try:
        tmp.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(_caches[path], sort_keys=True))
        os.replace(tmp, path)
        _dirty.discard(path)
    except OSError:
        tmp.unlink(missing_ok=True)  # a cache that cannot be written costs a parse next time, nothing else


@lru_cache(maxsize=None)
def _file_imports(path: Path, name: str, is_pkg: bool, cache_path: str | None = None) -> frozenset[str]:
    if cache_path is None:
        return frozenset(imported_modules(path.read_text(), name, is_pkg))
    st = path.stat()
    key, stamp = f"{path}|{name}|{int(is_pkg)}", [st.st_size, st.st_mtime_ns]
    cache = _cache(cache_path)
    hit = cache.get(key)
    if hit and hit[:2] == stamp:
        return frozenset(hit[2])
    found = imported_modules(path.read_text(), name, is_pkg)
    cache[key] = [*stamp, sorted(found)]
    _dirty.add(cache_path)
    return frozenset(found)


def module_closure(base: Path, roots: list[Path], cache_path: str | None = None) -> list[Path]:
    """The root files plus every project module they import, transitively; sorted, unique."""
    seen: set[Path] = set()
    todo: list[tuple[Path, str, bool]] = [(p, "", False) for p in roots]
    while todo:
        path, name, is_pkg = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for mod in _file_imports(path, name, is_pkg, cache_path):
            if mod != PACKAGE and not mod.startswith(PACKAGE + "."):
                continue
            for m in [*_parents(mod), mod]:
                f = _module_file(base, m)
                if f is not None and f not in seen:
                    todo.append((f, m, f.name == "__init__.py"))
    return sorted(seen)


def code_hash(base: str | Path, roots: list[str], *, cache: str | Path | None = None) -> str:
    """sha256 over the relative path and bytes of every file in the roots' import closure.

    ``cache``: a file keeping each file's imports between processes (never changes the hash).
    """
    return _code_hash(Path(base).resolve(), tuple(roots), str(cache) if cache is not None else None)


@lru_cache(maxsize=None)
def _code_hash(base: Path, roots: tuple[str, ...], cache_path: str | None) -> str:
    h = hashlib.sha256()
    for f in module_closure(base, [base / r for r in roots], cache_path):
        h.update(str(f.relative_to(base)).encode() + b"\0")
        h.update(f.read_bytes())
    if cache_path is not None:
        _save(cache_path)
    return h.hexdigest()


def closure_names(base: str | Path, roots: list[str]) -> list[str]:
    base = Path(base).resolve()
    return [str(f.relative_to(base)) for f in module_closure(base, [base / r for r in roots])]
