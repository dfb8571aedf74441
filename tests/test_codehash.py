"""Stage code hashes follow the imports of each stage's script."""

from pathlib import Path

from pairaudit.core import codehash

REPO = Path(__file__).resolve().parents[1]


def make_tree(root: Path) -> None:
    (root / "pairaudit" / "sub").mkdir(parents=True)
    (root / "scripts").mkdir()
    (root / "pairaudit" / "__init__.py").write_text("")
    (root / "pairaudit" / "a.py").write_text("from . import b\nimport json\n")
    (root / "pairaudit" / "b.py").write_text("from .sub import c\n")
    (root / "pairaudit" / "sub" / "__init__.py").write_text("")
    (root / "pairaudit" / "sub" / "c.py").write_text("from ..d import thing\n")
    (root / "pairaudit" / "d.py").write_text("thing = 1\n")
    (root / "pairaudit" / "e.py").write_text("x = 1\n")
    (root / "scripts" / "one.py").write_text("from pairaudit.a import x\n")
    (root / "scripts" / "two.py").write_text("import pairaudit.e\n")


def test_closure_follows_relative_absolute_and_package_imports(tmp_path):
    make_tree(tmp_path)
    assert codehash.closure_names(tmp_path, ["scripts/one.py"]) == [
        "pairaudit/__init__.py", "pairaudit/a.py", "pairaudit/b.py", "pairaudit/d.py",
        "pairaudit/sub/__init__.py", "pairaudit/sub/c.py", "scripts/one.py"]
    assert codehash.closure_names(tmp_path, ["scripts/two.py"]) == [
        "pairaudit/__init__.py", "pairaudit/e.py", "scripts/two.py"]


def test_editing_an_imported_file_changes_only_the_hashes_of_its_importers(tmp_path):
    make_tree(tmp_path)
    before = {s: codehash._code_hash.__wrapped__(tmp_path.resolve(), (f"scripts/{s}.py",), None)
              for s in ("one", "two")}
    (tmp_path / "pairaudit" / "d.py").write_text("thing = 2\n")  # same imports: the parse cache still holds
    after = {s: codehash._code_hash.__wrapped__(tmp_path.resolve(), (f"scripts/{s}.py",), None)
             for s in ("one", "two")}
    assert before["one"] != after["one"] and before["two"] == after["two"]


def test_the_real_stages_cover_the_modules_their_scripts_use():
    promotion = codehash.closure_names(REPO, ["scripts/promotion.py"])
    assert "pairaudit/core/stats.py" in promotion and "pairaudit/promotion/stage.py" in promotion
    score = codehash.closure_names(REPO, ["scripts/score.py"])
    assert {"pairaudit/quality/stage.py", "pairaudit/quality/scoring.py", "pairaudit/quality/sandbox.py",
            "pairaudit/quality/harness.py"} <= set(score)
    answers = codehash.closure_names(REPO, ["scripts/answers.py"])
    assert {"pairaudit/serving/launch.py", "pairaudit/serving/preflight.py", "pairaudit/boundary/cases.py", "pairaudit/answers/sampled.py"} <= set(answers)
    # a server-free stage does not depend on the server code
    assert "pairaudit/serving/launch.py" not in score and "pairaudit/serving/launch.py" not in promotion


def _fresh_process_hash(root: Path, script: str, cache: Path) -> str:
    # what a new snakemake process sees: no in-memory memo, only the file cache
    codehash._file_imports.cache_clear()
    codehash._caches.clear()
    return codehash._code_hash.__wrapped__(root.resolve(), (script,), str(cache))


def test_the_imports_cache_saves_parses_and_never_changes_a_hash(tmp_path, monkeypatch):
    make_tree(tmp_path)
    cache = tmp_path / ".snakemake" / "code-imports.json"
    plain = codehash._code_hash.__wrapped__(tmp_path.resolve(), ("scripts/one.py",), None)
    assert _fresh_process_hash(tmp_path, "scripts/one.py", cache) == plain and cache.exists()
    parses = []
    real = codehash.imported_modules
    monkeypatch.setattr(codehash, "imported_modules", lambda *a, **k: parses.append(a) or real(*a, **k))
    assert _fresh_process_hash(tmp_path, "scripts/one.py", cache) == plain
    assert parses == []  # nothing parsed: every file's imports came from the cache
    # a file whose imports change is parsed again and its new import followed
    (tmp_path / "pairaudit" / "d.py").write_text("from . import e\nthing = 1\n")
    again = _fresh_process_hash(tmp_path, "scripts/one.py", cache)
    assert again != plain and [a[1] for a in parses] == ["pairaudit.d", "pairaudit.e"]  # the edit, the new import
    assert "pairaudit/e.py" in codehash.closure_names(tmp_path, ["scripts/one.py"])
    # a cut cache file is rebuilt, not trusted
    cache.write_text('{"cut')
    assert _fresh_process_hash(tmp_path, "scripts/one.py", cache) == again
