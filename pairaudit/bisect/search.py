"""Delta debugging over a change's switches: the smallest set that reproduces an outcome.

The oracle ``moves(subset) -> bool | None`` answers for one subset of the
switches (those on; every other at its rollback value) whether the outcome
is the candidate's; None means it could not be established (a failed probe).
:func:`find_responsible` first confirms both ends -- every switch on must
move, every switch at rollback must not -- and then searches with the
divide-and-conquer of QuickXplain (Junker 2004) for the switches that are
needed together:

    find(base, C):       # moves(base + C) is known True
        if |C| == 1: return C
        A, B = the first and second half of C
        if moves(base + A): return find(base, A)
        if moves(base + B): return find(base, B)
        RA = find(base + B, A)          # both halves needed: what of A, given all of B
        RB = find(base + RA, B)         # then what of B, given that part of A
        return RA + RB

**The bound.**  For n switches and a result of k switches the search asks at
most ``2 * k * ceil(log2 n)`` subsets, plus the two confirmations:
``2 * k * ceil(log2 n) + 2`` (:func:`bound`).  Why: every call of ``find``
returns a non-empty part of the final result, and the calls at one depth of
the recursion work on disjoint halves, so there are at most k calls per
depth; a call with more than one switch is at depth < ceil(log2 n) (each
depth halves the set, the larger half being ceil(|C|/2)), and asks at most
two subsets.  This holds whatever the oracle answers.  The confirmations are
part of the bound because without them a result means nothing: a divergence
that every-switch-on does not reproduce (nondeterminism, or an effect a
single teacher-forced step cannot show) has no responsible switches, and one
that the rollback server itself reproduces is not the change's.

**What is guaranteed.**  The set returned was itself asked and moved (every
set ``find`` returns is, with its base, a subset the oracle answered True:
by induction over the three ways it returns).  It is minimal -- no switch
can be dropped -- when the oracle is monotone (adding switches never undoes a
move), which a change's switches usually are; a set that only moves the
outcome together is found as that set.  ``moves`` results are memoized per
subset: a subset is never asked twice.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Literal, Sequence

Outcome = bool | None
Status = Literal["found", "not_reproduced", "moves_without_switches", "undecided"]


def bound(n: int, k: int) -> int:
    """The most subsets a search over ``n`` switches asks when it finds ``k`` responsible ones (confirmations incl.)."""
    if n < 1:
        raise ValueError(f"a search needs at least one switch, got n={n}")
    return 2 * k * math.ceil(math.log2(n)) + 2


@dataclass(frozen=True)
class Query:
    """One subset the search asked, in switch order, and the oracle's answer."""

    on: tuple[str, ...]
    moved: Outcome


@dataclass
class SearchResult:
    """The outcome of one search (one bisection)."""

    status: Status
    responsible: tuple[str, ...] | None      # None unless status == "found"
    queries: list[Query] = field(default_factory=list)   # distinct subsets, in the order asked
    n: int = 0
    undecided_on: tuple[str, ...] | None = None   # the subset whose answer was None

    @property
    def asked(self) -> int:
        return len(self.queries)

    @property
    def bound(self) -> int:
        return bound(self.n, len(self.responsible or ()))

    def to_json(self) -> dict:
        return {"status": self.status, "responsible": list(self.responsible) if self.responsible is not None else None,
                "asked": self.asked, "bound": self.bound, "n": self.n,
                "undecided_on": list(self.undecided_on) if self.undecided_on is not None else None,
                "queries": [{"on": list(q.on), "moved": q.moved} for q in self.queries]}


class _Undecided(Exception):
    def __init__(self, on: tuple[str, ...]):
        self.on = on


def find_responsible(switches: Sequence[str], moves: Callable[[frozenset[str]], Outcome]) -> SearchResult:
    """The smallest set of ``switches`` that moves the outcome (see the module docstring).

    ``switches`` in the change's order (it fixes how sets are halved, so the
    same answers always give the same queries); ``moves`` gets the set of
    switches that are on.
    """
    names = list(switches)
    if len(set(names)) != len(names) or not names:
        raise ValueError(f"switches must be distinct and at least one: {names}")
    order = {s: i for i, s in enumerate(names)}
    memo: dict[frozenset[str], Outcome] = {}
    result = SearchResult(status="found", responsible=None, n=len(names))

    def ask(on: frozenset[str]) -> bool:
        if on not in memo:
            memo[on] = moves(on)
            result.queries.append(Query(on=tuple(sorted(on, key=order.__getitem__)), moved=memo[on]))
        if memo[on] is None:
            raise _Undecided(tuple(sorted(on, key=order.__getitem__)))
        return bool(memo[on])

    def find(base: frozenset[str], cands: list[str]) -> list[str]:
        if len(cands) == 1:
            return cands
        half = len(cands) // 2
        a, b = cands[:half], cands[half:]
        if ask(base | set(a)):
            return find(base, a)
        if ask(base | set(b)):
            return find(base, b)
        ra = find(base | set(b), a)
        rb = find(base | set(ra), b)
        return ra + rb

    try:
        everything, nothing = ask(frozenset(names)), ask(frozenset())
        if nothing:
            result.status = "moves_without_switches"
        elif not everything:
            result.status = "not_reproduced"
        else:
            found = find(frozenset(), names)
            result.responsible = tuple(sorted(found, key=order.__getitem__))
            assert memo.get(frozenset(found)) is True, "the responsible set is always one the oracle answered"
    except _Undecided as exc:
        result.status, result.responsible, result.undecided_on = "undecided", None, exc.on
    return result
