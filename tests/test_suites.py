"""Generated suites: deterministic, every answer right by independent recomputation, scorable."""

import ast
import operator
import re
from fractions import Fraction

import pytest

from pairaudit.datasets.formats import normalize
from pairaudit.datasets.suites import algebra_suite, arith_suite, latex_number
from pairaudit.quality.scoring import score_item

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def eval_expr(expr: str, values: dict) -> int:
    """Evaluate a + - * expression over named integers without eval()."""
    def ev(node):
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.Name):
            return values[node.id]
        raise ValueError(f"unexpected node {ast.dump(node)}")
    return ev(ast.parse(expr, mode="eval").body)


def parse_latex_number(s: str) -> Fraction:
    m = re.fullmatch(r"(-?)\\frac\{(\d+)\}\{(\d+)\}", s)
    if m:
        value = Fraction(int(m.group(2)), int(m.group(3)))
        assert value.denominator == int(m.group(3)), f"{s} not in lowest terms"
        return -value if m.group(1) else value
    assert re.fullmatch(r"-?\d+", s), s
    return Fraction(int(s))


@pytest.mark.parametrize("suite", [arith_suite, algebra_suite])
def test_deterministic_prefix_stable_and_seed_dependent(suite):
    a = suite(30, 7)
    assert a == suite(30, 7)
    assert suite(10, 7) == a[:10]
    assert suite(30, 8) != a
    assert len({r["id"] for r in a}) == 30
    assert suite(0, 7) == []
    with pytest.raises(ValueError):
        suite(-1, 7)


def test_arith_answers_recompute_and_steps_are_true():
    rows = arith_suite(300, 42)
    assert {r["meta"]["template"] for r in rows} == {"buy_packs", "give_buy", "fill_use", "wage", "daily_extra"}
    for r in rows:
        meta = r["meta"]
        final = int(r["answer"].rsplit("#### ", 1)[1])
        assert final == eval_expr(meta["expression"], meta["values"]), r
        assert final > 0
        for v in meta["values"].values():
            assert re.search(rf"(?<!\d){v}(?!\d)", r["question"]), (v, r["question"])
        steps = r["answer"].splitlines()[:-1]
        assert len(steps) == 2
        for line in steps:
            lhs, rhs = line.split(" = ")
            x, op, y = lhs.split(" ")
            assert _OPS[{"+": ast.Add, "-": ast.Sub, "*": ast.Mult}[op]](int(x), int(y)) == int(rhs), line
        assert int(steps[-1].split(" = ")[1]) == final


def test_algebra_answers_recompute():
    rows = algebra_suite(300, 42)
    assert {r["meta"]["kind"] for r in rows} == {"linear", "expression", "range_sum", "fraction_sum"}
    for r in rows:
        m = r["meta"]
        ans = parse_latex_number(r["answer"])
        if m["kind"] == "linear":
            assert m["a"] * ans + m["b"] == m["c"], r
            assert f"{m['a']}x" in r["problem"]
        elif m["kind"] == "expression":
            assert ans == m["a"] + m["b"] * m["c"] - m["d"] ** 2
        elif m["kind"] == "range_sum":
            assert ans == sum(range(m["low"], m["high"] + 1))
        else:
            x, y = Fraction(m["p1"], m["q1"]), Fraction(m["p2"], m["q2"])
            assert ans == (x + y if m["op"] == "+" else x - y)
        assert r["solution"].endswith(f"\\boxed{{{r['answer']}}}$.")


def test_latex_number():
    assert latex_number(Fraction(6, 3)) == "2"
    assert latex_number(Fraction(-3, 4)) == r"-\frac{3}{4}"
    assert latex_number(Fraction(10, 4)) == r"\frac{5}{2}"
    assert latex_number(-7) == "-7"


def test_every_arith_gold_scores_correct_and_off_by_one_wrong():
    items = normalize("gsm8k", arith_suite(80, 3))
    for it in items:
        assert score_item(it, it["reference"]["solution"])["correct"], it
        wrong = int(it["reference"]["answer"]) + 1
        assert not score_item(it, f"#### {wrong}")["correct"]


def test_every_algebra_gold_scores_correct_and_perturbed_wrong():
    items = normalize("math", algebra_suite(80, 3))
    for it in items:
        rec = score_item(it, it["reference"]["solution"])
        assert rec["correct"] and rec["method"] == "math-verify", rec
        wrong = latex_number(parse_latex_number(it["reference"]["answer"]) + Fraction(1, 3))
        assert not score_item(it, f"\\boxed{{{wrong}}}")["correct"]


# ------------------------------------------------------------------ difficulty levels

def test_level_2_is_the_published_suite_and_level_1_is_a_separate_stream():
    assert arith_suite(20, 7) == arith_suite(20, 7, 2) and algebra_suite(20, 11) == algebra_suite(20, 11, 2)
    one = arith_suite(20, 7, 1)
    assert one == arith_suite(20, 7, 1) and arith_suite(5, 7, 1) == one[:5]
    assert [r["question"] for r in one] != [r["question"] for r in arith_suite(20, 7)]
    for bad in (0, 3, "1", True):
        with pytest.raises(ValueError, match="level must be one of"):
            arith_suite(3, 7, bad)
    for bad in (-1, 3, "1", False):
        with pytest.raises(ValueError, match="level must be one of"):
            algebra_suite(3, 7, bad)


def test_arith_level_1_is_one_true_step_on_single_digits():
    rows = arith_suite(300, 42, 1)
    assert {r["meta"]["template"] for r in rows} == {"find_more", "give_away"}
    for r in rows:
        meta = r["meta"]
        final = int(r["answer"].rsplit("#### ", 1)[1])
        assert final == eval_expr(meta["expression"], meta["values"]) >= 1, r
        assert all(1 <= v <= 9 for v in meta["values"].values())
        steps = r["answer"].splitlines()[:-1]
        assert len(steps) == 1 and steps[0].endswith(f" = {final}")
        assert score_item(normalize("gsm8k", [r])[0], f"{steps[0]}\n#### {final}")["correct"]
        assert not score_item(normalize("gsm8k", [r])[0], f"#### {final + 1}")["correct"]


def test_algebra_level_1_answers_recompute_and_score():
    rows = algebra_suite(300, 42, 1)
    assert {r["meta"]["kind"] for r in rows} == {"sum", "difference"}
    for r in rows:
        m = r["meta"]
        ans = parse_latex_number(r["answer"])
        if m["kind"] == "sum":
            assert ans == m["a"] + m["b"]
        else:
            assert ans == m["a"] - m["b"] >= 1 and f"${m['a']} - {m['b']}$" in r["problem"]
        item = normalize("math", [r])[0]
        assert score_item(item, f"so $\\boxed{{{r['answer']}}}$")["correct"]
        assert not score_item(item, f"$\\boxed{{{ans + 1}}}$")["correct"]


def test_algebra_level_0_is_sums_alone_deterministic_a_prefix_and_its_own_stream():
    rows = algebra_suite(300, 11, 0)
    assert rows == algebra_suite(300, 11, 0) and algebra_suite(40, 11, 0) == rows[:40]
    assert algebra_suite(40, 12, 0) != rows[:40]
    # adding level 0 changed no published row of levels 1 and 2
    assert [r["problem"] for r in algebra_suite(4, 11, 1)] != [r["problem"] for r in rows[:4]]
    assert algebra_suite(20, 11) == algebra_suite(20, 11, 2)
    pairs = set()
    for r in rows:
        m = r["meta"]
        assert m["kind"] == "sum" and 2 <= m["a"] <= 9 and 2 <= m["b"] <= 9, r
        assert r["problem"] == f"Compute ${m['a']} + {m['b']}$." and r["id"].startswith("algebra-11-")
        assert parse_latex_number(r["answer"]) == m["a"] + m["b"]
        item = normalize("math", [r])[0]
        assert score_item(item, r["solution"])["correct"]
        assert not score_item(item, f"$\\boxed{{{m['a'] + m['b'] + 1}}}$")["correct"]
        pairs.add((m["a"], m["b"]))
    # never the shots' own worked example, otherwise every pair of single digits 2..9
    assert (4, 3) not in pairs and len(pairs) > 50


def test_generated_source_level_and_shots_prompt(tmp_path):
    from pairaudit.datasets.formats import SHOTS, DatasetError, load_source, prepare_dataset

    rows, prov = load_source({"generated": {"kind": "arith", "n": 4, "seed": 7, "level": 1}}, cache_dir=tmp_path)
    assert rows == arith_suite(4, 7, 1) and prov["level"] == 1
    _, prov2 = load_source({"generated": {"kind": "arith", "n": 4, "seed": 7}}, cache_dir=tmp_path)
    assert prov2["level"] == 2 and prov2["sha256"] != prov["sha256"]
    with pytest.raises(DatasetError, match=r"generated\.level: 5 is not one of 1, 2"):
        load_source({"generated": {"kind": "arith", "n": 4, "seed": 7, "level": 5}}, cache_dir=tmp_path)
    with pytest.raises(DatasetError, match=r"generated\.level: 0 is not one of 1, 2"):
        load_source({"generated": {"kind": "arith", "n": 4, "seed": 7, "level": 0}}, cache_dir=tmp_path)
    rows0, prov0 = load_source({"generated": {"kind": "algebra", "n": 4, "seed": 11, "level": 0}}, cache_dir=tmp_path)
    assert rows0 == algebra_suite(4, 11, 0) and prov0["level"] == 0
    doc = prepare_dataset({"name": "a", "format": "gsm8k", "source": {"generated": {"kind": "arith", "n": 4,
                                                                                     "seed": 7, "level": 1}},
                           "select": {"count": "all"}, "prompt_template": "shots"}, cache_dir=tmp_path,
                          base_dir=tmp_path)
    msgs = doc["items"][0]["messages"]
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert msgs[2]["content"] == SHOTS["gsm8k"][0][1] and "#### 8" in msgs[2]["content"]
    assert msgs[-1]["content"].startswith(doc["items"][0]["question"]) and "#### <number>" in msgs[-1]["content"]
    # The worked examples are fixed texts, never items of the suite being audited.
    questions = {r["question"] for r in arith_suite(200, 7, 1)}
    assert not questions & {q for q, _ in SHOTS["gsm8k"]}
