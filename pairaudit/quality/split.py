"""Code tests judged outside the sandbox: each assertion split into the call to run and the expectation to check.

The in-sandbox harness (``sandbox.run_tests``) runs a test's comparison in the
same interpreter as the program under test, so the program can forge it
(docs/sandbox.md lists how). Here a test is parsed on the host with ``ast``
-- model text is never parsed or run on the host, only dataset text -- into

- the **call**: the expression whose value is being tested (``f(2, 3)``,
  ``set(f(x))``, ``candidate([1, 2])``), the only test text that enters the
  sandbox (``sandbox.run_calls``), one call at a time; and
- the **expectation**: what the value must satisfy, evaluated here and never
  sent to the sandbox.

The sandbox answers each call with plain data (the repr of built-in literal
types, checked by exact type) or says it raised or was not plain; the
comparison is made here, on data read back by ``read_plain``, so an object's
``__eq__``, a patched ``math.isclose``, a forged report or a rewritten
interpreter cannot make it pass.

Forms that split (``plan_mbpp``, ``plan_humaneval``); anything else keeps the
in-sandbox harness, and the item's score record says which path judged it
(``judged_by``):

==============================================  ==========================================
``assert CALL == E`` / ``E == CALL`` / ``!=``   Python ``==`` on plain data
``assert CALL is True|False|None`` / ``is not`` identity of the plain value
``assert CALL`` / ``assert not CALL``           truthiness of the plain value; CALL must be
                                                a call of a name that is not a builtin
``assert math.isclose(CALL, E, rel_tol=..)``    ``math.isclose`` here (``math`` must be
                                                imported by the test, as it must in-sandbox)
``assert abs(CALL - E) < T`` (or ``<=``)        the same arithmetic here
``assert <literal>``                            decided here, no call
==============================================  ==========================================

E (the expectation) must be a literal: ``ast.literal_eval``, or -- for the few
dataset expectations that are not (``set([18, 12])``, ``tuple([...])``,
``2.0 / 3.0``, ``(3 + 5 + 7, 3 * 5 * 7)``) -- the same literals under a closed
set of pure operations evaluated here: the constructors ``set``,
``frozenset``, ``tuple``, ``list``, ``sorted`` of a literal, and ``+ - * / //
%`` and unary minus on numbers below 2**64. Nothing else is evaluated; an
expectation that needs more (a name, a call of the function under test) does
not split. CALL may be any expression built from calls, names, attributes,
subscripts, literals and arithmetic, but no comparison, boolean operator,
conditional, comprehension or lambda: those could carry the test's own check
into the sandbox.

Equality is Python's ``==`` on the plain values, on purpose: it is what the
dataset's assertion says and what honest programs were scored by, so
``True == 1``, ``1 == 1.0`` and ``(1, 2) != [1, 2]`` hold as in the
original test. The exact-type care is on the result: it must be built-in
plain data (a subclass such as a namedtuple or a Counter is read as its base
type's stored data, never through its own methods); anything else -- an
object with a lying ``__eq__``, a generator, a Decimal -- fails, whatever its
``__eq__`` says.
"""

from __future__ import annotations

import ast
import builtins
import math
import operator
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Callable, Literal, TypedDict, get_args

from pairaudit.core.contracts import arm_role
from pairaudit.quality import sandbox

ExpectKind = Literal["eq", "ne", "is", "is_not", "truthy", "falsy", "isclose", "abs_within", "constant"]
JUDGED_BY = ("split", "in_sandbox")
JUDGES = ("auto", "split", "in_sandbox")


@dataclass(frozen=True)
class Assertion:
    """One assertion of a test: the call the sandbox runs and what its value must satisfy here."""
    test: str                    # the assertion's text, for reasons
    call: str | None             # the expression run in the sandbox; None: decided here (a literal assertion)
    kind: ExpectKind
    expected: Any = None         # plain data; never sent to the sandbox
    rel_tol: float = 1e-09       # isclose
    abs_tol: float = 0.0         # isclose; the tolerance of abs_within
    inclusive: bool = False      # abs_within: "<=" rather than "<"


@dataclass(frozen=True)
class SplitPlan:
    assertions: tuple[Assertion, ...]
    call_imports: tuple[str, ...] = ()           # the test's import statements, run before the calls
    alias: tuple[tuple[str, str], ...] = ()      # (name, target) bound for the calls, e.g. candidate -> entry

    @property
    def calls(self) -> list[str]:
        return [a.call for a in self.assertions if a.call is not None]


@dataclass(frozen=True)
class NotSplit:
    """Why a test keeps the in-sandbox harness."""
    why: str


class NotLiteral(ValueError):
    pass


class PlainError(ValueError):
    pass


# ---------------------------------------------------------------- expectations (dataset text, host)

_CONSTRUCTORS: dict[str, Callable[..., Any]] = {"set": set, "frozenset": frozenset, "tuple": tuple, "list": list, "sorted": sorted}
_FOLD = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
         ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod}
_FOLD_CAP = 2 ** 64


def _number(v: Any) -> int | float:
    if type(v) not in (int, float, bool) or (type(v) is int and abs(v) >= _FOLD_CAP):
        raise NotLiteral("only numbers below 2**64 are folded")
    return v


def expected_value(node: ast.expr) -> Any:
    """The value of a literal expectation (see the module docstring); ``NotLiteral`` for anything else."""
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        pass
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _CONSTRUCTORS \
            and not node.keywords and len(node.args) <= 1 and not any(isinstance(a, ast.Starred) for a in node.args):
        args = [expected_value(a) for a in node.args]
        try:
            return _CONSTRUCTORS[node.func.id](*args)
        except (TypeError, ValueError) as exc:
            raise NotLiteral(f"{node.func.id}() of that literal raised {type(exc).__name__}") from None
    if isinstance(node, ast.BinOp) and type(node.op) in _FOLD:
        left, right = _number(expected_value(node.left)), _number(expected_value(node.right))
        try:
            return _FOLD[type(node.op)](left, right)
        except ArithmeticError as exc:
            raise NotLiteral(f"folding raised {type(exc).__name__}") from None
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = _number(expected_value(node.operand))
        return -v if isinstance(node.op, ast.USub) else +v
    try:
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)) and not any(isinstance(e, ast.Starred)
                                                                        for e in node.elts):
            vals = [expected_value(e) for e in node.elts]
            return {ast.Tuple: tuple, ast.List: list, ast.Set: set}[type(node)](vals)
        if isinstance(node, ast.Dict) and None not in node.keys:
            return {expected_value(k): expected_value(v) for k, v in zip(node.keys, node.values) if k is not None}
    except TypeError as exc:
        raise NotLiteral(f"an unhashable key or element: {exc}") from None
    raise NotLiteral(f"{type(node).__name__} is not a literal")


def _is_literal(node: ast.expr) -> bool:
    try:
        expected_value(node)
        return True
    except NotLiteral:
        return False


# ---------------------------------------------------------------- the call side (dataset text, run in the sandbox)

# What a call expression may be built from: nothing that could carry the
# test's own check (a comparison, and/or, a conditional, a comprehension, a
# lambda) into the sandbox.
_CALL_NODES = (ast.Call, ast.Name, ast.Attribute, ast.Subscript, ast.Constant, ast.List, ast.Tuple, ast.Set,
               ast.Dict, ast.UnaryOp, ast.BinOp, ast.keyword, ast.Starred, ast.Slice, ast.expr_context,
               ast.operator, ast.unaryop)


def _call_refusal(node: ast.expr, test_only: frozenset[str]) -> str | None:
    """Why ``node`` cannot be a call expression, or None."""
    for n in ast.walk(node):
        if not isinstance(n, _CALL_NODES):
            return f"the call side holds a {type(n).__name__}"
        if isinstance(n, ast.Name) and n.id in test_only:
            return f"the call uses {n.id!r}, which only the test defines"
    if not any(isinstance(n, ast.Call) for n in ast.walk(node)):
        return "the tested side calls nothing"
    return None


def _is_tested_call(node: ast.expr) -> bool:
    """A call of a name that is not a builtin: the function under test (truthiness is judged on its value)."""
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not hasattr(builtins, node.func.id)


def _text(src: str, node: ast.AST) -> str:
    seg = ast.get_source_segment(src, node)
    if seg is not None:
        try:
            compile(seg, "<call>", "eval")   # compiled, never run: multi-line segments may not stand alone
            return seg
        except SyntaxError:
            pass
    return ast.unparse(node)


def _literal_side(a: ast.expr, b: ast.expr) -> tuple[ast.expr, Any] | None:
    """(the tested expression, the expected value) of a pair whose one side is a literal, else None."""
    if _is_literal(b):
        return a, expected_value(b)
    if _is_literal(a):
        return b, expected_value(a)
    return None


def _num_literal(node: ast.expr) -> float | None:
    try:
        v = expected_value(node)
    except NotLiteral:
        return None
    return v if type(v) in (int, float) else None


def _assertion(stmt: ast.Assert, src: str, *, math_names: frozenset[str],
               test_only: frozenset[str]) -> Assertion | NotSplit:
    test = ast.get_source_segment(src, stmt) or ast.unparse(stmt)
    e = stmt.test

    def call(node: ast.expr, kind: ExpectKind, **kw: Any) -> Assertion | NotSplit:
        why = _call_refusal(node, test_only)
        return NotSplit(why) if why else Assertion(test, _text(src, node), kind, **kw)

    if _is_literal(e):
        return Assertion(test, None, "constant", expected=bool(expected_value(e)))
    if isinstance(e, ast.Compare) and len(e.ops) == 1:
        op, left, right = e.ops[0], e.left, e.comparators[0]
        if isinstance(op, (ast.Eq, ast.NotEq, ast.Is, ast.IsNot)):
            sides = _literal_side(left, right)
            if sides is None:
                return NotSplit("neither side of the comparison is a literal")
            tested, exp = sides
            if isinstance(op, (ast.Eq, ast.NotEq)):
                return call(tested, "eq" if isinstance(op, ast.Eq) else "ne", expected=exp)
            if exp is not True and exp is not False and exp is not None:
                return NotSplit("'is' with a literal other than True, False, None")
            return call(tested, "is" if isinstance(op, ast.Is) else "is_not", expected=exp)
        if isinstance(op, (ast.Lt, ast.LtE)) and isinstance(left, ast.Call) and isinstance(left.func, ast.Name) \
                and left.func.id == "abs" and len(left.args) == 1 and not left.keywords \
                and isinstance(left.args[0], ast.BinOp) and isinstance(left.args[0].op, ast.Sub):
            tol = _num_literal(right)
            inner = left.args[0]
            if tol is None:
                return NotSplit("the tolerance of abs(...) < T is not a number literal")
            sides = _literal_side(inner.left, inner.right)
            if sides is None:
                return NotSplit("neither side of abs(a - b) is a literal")
            tested, exp = sides
            return call(tested, "abs_within", expected=exp, abs_tol=tol, inclusive=isinstance(op, ast.LtE))
        return NotSplit(f"comparison {type(op).__name__} is not a form that splits")
    if isinstance(e, ast.Call) and isinstance(e.func, ast.Attribute) and e.func.attr == "isclose" \
            and isinstance(e.func.value, ast.Name):
        if e.func.value.id not in math_names:
            return NotSplit(f"{e.func.value.id}.isclose where the test imports no math as {e.func.value.id}")
        kws = {k.arg: k.value for k in e.keywords if k.arg is not None}
        if len(e.args) != 2 or set(kws) - {"rel_tol", "abs_tol"} or any(k.arg is None for k in e.keywords):
            return NotSplit("math.isclose with arguments other than (a, b, rel_tol=, abs_tol=)")
        tols = {k: _num_literal(v) for k, v in kws.items()}
        if any(v is None for v in tols.values()):
            return NotSplit("a math.isclose tolerance that is not a number literal")
        sides = _literal_side(*e.args)
        if sides is None:
            return NotSplit("neither argument of math.isclose is a literal")
        tested, exp = sides
        return call(tested, "isclose", expected=exp, **tols)
    if isinstance(e, ast.UnaryOp) and isinstance(e.op, ast.Not) and _is_tested_call(e.operand):
        return call(e.operand, "falsy")
    if _is_tested_call(e):
        return call(e, "truthy")
    return NotSplit(f"assert {type(e).__name__} is not a form that splits")


def _import_names(stmts: Sequence[ast.stmt]) -> tuple[frozenset[str], frozenset[str]]:
    """(names the imports bind, the names bound to the math module)."""
    bound, math_names = set(), set()
    for s in stmts:
        if isinstance(s, ast.Import):
            for a in s.names:
                bound.add(a.asname or a.name.split(".")[0])
                if a.name == "math":
                    math_names.add(a.asname or "math")
        elif isinstance(s, ast.ImportFrom):
            bound.update(a.asname or a.name for a in s.names)
    return frozenset(bound), frozenset(math_names)


def plan_mbpp(tests: Sequence[str], imports: Sequence[str] = ()) -> SplitPlan | NotSplit:
    """Split every MBPP test (one ``assert`` each); one that does not split keeps the whole item in the sandbox."""
    stmts: list[ast.stmt] = []
    for line in imports:
        try:
            stmts += ast.parse(line).body
        except SyntaxError:
            return NotSplit("a test import does not parse")
    _, math_names = _import_names(stmts)
    out = []
    for i, src in enumerate(tests, start=1):
        try:
            body = ast.parse(src).body
        except SyntaxError:
            return NotSplit(f"test {i} does not parse")
        if len(body) != 1 or not isinstance(body[0], ast.Assert):
            return NotSplit(f"test {i} is not a single assert statement")
        a = _assertion(body[0], src, math_names=math_names, test_only=frozenset())
        if isinstance(a, NotSplit):
            return NotSplit(f"test {i}: {a.why}")
        out.append(a)
    return SplitPlan(tuple(out))


def plan_humaneval(test: str, entry_point: str) -> SplitPlan | NotSplit:
    """Split a HumanEval test module: imports, literal assignments (METADATA) and ``def check(candidate)``.

    The check body may hold asserts of the forms above, imports, ``pass`` and
    bare constants or builtin names (no effect); anything else (a loop, an
    assignment, a helper) keeps the item in the sandbox.
    """
    try:
        mod = ast.parse(test)
    except SyntaxError:
        return NotSplit("the test does not parse")
    imports: list[ast.stmt] = []
    test_only: set[str] = set()
    checks = []
    for s in mod.body:
        if isinstance(s, (ast.Import, ast.ImportFrom)):
            imports.append(s)
        elif isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant):
            continue
        elif isinstance(s, ast.Assign) and all(isinstance(t, ast.Name) for t in s.targets) and _is_literal(s.value):
            test_only.update(t.id for t in s.targets if isinstance(t, ast.Name))
        elif isinstance(s, ast.FunctionDef) and s.name == "check":
            checks.append(s)
        else:
            return NotSplit("the test module holds a statement besides imports, literals and check() "
                            f"({type(s).__name__})")
    if len(checks) != 1:
        return NotSplit("the test module does not define check() exactly once")
    chk = checks[0]
    args = chk.args
    if chk.decorator_list or len(args.args) != 1 or args.posonlyargs or args.kwonlyargs or args.vararg \
            or args.kwarg or args.defaults:
        return NotSplit("check() does not take exactly one plain argument")
    param = args.args[0].arg
    asserts: list[ast.Assert] = []
    for s in chk.body:
        if isinstance(s, (ast.Import, ast.ImportFrom)):
            imports.append(s)
        elif isinstance(s, ast.Assert):
            asserts.append(s)
        elif isinstance(s, ast.Pass) or (isinstance(s, ast.Expr) and (
                isinstance(s.value, ast.Constant)
                or (isinstance(s.value, ast.Name) and hasattr(builtins, s.value.id)))):
            continue
        else:
            return NotSplit(f"check() holds a statement that is not an assert or an import ({type(s).__name__})")
    bound, math_names = _import_names(imports)
    test_only -= bound
    out = []
    for i, s in enumerate(asserts, start=1):
        a = _assertion(s, test, math_names=math_names, test_only=frozenset(test_only))
        if isinstance(a, NotSplit):
            return NotSplit(f"assertion {i}: {a.why}")
        out.append(a)
    return SplitPlan(tuple(out), call_imports=tuple(ast.unparse(s) for s in imports),
                     alias=((param, entry_point),))


# ---------------------------------------------------------------- reading results (sandbox text, host)

_PLAIN_NAMES = {"inf": math.inf, "nan": math.nan, "infj": complex(0, math.inf), "nanj": complex(0, math.nan)}
_ATOMS = (int, float, complex, str, bytes, bool, type(None))


def read_plain(text: str) -> Any:
    """Plain data back from the repr the sandbox wrote; ``PlainError`` for anything else.

    ``ast.literal_eval``'s grammar plus what the repr of plain data also
    holds: ``inf``/``nan`` (and their imaginary forms) and ``frozenset(...)``.
    Parsed, never evaluated; dict keys and set elements are hashed only as
    the plain values read here.
    """
    if not isinstance(text, str) or len(text) > sandbox.PLAIN_CAPS["chars"]:
        raise PlainError("not a string within the size cap")
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, MemoryError, RecursionError) as exc:
        raise PlainError(f"does not parse: {type(exc).__name__}") from None
    return _plain(tree.body, 0)


def _plain(n: ast.expr, depth: int) -> Any:
    if depth > sandbox.PLAIN_CAPS["depth"] + 2:
        raise PlainError("nested too deep")
    d = depth + 1
    if isinstance(n, ast.Constant) and type(n.value) in _ATOMS:
        return n.value
    if isinstance(n, ast.Name) and n.id in _PLAIN_NAMES:
        return _PLAIN_NAMES[n.id]
    if isinstance(n, ast.UnaryOp) and isinstance(n.op, (ast.USub, ast.UAdd)):
        v = _plain(n.operand, d)
        if type(v) not in (int, float, complex):
            raise PlainError("a sign on something other than a number")
        return -v if isinstance(n.op, ast.USub) else v
    if isinstance(n, ast.BinOp) and isinstance(n.op, (ast.Add, ast.Sub)):
        # a complex number's repr: (real +/- imag j); its real part may be "-0"
        negated = n.left if isinstance(n.left, ast.UnaryOp) and isinstance(n.left.op, ast.USub) else None
        neg = negated is not None
        re, im = _plain(negated.operand if negated is not None else n.left, d), _plain(n.right, d)
        if type(re) not in (int, float) or type(im) is not complex or im.real != 0:
            raise PlainError("arithmetic other than a complex literal")
        return complex(-float(re) if neg else float(re), im.imag if isinstance(n.op, ast.Add) else -im.imag)
    try:
        if isinstance(n, ast.List):
            return [_plain(e, d) for e in n.elts]
        if isinstance(n, ast.Tuple):
            return tuple(_plain(e, d) for e in n.elts)
        if isinstance(n, ast.Set):
            return {_plain(e, d) for e in n.elts}
        if isinstance(n, ast.Dict):
            if any(k is None for k in n.keys):
                raise PlainError("a ** in a dict")
            return {_plain(k, d): _plain(v, d) for k, v in zip(n.keys, n.values) if k is not None}
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and not n.keywords \
                and n.func.id in ("set", "frozenset") and len(n.args) <= 1:
            arg = _plain(n.args[0], d) if n.args else set()
            if type(arg) is not set:
                raise PlainError(f"{n.func.id}() of something other than a set")
            return set(arg) if n.func.id == "set" else frozenset(arg)
    except TypeError as exc:   # an unhashable key or element
        raise PlainError(f"{type(exc).__name__}: {exc}") from None
    raise PlainError(f"{type(n).__name__} is not plain data")


# ---------------------------------------------------------------- judging (host)

def _short(v: Any, limit: int = 120) -> str:
    text = repr(v)
    return text if len(text) <= limit else text[:limit] + "..."


def _compare(a: Assertion, got: Any) -> bool:
    if a.kind == "eq":
        return bool(got == a.expected)
    if a.kind == "ne":
        return bool(got != a.expected)
    if a.kind == "is":
        return got is a.expected
    if a.kind == "is_not":
        return got is not a.expected
    if a.kind == "truthy":
        return bool(got)
    if a.kind == "falsy":
        return not got
    if a.kind == "isclose":
        return math.isclose(got, a.expected, rel_tol=a.rel_tol, abs_tol=a.abs_tol)
    if a.kind == "abs_within":
        diff = abs(got - a.expected)
        return bool(diff <= a.abs_tol if a.inclusive else diff < a.abs_tol)
    raise ValueError(f"assertion kind {a.kind!r} is not one of {', '.join(get_args(ExpectKind))}")


_WANT = {"eq": "== {e}", "ne": "!= {e}", "is": "is {e}", "is_not": "is not {e}", "truthy": "true", "falsy": "false",
         "isclose": "math.isclose to {e} (rel_tol {r}, abs_tol {t})", "abs_within": "within {t} of {e}"}


def judge(a: Assertion, res: sandbox.CallResult | None) -> tuple[bool, str]:
    """(passed, why) for one assertion and what the sandbox answered for its call."""
    if a.call is None:
        return bool(a.expected), "a literal assertion, decided without a call"
    want = _WANT[a.kind].format(e=_short(a.expected), r=a.rel_tol, t=a.abs_tol)
    if res is None:
        return False, "no answer for its call"
    kind, text = res["kind"], res["text"]
    if kind == "raised":
        return False, f"raised {text}"
    if kind == "not_plain":
        return False, f"returned a {text}: not plain data, so not compared (wanted {want})"
    if kind != "value":
        return False, f"not run: {text}"
    try:
        got = read_plain(text)
    except PlainError as exc:
        return False, f"an unreadable result ({exc})"
    try:
        ok = _compare(a, got)
    except (ArithmeticError, TypeError, ValueError, RecursionError, MemoryError) as exc:
        return False, f"returned {_short(got)}; comparing it raised {type(exc).__name__} (wanted {want})"
    return ok, f"returned {_short(got)}" + ("" if ok else f", wanted {want}")


class SplitFailure(TypedDict):
    test: str               # the assertion's text (first 200 characters)
    why: str


class SplitRun(TypedDict):
    """What ``run_split`` found; ``scoring`` turns it into the score record (``split`` and ``sandbox`` keys)."""
    assertions: int
    calls: int
    failed: list[SplitFailure]       # every failed assertion, in order
    incomplete: str | None           # why some call got no answer (timeout, the program died, the channel broke)
    sandbox: dict                    # the sandbox result, without its per-call answers


def run_split(code: str, plan: SplitPlan, *, imports: Sequence[str] = (), keep: Sequence[str] = (),
              limits: dict) -> SplitRun:
    """Run the program and the plan's calls in the sandbox, then judge every assertion here."""
    res = sandbox.run_calls(code, plan.calls, imports=list(imports), call_imports=list(plan.call_imports),
                            keep=list(keep), alias=dict(plan.alias), **limits)
    answers = res.pop("calls", None) or []
    incomplete = next((r["text"] for r in answers if r["kind"] in ("not_run", "protocol")), None)
    if res["status"] == "error" or (len(answers) != len(plan.calls) and incomplete is None):
        incomplete = res.get("error") or "the sandbox gave no answer"
    it = iter(answers)
    failed: list[SplitFailure] = []
    for a in plan.assertions:
        ok, why = judge(a, next(it, None) if a.call is not None else None)
        if not ok:
            failed.append({"test": a.test[:200], "why": why})
    return {"assertions": len(plan.assertions), "calls": len(plan.calls), "failed": failed,
            "incomplete": incomplete, "sandbox": res}


# ---------------------------------------------------------------- counting (the report)

def judged_counts(score_paths: Sequence[str | os.PathLike]) -> dict[str, dict[str, dict[str, int]]]:
    """dataset -> arm -> {"split": n, "in_sandbox": m} over the code items of the score files (others absent)."""
    from pairaudit.core.artifacts import read_jsonl

    out: dict[str, dict[str, dict[str, int]]] = {}
    for p in score_paths:
        header, records = read_jsonl(p)
        counts = {k: 0 for k in JUDGED_BY}
        for r in records:
            if r.get("judged_by") in counts:
                counts[r["judged_by"]] += 1
        if any(counts.values()):
            # by role: a sweep's candidate arm is named by its change
            out.setdefault(str(header.get("dataset")), {})[arm_role(str(header.get("arm")))] = counts
    return out
