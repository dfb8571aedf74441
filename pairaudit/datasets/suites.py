"""The project's own seeded problem suites (generated here; nothing copied from any dataset).

They give the audit small, license-free, always-available data whose answers
are computed by the generator itself. Each item is drawn from its own RNG
seeded by ``(suite version, seed, item number)``, so the same ``(n, seed)``
always yields the same rows, and ``suite(n, seed)`` is a prefix of
``suite(n + k, seed)``.

Row schemas (the input formats ``pairaudit.datasets.formats.normalize`` reads):

- ``arith_suite`` -> gsm8k format::

    {"id": "arith-<seed>-<i>", "question": str,
     "answer": "<worked steps, one 'x op y = z' per line>\\n#### N",
     "meta": {"template": str, "values": {name: int}, "expression": str}}

  ``expression`` uses only the names in ``values`` and ``+ - *``; its value is N.

- ``algebra_suite`` -> math format::

    {"id": "algebra-<seed>-<i>", "problem": str,
     "solution": "... \\\\boxed{<answer>}", "answer": str (LaTeX),
     "meta": {"kind": "linear" | "expression" | "range_sum" | "fraction_sum", ...parameters}}

  Fractions are rendered ``\\frac{p}{q}`` in lowest terms with the sign in
  front (``-\\frac{3}{4}``); integers plainly.

Difficulty (``level``, default 2): level 2 is the suites as first published
(two-step word problems; linear equations, expressions, range and fraction
sums), so existing ``(n, seed)`` rows never change. Level 1 is one step on
single-digit operands (``a + b`` or ``a - b`` with a positive result): the
embedded 135M model answers it right part of the time, which is what a paired
audit needs (items both arms get right, items neither does, and some on which
they differ). Level 0 (algebra only) is ``Compute $a + b$.`` on single digits,
sums alone: the model gets level 1's mix of sums and differences right about
one time in ten, and the sums alone 30-70 % of the time (docs/default-audit.md).
Each level draws from its own RNG stream, so adding one changes no other
level's rows. The levels of each suite: ``LEVELS[kind]``.
"""

from __future__ import annotations

import random
from fractions import Fraction

SUITE_VERSION = "v1"
LEVELS = {"arith": (1, 2), "algebra": (0, 1, 2)}
DEFAULT_LEVEL = 2

_NAMES = ["Ana", "Ben", "Chloe", "Dev", "Elif", "Farid", "Grace", "Hugo", "Ines", "Jamal",
          "Kira", "Luis", "Mei", "Noor", "Omar", "Priya"]
_OBJECTS = ["apples", "marbles", "stickers", "pencils", "cookies", "shells", "stamps", "beads"]
_CONTAINERS = ["box", "bag", "jar", "crate", "basket"]


def _rng(kind: str, seed: int, i: int, level: int = DEFAULT_LEVEL) -> random.Random:
    # A string seed is hashed with SHA-512 by random.Random: stable across
    # processes and Python builds, independent of PYTHONHASHSEED. Level 2
    # keeps the original stream name so its rows are the published ones.
    stream = kind if level == DEFAULT_LEVEL else f"{kind}-l{level}"
    return random.Random(f"pairaudit-{stream}-{SUITE_VERSION}:{seed}:{i}")


def _check(kind: str, n: int, level: int) -> None:
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if level not in LEVELS[kind] or isinstance(level, bool):
        raise ValueError(f"level must be one of {LEVELS[kind]} for {kind}, got {level!r}")


def _arith_item_l1(rng: random.Random) -> tuple[str, list[str], int, dict, str, str]:
    name = rng.choice(_NAMES)
    friend = rng.choice([n for n in _NAMES if n != name])
    obj = rng.choice(_OBJECTS)
    template = rng.choice(["find_more", "give_away"])
    if template == "find_more":
        a, b = rng.randint(2, 9), rng.randint(2, 9)
        q = f"{name} has {a} {obj} and finds {b} more. How many {obj} does {name} have now?"
        return q, [f"{a} + {b} = {a + b}"], a + b, {"a": a, "b": b}, "a + b", template
    a = rng.randint(3, 9)
    b = rng.randint(1, a - 1)
    q = f"{name} has {a} {obj} and gives {b} of them to {friend}. How many {obj} does {name} have now?"
    return q, [f"{a} - {b} = {a - b}"], a - b, {"a": a, "b": b}, "a - b", template


def _arith_item(rng: random.Random) -> tuple[str, list[str], int, dict, str, str]:
    name = rng.choice(_NAMES)
    friend = rng.choice([n for n in _NAMES if n != name])
    obj = rng.choice(_OBJECTS)
    template = rng.choice(["buy_packs", "give_buy", "fill_use", "wage", "daily_extra"])
    if template == "buy_packs":
        a, b, c = rng.randint(5, 60), rng.randint(2, 9), rng.randint(3, 12)
        q = (f"{name} has {a} {obj}. {name} buys {b} packs with {c} {obj} in each pack. "
             f"How many {obj} does {name} have now?")
        mid = b * c
        steps = [f"{b} * {c} = {mid}", f"{a} + {mid} = {a + mid}"]
        return q, steps, a + mid, {"a": a, "b": b, "c": c}, "a + b * c", template
    if template == "give_buy":
        a = rng.randint(20, 90)
        b = rng.randint(2, a - 5)
        c = rng.randint(2, 40)
        q = (f"{name} had {a} {obj}. {name} gave {b} of them to {friend} and then bought {c} more. "
             f"How many {obj} does {name} have now?")
        steps = [f"{a} - {b} = {a - b}", f"{a - b} + {c} = {a - b + c}"]
        return q, steps, a - b + c, {"a": a, "b": b, "c": c}, "a - b + c", template
    if template == "fill_use":
        box = rng.choice(_CONTAINERS)
        a, b = rng.randint(4, 25), rng.randint(2, 9)
        c = rng.randint(1, a * b - 1)
        q = (f"A {box} holds {a} {obj}. {name} fills {b} of these {box}s and then uses {c} {obj}. "
             f"How many {obj} are left?")
        steps = [f"{a} * {b} = {a * b}", f"{a * b} - {c} = {a * b - c}"]
        return q, steps, a * b - c, {"a": a, "b": b, "c": c}, "a * b - c", template
    if template == "wage":
        a, b, c = rng.randint(8, 30), rng.randint(2, 8), rng.randint(2, 6)
        q = (f"{name} earns ${a} per hour and works {b} hours a day for {c} days. "
             f"How many dollars does {name} earn in total?")
        steps = [f"{a} * {b} = {a * b}", f"{a * b} * {c} = {a * b * c}"]
        return q, steps, a * b * c, {"a": a, "b": b, "c": c}, "a * b * c", template
    # daily_extra
    a, b, c = rng.randint(5, 40), rng.randint(2, 7), rng.randint(1, 30)
    q = (f"{name} reads {a} pages every day for {b} days, and then {c} more pages on the next day. "
         f"How many pages does {name} read altogether?")
    steps = [f"{a} * {b} = {a * b}", f"{a * b} + {c} = {a * b + c}"]
    return q, steps, a * b + c, {"a": a, "b": b, "c": c}, "a * b + c", template


def arith_suite(n: int, seed: int, level: int = DEFAULT_LEVEL) -> list[dict]:
    """``n`` grade-school word problems in GSM8K format (level 1: one step, level 2: two); see the module docstring."""
    _check("arith", n, level)
    make = _arith_item_l1 if level == 1 else _arith_item
    rows = []
    for i in range(n):
        q, steps, ans, values, expr, template = make(_rng("arith", seed, i, level))
        rows.append({
            "id": f"arith-{seed}-{i}",
            "question": q,
            "answer": "\n".join(steps) + f"\n#### {ans}",
            "meta": {"template": template, "values": values, "expression": expr},
        })
    return rows


def latex_number(x: Fraction | int) -> str:
    """Integer as digits, otherwise ``\\frac{p}{q}`` in lowest terms with a leading minus."""
    x = Fraction(x)
    if x.denominator == 1:
        return str(x.numerator)
    sign = "-" if x < 0 else ""
    return f"{sign}\\frac{{{abs(x.numerator)}}}{{{x.denominator}}}"


def _signed(v: int) -> str:
    return f"+ {v}" if v >= 0 else f"- {-v}"


def _algebra_item(rng: random.Random) -> tuple[str, str, Fraction, dict]:
    kind = rng.choice(["linear", "expression", "range_sum", "fraction_sum"])
    if kind == "linear":
        a = rng.choice([k for k in range(-9, 10) if k not in (0, 1, -1)])
        b = rng.randint(-20, 20)
        c = rng.randint(-30, 30)
        x = Fraction(c - b, a)
        problem = f"Solve for $x$: ${a}x {_signed(b)} = {c}$."
        move = f"Subtract {b} from" if b >= 0 else f"Add {-b} to"
        solution = (f"{move} both sides: ${a}x = {c - b}$. "
                    f"Divide by {a}: $x = \\boxed{{{latex_number(x)}}}$.")
        return problem, solution, x, {"kind": kind, "a": a, "b": b, "c": c}
    if kind == "expression":
        a, b, c, d = (rng.randint(2, 15) for _ in range(4))
        total = a + b * c - d * d
        problem = f"Compute ${a} + {b} \\cdot {c} - {d}^2$."
        solution = (f"${b} \\cdot {c} = {b * c}$ and ${d}^2 = {d * d}$, so the value is "
                    f"${a} + {b * c} - {d * d} = \\boxed{{{total}}}$.")
        return problem, solution, Fraction(total), {"kind": kind, "a": a, "b": b, "c": c, "d": d}
    if kind == "range_sum":
        m = rng.randint(-10, 20)
        k = rng.randint(3, 30)
        hi = m + k
        count = hi - m + 1
        value = Fraction((m + hi) * count, 2)
        problem = f"What is the sum of all integers from ${m}$ to ${hi}$, inclusive?"
        solution = (f"There are ${count}$ integers with average $\\frac{{{m} + {hi}}}{{2}}$, "
                    f"so the sum is $\\boxed{{{latex_number(value)}}}$.")
        return problem, solution, value, {"kind": kind, "low": m, "high": hi}
    # fraction_sum
    p1, q1 = rng.randint(1, 9), rng.randint(2, 12)
    p2, q2 = rng.randint(1, 9), rng.randint(2, 12)
    op = rng.choice(["+", "-"])
    value = Fraction(p1, q1) + Fraction(p2, q2) if op == "+" else Fraction(p1, q1) - Fraction(p2, q2)
    problem = (f"Compute $\\frac{{{p1}}}{{{q1}}} {op} \\frac{{{p2}}}{{{q2}}}$. "
               f"Express your answer in simplest form.")
    solution = (f"Over the common denominator ${q1 * q2}$ the result is "
                f"$\\frac{{{p1 * q2} {op} {p2 * q1}}}{{{q1 * q2}}} = \\boxed{{{latex_number(value)}}}$.")
    return problem, solution, value, {"kind": kind, "p1": p1, "q1": q1, "op": op, "p2": p2, "q2": q2}


def _algebra_item_l1(rng: random.Random) -> tuple[str, str, Fraction, dict]:
    # Sums and differences only: "Solve for $x$: $x + a = c$" on single digits
    # was measured near 0 % for the embedded model, too hard to be discordant.
    kind = rng.choice(["sum", "difference"])
    if kind == "sum":
        a, b = rng.randint(2, 9), rng.randint(2, 9)
        return (f"Compute ${a} + {b}$.", f"${a} + {b} = \\boxed{{{a + b}}}$.", Fraction(a + b),
                {"kind": kind, "a": a, "b": b})
    a = rng.randint(3, 9)
    b = rng.randint(1, a - 1)
    return (f"Compute ${a} - {b}$.", f"${a} - {b} = \\boxed{{{a - b}}}$.", Fraction(a - b),
            {"kind": kind, "a": a, "b": b})


def _algebra_item_l0(rng: random.Random) -> tuple[str, str, Fraction, dict]:
    # Sums alone, the form of the shots' first worked example: the embedded
    # model gets level 1's differences wrong often enough to pull that mix
    # below the 30 % a paired audit needs (docs/default-audit.md). The shots'
    # own example (4 + 3) is drawn again, so no item is answered in its prompt.
    a, b = 4, 3
    while (a, b) == (4, 3):
        a, b = rng.randint(2, 9), rng.randint(2, 9)
    return (f"Compute ${a} + {b}$.", f"${a} + {b} = \\boxed{{{a + b}}}$.", Fraction(a + b),
            {"kind": "sum", "a": a, "b": b})


def algebra_suite(n: int, seed: int, level: int = DEFAULT_LEVEL) -> list[dict]:
    """``n`` short algebra/arithmetic problems in MATH format (level 0: sums, 1: one step); see the module docstring."""
    _check("algebra", n, level)
    make = {0: _algebra_item_l0, 1: _algebra_item_l1, 2: _algebra_item}[level]
    rows = []
    for i in range(n):
        problem, solution, value, meta = make(_rng("algebra", seed, i, level))
        rows.append({
            "id": f"algebra-{seed}-{i}",
            "problem": problem,
            "solution": solution,
            "answer": latex_number(value),
            "meta": meta,
        })
    return rows


SUITES = {"arith": ("gsm8k", arith_suite), "algebra": ("math", algebra_suite)}
