"""The alternating bracket's design and arithmetic, shared by the sequential rules and the sweep planning:
which arm each start runs, the looks, alpha spending over them, the variance factor of the arm means, and the
log scale the gates test on."""

from __future__ import annotations

import functools
import math
from typing import Mapping, Sequence

import numpy as np

SPENDING = ("obf", "bonferroni")


def _q(p: float, df: float | None) -> float:
    """Upper p-quantile: Student-t with ``df`` degrees of freedom, the normal where df is None."""
    from scipy.stats import norm, t  # here: scipy.stats costs a second at the workflow's load

    return float(norm.ppf(p)) if df is None else float(t.ppf(p, df))


def bracket_arms(n_starts: int) -> list[str]:
    """The arms of an alternating bracket of ``n_starts`` starts: control, candidate, control, ..."""
    if n_starts < 3 or n_starts % 2 == 0:
        raise ValueError(f"a bracket has an odd number of starts >= 3 (control first and last), got {n_starts}")
    return ["control" if k % 2 == 0 else "candidate" for k in range(n_starts)]


def looks_for(max_starts: int) -> int:
    """How many times the sequential bracket may decide: after 3, 5, ... max_starts starts."""
    return 1 + (max_starts - 3) // 2


def information_fractions(looks: int) -> tuple[float, ...]:
    """Each look's share of the last look's information: 1 / arm_factor(starts), starts 3, 5, ..."""
    info = [1.0 / arm_factor(3 + 2 * k) for k in range(looks)]
    return tuple(i / info[-1] for i in info)


def obf_spent(alpha: float, t: float) -> float:
    """The Lan-DeMets O'Brien-Fleming-type spending function: how much of one-sided ``alpha`` may be spent by
    information fraction ``t``, 2 (1 - Phi(z_{1-alpha/2} / sqrt t)); all of it at t >= 1."""
    from scipy.stats import norm

    if t >= 1.0:
        return float(alpha)
    if t <= 0.0:
        return 0.0
    return 2.0 * float(norm.sf(float(norm.ppf(1.0 - alpha / 2.0)) / math.sqrt(t)))


@functools.lru_cache(maxsize=512)
def obf_levels(alpha: float, fractions: tuple[float, ...], grid: int = 801) -> tuple[float, ...]:
    """One-sided nominal levels per look of a group-sequential test, O'Brien-Fleming-type spending.

    The Lan-DeMets spending function (``obf_spent``) gives how much of alpha may be spent by information
    fraction t; ``gs_levels`` solves each look's boundary so that the chance of a first crossing there,
    under no effect, is exactly that look's increment. Returns P(Z >= c_k) per look: the level each look
    tests at.
    """
    return gs_levels(fractions, tuple(obf_spent(alpha, t) for t in fractions), grid)


@functools.lru_cache(maxsize=4096)
def gs_levels(infos: tuple[float, ...], spent: tuple[float, ...], grid: int = 801) -> tuple[float, ...]:
    """One-sided nominal levels per look of a group-sequential test that has spent ``spent[k]`` of its alpha
    by look k (cumulative, non-decreasing), the looks at information ``infos`` (any scale: only ratios count).

    The score process is a Brownian motion in the information; its density below the earlier boundaries is
    carried from look to look on a grid (the Armitage-McPherson-Rowe recursion), so the levels are
    deterministic. A design whose planned size moves between looks (win2-v5 re-sizes from the variance)
    passes the fraction each look had of the size planned at that look: what was spent stays spent.
    """
    from scipy.optimize import brentq
    from scipy.special import ndtr, ndtri

    # ndtr and a numpy density, not scipy.stats: the same values without its per-call overhead, which made
    # a plan of many looks cost seconds
    def pdf(x):
        return np.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)

    fractions = [i / infos[-1] for i in infos]
    levels: list[float] = []
    xs = dens = None
    prev_t, prev_spent = 0.0, 0.0
    for t, cum in zip(fractions, spent):
        inc = max(cum - prev_spent, 1e-300)
        if xs is None:
            b = float(-ndtri(inc)) * math.sqrt(t)
        else:
            sd = math.sqrt(t - prev_t)
            w = np.full(xs.size, xs[1] - xs[0])
            w[0] = w[-1] = w[0] / 2.0
            mass = w * dens

            def cross(bk, mass=mass, sd=sd, xs=xs):
                return float((mass * ndtr((xs - bk) / sd)).sum()) - inc

            lo, hi = xs[-1] - 10.0 * sd, xs[-1] + 10.0 * sd
            b = float(brentq(cross, lo, hi, xtol=1e-10)) if cross(lo) > 0 > cross(hi) else hi
        levels.append(float(ndtr(-b / math.sqrt(t))))
        # the density of the score below this boundary, for the next look
        new = np.linspace(min(b, 0.0) - 9.0 * math.sqrt(t), b, grid)
        if xs is None:
            dens = pdf(new / math.sqrt(t)) / math.sqrt(t)
        else:
            sd = math.sqrt(t - prev_t)
            w = np.full(xs.size, xs[1] - xs[0])
            w[0] = w[-1] = w[0] / 2.0
            dens = (pdf((new[:, None] - xs[None, :]) / sd) / sd) @ (w * dens)
        xs, prev_t, prev_spent = new, t, max(cum, prev_spent)
    return tuple(levels)


def look_level(alpha: float, looks: int, look: int, spending: str) -> float:
    """The one-sided level a test spends at ``look`` (0-based) of ``looks``: alpha / looks, or O'Brien-Fleming's."""
    if spending == "bonferroni":
        return alpha / looks
    if spending == "obf":
        return obf_levels(float(alpha), information_fractions(looks))[look]
    raise ValueError(f"spending {spending!r}: not one of {list(SPENDING)}")


def arm_factor(n_starts: int) -> float:
    """Var(mean of the candidate starts - mean of the control starts) / sigma^2 for an alternating bracket.

    C, T, C, ... C puts both arms' mean position at the bracket's middle, so a
    linear drift of the host cancels in the difference of the arm means, as
    it does in pairing each candidate start with its two neighbours; unlike
    that pairing, the arm means are orthogonal to the within-arm deviations
    the variance is estimated from, so the t statistic is exact.
    """
    n_cand = n_starts // 2
    return 1.0 / n_cand + 1.0 / (n_starts - n_cand)


def _v3_start_values(x: np.ndarray, lower_is_better: bool) -> np.ndarray:
    """(..., repeats, starts) raw values -> (..., starts) per-start means in log-% of the control, oriented.

    Every start runs the same prompts at the same repeat index, so a prompt
    that decodes slower slows every start alike: averaging over repeats per
    start keeps that effect identical in every start, and every difference
    between starts cancels it. Positive metrics are compared on the log scale
    (100 ln(x / geometric mean of the controls), about % for small effects): a
    ratio of speeds is symmetric there, where x / mean - 1 is skewed by the
    noise of its own denominator. A metric that is 0 somewhere (accepted
    drafts without speculation) stays linear, 0 against 0 and +-100 against a
    control of 0 (any drafting beats none).
    """
    x = np.asarray(x, dtype=float)
    positive = (x > 0).all(axis=(-1, -2), keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        lx = np.log(np.where(positive, x, 1.0))
        log_rel = 100.0 * (lx - lx[..., 0::2].mean(axis=(-1, -2), keepdims=True))
        c = x[..., 0::2].mean(axis=(-1, -2), keepdims=True)
        lin = np.where(c != 0, 100.0 * (x / np.where(c != 0, c, 1.0) - 1.0),
                       np.where(x == 0, 0.0, 100.0 * np.sign(x)))
    rel = np.where(positive, log_rel, lin)
    if lower_is_better:
        rel = -rel
    return rel.mean(axis=-2)


def log_bar(pct: float) -> float:
    """A bar in % of the control as a bar on the log scale the gate tests on: 100 ln(1 + pct / 100)."""
    return 100.0 * math.log1p(pct / 100.0)


def pct_of_log(v: float) -> float:
    """A log-scale gain (100 ln ratio) as % of the control."""
    return 100.0 * math.expm1(v / 100.0)


def _v3_gain(m: np.ndarray) -> np.ndarray:
    """(..., starts) -> (...): the mean of the candidate starts minus the mean of the control starts."""
    return m[..., 1::2].mean(axis=-1) - m[..., 0::2].mean(axis=-1)


def _v3_window_var(m: np.ndarray) -> tuple[np.ndarray, int]:
    """Within-arm variance of the start values (a slow drift only inflates it) and its degrees of freedom."""
    c, t = m[..., 0::2], m[..., 1::2]
    nc, nt = c.shape[-1], t.shape[-1]
    ss = ((c - c.mean(axis=-1, keepdims=True)) ** 2).sum(axis=-1)
    if nt > 1:
        ss = ss + ((t - t.mean(axis=-1, keepdims=True)) ** 2).sum(axis=-1)
    df = (nc - 1) + max(0, nt - 1)
    return ss / df, df


def _nums(a: np.ndarray) -> list:
    return [float(v) for v in np.ravel(a)]


def _check_cells(cells: Mapping[str, Mapping[str, Sequence[Sequence[float]]]], roles: Sequence[str],
                 decide: Sequence[str], rule: str) -> tuple[int, int]:
    """(repeats, starts) of a pooled rule's series, or a ValueError naming the cell, metric or role."""
    if len(set(roles)) != len(roles):
        raise ValueError(f"a metric has more than one role: {list(roles)}")
    if not decide:
        raise ValueError(f"{rule} needs at least one deciding cell")
    shapes = set()
    for c in cells:
        missing = [m for m in roles if m not in cells[c]]
        if missing:
            raise ValueError(f"cell {c}: metrics {missing} absent from series")
        for m in roles:
            for rep in cells[c][m]:
                if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in rep):
                    raise ValueError(f"{c}/{m}: every start's value must be a finite number, got {rep!r}")
                shapes.add((len(cells[c][m]), len(rep)))
    if len(shapes) != 1:
        raise ValueError(f"cells and metrics have different repeats x starts: {sorted(shapes)}")
    return shapes.pop()
