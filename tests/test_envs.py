"""The conda envs are real: each rule's env holds every third-party package its script imports.

For every rule in rules/*.smk with a ``conda:`` env and a ``script:`` (read by
Snakemake's own parser), the script's import closure -- the script and every
project module it reaches, as ``pairaudit.core.codehash`` follows them for the
stage's code hash -- is read with ``ast``. Every module it imports outside the
standard library and the project is a third-party import, wherever the import
statement sits (a function-level import runs when that code path runs). The
installed metadata names its distribution (``yaml`` -> PyYAML, ``markdown_it``
-> markdown-it-py), which must be a dependency of the rule's env, in its conda
list or its ``pip:`` section. Each pinned version in an env equals
``constraints.txt``'s pin (the tested version) of the same distribution. The envs are not built
here: this checks what they declare.
"""

from __future__ import annotations

import ast
import re
import sys
from dataclasses import dataclass
from functools import cache
from importlib.metadata import packages_distributions
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from snakemake import parser
from snakemake.sourcecache import LocalSourceFile

from pairaudit.core.codehash import PACKAGE, module_closure

REPO = Path(__file__).resolve().parents[1]
# Snakemake puts its own installation on a script's sys.path (its preamble unpickles the
# `snakemake` object), so a script may import snakemake in any env.
PROVIDED = {"snakemake"}


def normalize(name: str) -> str:
    """A distribution name as PEP 503 compares them (PyYAML == pyyaml, markdown_it_py == markdown-it-py)."""
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class Rule:
    name: str
    smk: str      # the rules file, relative to the repo
    env: Path     # envs/<name>.yaml
    script: Path  # scripts/<rule>.py


def rules_in(smk: Path) -> list[Rule]:
    """The rules of one .smk file that name a conda env and a script, as Snakemake parses them."""
    workflow = SimpleNamespace(sourcecache=SimpleNamespace(
        open=lambda source: open(source.get_path_or_uri(secret_free=True), encoding="utf-8")))
    code, _ = parser.parse(LocalSourceFile(str(smk)), workflow, {})
    found = []
    for node in ast.walk(ast.parse(code)):
        if not isinstance(node, ast.FunctionDef):
            continue
        directives = {}
        for dec in node.decorator_list:
            if (isinstance(dec, ast.Call) and isinstance(dec.func, ast.Attribute)
                    and isinstance(dec.func.value, ast.Name) and dec.func.value.id == "workflow"):
                if dec.func.attr == "rule":
                    directives["rule"] = next(ast.literal_eval(k.value) for k in dec.keywords if k.arg == "name")
                elif dec.func.attr in ("conda", "script"):
                    directives[dec.func.attr] = ast.literal_eval(dec.args[0])
        if {"rule", "conda", "script"} <= set(directives):
            found.append(Rule(directives["rule"], str(smk.relative_to(REPO)),
                              (smk.parent / directives["conda"]).resolve(),
                              (smk.parent / directives["script"]).resolve()))
    return found


@cache
def all_rules() -> tuple[Rule, ...]:
    return tuple(r for smk in sorted((REPO / "rules").glob("*.smk")) for r in rules_in(smk))


def third_party_imports(script: Path) -> dict[str, list[str]]:
    """Top-level third-party module -> the project files (relative) that import it, over the script's closure."""
    found: dict[str, list[str]] = {}
    for path in module_closure(REPO, [script]):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top in sys.stdlib_module_names or top in (PACKAGE, "__future__") or top in PROVIDED:
                    continue
                where = str(path.relative_to(REPO))
                if where not in found.setdefault(top, []):
                    found[top].append(where)
    return found


def env_dependencies(env: Path) -> dict[str, str | None]:
    """Normalized distribution name -> pinned version (None: unpinned) of an env's conda and pip lists."""
    deps: dict[str, str | None] = {}

    def add(spec: str, pin_sep: str) -> None:
        spec = spec.strip()
        if not spec or spec.startswith("-"):  # a pip option line (--extra-index-url ...)
            return
        m = re.match(r"([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?\s*(.*)", spec)
        assert m, f"{env.name}: cannot read the dependency {spec!r}"
        rest = m.group(3)
        deps[normalize(m.group(1))] = rest[len(pin_sep):].strip() if rest.startswith(pin_sep) else None

    doc = yaml.safe_load(env.read_text())
    for dep in doc.get("dependencies") or []:
        if isinstance(dep, dict):
            for spec in dep.get("pip") or []:
                add(spec, "==")
        else:
            add(str(dep), "=")
    return deps


def missing_packages(rule: Rule, distributions=None) -> list[str]:
    """One line per third-party import of the rule's closure whose distribution its env lacks."""
    distributions = packages_distributions() if distributions is None else distributions
    deps = env_dependencies(rule.env)
    problems = []
    for module, where in sorted(third_party_imports(rule.script).items()):
        dists = distributions.get(module)
        if not dists:
            problems.append(f"{module} (imported by {', '.join(where)}): no installed distribution provides it, "
                            "so its package cannot be named")
        elif not any(normalize(d) in deps for d in dists):
            problems.append(f"{dists[0]} (import {module} in {', '.join(where)})")
    return problems


def _tested_pins() -> dict[str, str]:
    """The tested versions: constraints.txt, one exact pin per line (pyproject.toml states ranges)."""
    pins = {}
    for line in (REPO / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.match(r"([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)$", line)
        assert m, f"constraints.txt: {line!r} is not an exact pin"
        pins[normalize(m.group(1))] = m.group(2)
    return pins


# ---------------------------------------------------------------- the envs

def test_every_script_is_a_rule_with_an_env():
    rules = all_rules()
    # a script may serve several rules (a sweep's speed brackets are one rule each)
    assert sorted({r.script.name for r in rules}) == sorted(p.name for p in (REPO / "scripts").glob("*.py"))
    for r in rules:
        assert r.env.parent == REPO / "envs" and r.env.is_file(), (r.name, r.env)


@pytest.mark.parametrize("rule", all_rules(), ids=lambda r: r.name)
def test_the_rules_env_has_every_package_its_script_imports(rule):
    missing = missing_packages(rule)
    assert not missing, (f"rule {rule.name} ({rule.smk}) runs in envs/{rule.env.name}, which lacks: "
                         + "; ".join(missing))


@pytest.mark.parametrize("env", sorted((REPO / "envs").glob("*.yaml")), ids=lambda p: p.name)
def test_env_pins_equal_the_tested_versions(env):
    pins = _tested_pins()
    wrong = {name: (version, pins[name]) for name, version in env_dependencies(env).items()
             if name in pins and version != pins[name]}
    assert not wrong, f"envs/{env.name}: pinned differently from constraints.txt (env, tested): {wrong}"


# ---------------------------------------------------------------- the check itself

def test_the_check_names_a_package_the_env_lacks_and_accepts_it_listed(tmp_path):
    """Known answers: the score rule imports prometheus_client (through serving/client.py), PyYAML
    under its import name yaml, and math-verify under math_verify; an env without them is named."""
    score = next(r for r in all_rules() if r.name == "score")
    imports = third_party_imports(score.script)
    assert "pairaudit/serving/client.py" in imports["prometheus_client"]
    assert {"yaml", "math_verify"} <= set(imports)
    lacking = tmp_path / "lacking.yaml"
    lacking.write_text("dependencies:\n  - python=3.11\n  - pip\n  - pip:\n      - requests==2.34.2\n")
    missing = missing_packages(Rule(score.name, score.smk, lacking, score.script))
    assert any(m.startswith("prometheus_client (import prometheus_client in ") for m in missing), missing
    assert any(m.startswith("PyYAML (import yaml in ") for m in missing), missing
    assert any(m.startswith("math-verify (import math_verify in ") for m in missing), missing
    assert not any(m.startswith("requests ") for m in missing), missing
    # listed under its conda name with another spelling, it is there
    whole = tmp_path / "whole.yaml"
    whole.write_text("dependencies:\n  - pyyaml=6.0.4\n  - pip:\n      - requests==2.34.2\n" + "".join(
        f"      - {m.split(' ')[0]}\n" for m in missing if not m.startswith("PyYAML")))
    assert missing_packages(Rule(score.name, score.smk, whole, score.script)) == []
    # a module no installed distribution provides is named as such
    assert missing_packages(score, distributions={}) and all(
        "no installed distribution provides it" in m for m in missing_packages(score, distributions={}))
