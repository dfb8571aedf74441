"""The project's shape, checked where CI runs: the workflow lints clean, the
Snakemake files are formatted, the Python passes ruff and mypy (pinned in the
test extras), and nothing cites a document the reader does not have."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def _run(*cmd: str, timeout_s: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)


def _tool(name: str) -> str:
    path = BIN / name
    if not path.exists():
        pytest.fail(f"{name} is not installed beside {sys.executable}: run ./install.sh (it installs the test extras)")
    return str(path)


def test_snakemake_lint_is_clean():
    proc = _run(_tool("snakemake"), "--lint")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]


def test_snakefmt_has_nothing_to_reformat():
    proc = _run(_tool("snakefmt"), "--check", "Snakefile", "rules")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]


def test_ruff_is_clean():
    proc = _run(_tool("ruff"), "check", ".")
    assert proc.returncode == 0, proc.stdout[-4000:]


def test_mypy_is_clean():
    """The whole package type-checks under the pinned mypy and pyproject's [tool.mypy] (records are TypedDicts)."""
    # a first run without its cache reads the standard library's stubs: minutes on a busy 2-core host
    proc = _run(_tool("mypy"), "--no-error-summary", "--cache-dir", str(ROOT / ".mypy_cache"), timeout_s=900)
    assert proc.returncode == 0, proc.stdout[-8000:] + proc.stderr[-2000:]


# Planning notes and issue numbers live outside the project; a reader of the
# project has neither, so the project says what it means in its own words.
# (Written with character classes so that this file does not itself match.)
CITATION = re.compile(r"seed[ ]00[0-9]|seeds?[/]|FIELD[-]NOTES|DESIGN[.]md|DESIGN[ ]stage|\bissue[ ][0-9]+\b",
                      re.IGNORECASE)


def test_nothing_cites_documents_the_reader_lacks():
    files = _run("git", "ls-files").stdout.split()
    hits = []
    for name in files:
        path = ROOT / name
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        hits += [f"{name}:{n}: {line.strip()[:120]}" for n, line in enumerate(text.splitlines(), 1)
                 if CITATION.search(line)]
    assert not hits, "\n".join(hits[:30])
