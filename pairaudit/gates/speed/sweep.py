"""Sweep planning: several candidates against one control in one shared-control bracket (its schedule and
each candidate's windows)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

from pairaudit.gates.speed.design import looks_for

# ----------------------------------------------------- the shared-control bracket
#
# Several candidates against one control: the starts run C, T1, C, T2, ..., Tn, C,
# then T, C for each candidate still undecided, so the bracket stays alternating
# (every even start a control) and every candidate start sits between two control
# starts: its window C-T-C. Windows of one candidate that share a control (T_n's
# last window of a round and its first of the next) form one run, which is
# win2-v4's alternating bracket of that candidate; a candidate with one run is
# exactly win2-v4's bracket.

CONTROL = "control"


@dataclass(frozen=True)
class SweepLayout:
    """Where one candidate's windows lie in a shared-control bracket, and the statistics over them.

    runs: per run of adjacent windows (sharing their inner controls), its control starts and its
    candidate starts (indices into the bracket). others: the bracket's control starts outside every run
    of this candidate, pooled into the start-to-start variance as a group of their own.
    """
    candidate: str
    arms: tuple[str, ...]
    runs: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]
    others: tuple[int, ...]

    @property
    def n_windows(self) -> int:
        return sum(len(t) for _, t in self.runs)

    @property
    def windows(self) -> list[tuple[int, int, int]]:
        """(control before, candidate, control after) per candidate start, in run order."""
        return [(k - 1, k, k + 1) for _, t in self.runs for k in t]

    @property
    def controls(self) -> tuple[int, ...]:
        """The control starts the candidate is compared to: its windows' neighbours."""
        return tuple(sorted(k for c, _ in self.runs for k in c))

    @property
    def starts(self) -> tuple[int, ...]:
        """The candidate's own bracket: its windows' starts in run order."""
        return tuple(sorted({k for c, t in self.runs for k in (*c, *t)}))

    @property
    def factor(self) -> float:
        """Var(gain) / sigma^2: runs weighted by their candidate starts, each run win2-v4's arm_factor."""
        m = self.n_windows
        return sum((len(t) / m) ** 2 * (1.0 / len(t) + 1.0 / len(c)) for c, t in self.runs)

    def gain(self, v: np.ndarray) -> np.ndarray:
        """(..., starts) -> (...): per run the mean of its candidate starts minus that of its controls,
        weighted by the run's candidate starts (within a run both arms' mean position is the run's middle, so
        a linear drift cancels run by run)."""
        m = self.n_windows
        return sum((len(t) / m) * (v[..., list(t)].mean(axis=-1) - v[..., list(c)].mean(axis=-1))
                   for c, t in self.runs)

    def window_var(self, v: np.ndarray) -> tuple[np.ndarray, int]:
        """Start-to-start variance from deviations within groups, each about its own mean: each run's controls,
        all the candidate's starts (the runs' weights make the gain's candidate part their plain mean), the
        other control starts. Orthogonal to every mean the gain is made of, so the t statistic stays exact;
        a drift only inflates it."""
        groups = [c for c, _ in self.runs] + [tuple(k for _, t in self.runs for k in t)] + (
            [self.others] if self.others else [])
        ss = sum(((v[..., list(g)] - v[..., list(g)].mean(axis=-1, keepdims=True)) ** 2).sum(axis=-1)
                 for g in groups)
        df = sum(len(g) - 1 for g in groups)
        return ss / df, df


def sweep_layout(arms: Sequence[str], candidate: str, *, pool_controls: bool = True) -> SweepLayout:
    """The candidate's windows in a shared-control bracket ``arms`` (one arm name per start, ``CONTROL`` or a
    candidate's name); ``pool_controls``: the bracket's other control starts join the variance."""
    arms = tuple(arms)
    if len(arms) < 3 or len(arms) % 2 == 0 or any(a != CONTROL for a in arms[0::2]) or any(
            a == CONTROL for a in arms[1::2]):
        raise ValueError(f"a shared-control bracket alternates control and candidate starts, control first and last, "
                         f"got {list(arms)}")
    mine = [k for k, a in enumerate(arms) if a == candidate]
    if not mine:
        raise ValueError(f"candidate {candidate!r} has no start in the bracket {list(arms)}")
    runs: list[list[int]] = [[mine[0]]]
    for k in mine[1:]:
        if k == runs[-1][-1] + 2:
            runs[-1].append(k)
        else:
            runs.append([k])
    shaped = tuple((tuple(range(r[0] - 1, r[-1] + 2, 2)), tuple(r)) for r in runs)
    inside = {k for c, _ in shaped for k in c}
    others = tuple(k for k in range(0, len(arms), 2) if k not in inside) if pool_controls else ()
    return SweepLayout(candidate=candidate, arms=arms, runs=shaped, others=others)


def sweep_round(arms: Sequence[str], candidates: Sequence[str], open_: Iterable[str]) -> list[str]:
    """The starts a shared-control bracket appends next: the first round C, T1, C, ..., Tn, C on an empty
    bracket, later rounds T, C for each candidate still open (undecided, budget left), in bracket order."""
    if len(set(candidates)) != len(candidates) or CONTROL in candidates or not candidates:
        raise ValueError(f"candidates must be distinct names other than {CONTROL!r}, got {list(candidates)}")
    if not arms:
        return [CONTROL] + [a for c in candidates for a in (c, CONTROL)]
    wanted = set(open_)
    return [a for c in candidates if c in wanted for a in (c, CONTROL)]


def sweep_windows(arms: Sequence[str], candidate: str) -> int:
    """How many windows (candidate starts) a candidate has in the bracket so far."""
    return sum(1 for a in arms if a == candidate)


def sweep_next(arms: Sequence[str], candidates: Sequence[str], undecided: Iterable[str], budget: int) -> list[str]:
    """The next round of a shared-control bracket: the first round on an empty bracket, then T, C for each
    undecided candidate with fewer than ``budget`` candidate starts (a decided candidate gets no more)."""
    return sweep_round(arms, candidates, [c for c in undecided if sweep_windows(arms, c) < budget])


def sweep_length(n_candidates: int, max_starts: int) -> int:
    """The most starts a shared-control bracket of ``n_candidates`` may run: every candidate to its budget."""
    return 1 + 2 * n_candidates * looks_for(max_starts)
