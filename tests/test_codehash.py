"""Stage code hashes follow the imports of each stage's script."""

from pathlib import Path

from pairaudit import codehash

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
    before = {s: codehash._code_hash.__wrapped__(tmp_path.resolve(), (f"scripts/{s}.py",)) for s in ("one", "two")}
    (tmp_path / "pairaudit" / "d.py").write_text("thing = 2\n")  # same imports: the parse cache still holds
    after = {s: codehash._code_hash.__wrapped__(tmp_path.resolve(), (f"scripts/{s}.py",)) for s in ("one", "two")}
    assert before["one"] != after["one"] and before["two"] == after["two"]


def test_the_real_stages_cover_the_modules_their_scripts_use():
    promotion = codehash.closure_names(REPO, ["scripts/promotion.py"])
    assert "pairaudit/stats.py" in promotion and "pairaudit/report.py" in promotion
    score = codehash.closure_names(REPO, ["scripts/score.py"])
    assert {"pairaudit/datasets.py", "pairaudit/scoring.py", "pairaudit/sandbox.py"} <= set(score)
    answers = codehash.closure_names(REPO, ["scripts/answers.py"])
    assert {"pairaudit/launch.py", "pairaudit/preflight.py", "pairaudit/boundary.py", "pairaudit/sampled.py"} <= set(answers)
    # a server-free stage does not depend on the server code
    assert "pairaudit/launch.py" not in score and "pairaudit/launch.py" not in promotion
