"""Paired statistics for the control/candidate audit.

Everything here works on plain JSON-able data (lists, dicts, numbers) and is
deterministic for a given input (the bootstrap takes an explicit seed).

Input record schemas (one record per dataset item, keyed by ``"index"``):

score record (from the score stage)::

    {"index": int,              # dataset item index, the pairing key
     "correct": bool,           # the scorer's verdict, never adjusted here
     "answered": bool,          # the arm produced an answer to score
     "finish_reason": str|None, # "stop" is a natural finish
     "text": str|None}          # generated text (exact-match comparison)

sampled record (from the sampled stage)::

    {"index": int,
     "body_sha256": str,        # sha256 of the exact request body sent
     "response": object|None,   # full server response
     "error": object|None}      # transport/HTTP error, None on success

Output of :func:`paired_table` (the quality table): ``contracts.PairedTable``.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from pairaudit.core.contracts import ARMS, NATURAL_FINISH, PairedTable, PairingFacts, ScoreRecord

# scipy.stats is imported where it is used: it takes seconds to import, and the
# workflow imports this module (through the rules) every time it loads.


def mcnemar_exact_p(b: int, c: int) -> float:
    """Exact two-sided McNemar p on the discordant counts b and c.

    Under H0 each discordant pair is equally likely to go either way, so
    min(b, c) ~ Binomial(b + c, 1/2); doubling the smaller tail and capping at
    1 gives the two-sided p.
    """
    for name, v in (("b", b), ("c", c)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
            raise ValueError(f"{name} must be a non-negative integer, got {v!r}")
    n = int(b) + int(c)
    if n == 0:
        return 1.0
    from scipy import stats as _st

    return float(min(1.0, 2.0 * _st.binom.cdf(min(b, c), n, 0.5)))


def _by_index(records: Sequence[Mapping[str, Any]], what: str) -> dict[int, Mapping[str, Any]]:
    out: dict[int, Mapping[str, Any]] = {}
    for r in records:
        if not isinstance(r, dict) or "index" not in r:
            raise ValueError(f"{what}: record without an 'index': {r!r}")
        i = r["index"]
        if isinstance(i, bool) or not isinstance(i, int):
            raise ValueError(f"{what}: index must be an int, got {i!r}")
        if i in out:
            raise ValueError(f"{what}: duplicate index {i}")
        out[i] = r
    return out


def paired_table(
    control_scores: Sequence[ScoreRecord],
    candidate_scores: Sequence[ScoreRecord],
    control_records: Sequence[PairingFacts],
    candidate_records: Sequence[PairingFacts],
) -> PairedTable:
    """Pair both arms item by item and build the quality table (schema above).

    The four inputs must cover exactly the same item indices: pairing a
    missing item with nothing would silently change the denominator, so a
    difference is an error that names the indices. Scores are taken as given:
    a strict-extractor miss stays a miss.
    """
    sets = {
        "control_scores": _by_index(control_scores, "control_scores"),
        "candidate_scores": _by_index(candidate_scores, "candidate_scores"),
        "control_records": _by_index(control_records, "control_records"),
        "candidate_records": _by_index(candidate_records, "candidate_records"),
    }
    union = set().union(*(s.keys() for s in sets.values()))
    problems = []
    for name, s in sets.items():
        missing = sorted(union - s.keys())
        if missing:
            problems.append(f"{name} lacks indices {missing}")
    if problems:
        raise ValueError("index sets differ between arms: " + "; ".join(problems))

    cs, ks = sets["control_scores"], sets["candidate_scores"]
    cr, kr = sets["control_records"], sets["candidate_records"]
    idx = sorted(union)

    control_only, candidate_only, both, neither = [], [], 0, 0
    text_match, body_mismatch = [], []
    unnatural: dict[str, list[int]] = {a: [] for a in ARMS}
    unanswered: dict[str, list[int]] = {a: [] for a in ARMS}
    errors: dict[str, list[int]] = {a: [] for a in ARMS}
    for i in idx:
        a, b = bool(cs[i].get("correct")), bool(ks[i].get("correct"))
        if a and b:
            both += 1
        elif a:
            control_only.append(i)
        elif b:
            candidate_only.append(i)
        else:
            neither += 1
        ta, tb = cs[i].get("text"), ks[i].get("text")
        if ta is not None and tb is not None and ta == tb:
            text_match.append(i)
        ha, hb = cr[i].get("body_sha256"), kr[i].get("body_sha256")
        # A missing hash cannot prove identity, so it counts as a mismatch.
        if not ha or not hb or ha != hb:
            body_mismatch.append(i)
        for arm, score, rec in (("control", cs[i], cr[i]), ("candidate", ks[i], kr[i])):
            if score.get("finish_reason") != NATURAL_FINISH:
                unnatural[arm].append(i)
            if rec.get("error") is not None:
                errors[arm].append(i)
            # A transport error is an unanswered item even if a scorer marked
            # it otherwise: there is no primary answer behind the score.
            if not score.get("answered", False) or rec.get("error") is not None:
                unanswered[arm].append(i)

    n = len(idx)
    return {
        "n": n,
        "indices": idx,
        "control_correct": both + len(control_only),
        "candidate_correct": both + len(candidate_only),
        "both_correct": both,
        "neither_correct": neither,
        "control_only": control_only,
        "candidate_only": candidate_only,
        "net": len(candidate_only) - len(control_only),
        "mcnemar_p": mcnemar_exact_p(len(control_only), len(candidate_only)),
        "exact_text_matches": len(text_match),
        "exact_text_match_indices": text_match,
        "bodies_identical": not body_mismatch,
        "body_mismatch_indices": body_mismatch,
        "natural_finish": {a: n - len(unnatural[a]) for a in ARMS},
        "unnatural_finish_indices": unnatural,
        "unanswered_indices": unanswered,
        "error_indices": errors,
    }


def paired_bootstrap_ci(
    control_correct: Sequence[bool],
    candidate_correct: Sequence[bool],
    *,
    n_boot: int = 2000,
    seed: int = 0,
    level: float = 0.95,
) -> dict[str, Any]:
    """Percentile bootstrap CI of accuracy(candidate) - accuracy(control).

    Items are resampled with both arms together, so the pairing (and the
    correlation between arms) is preserved. Reported only; no rule decides on
    it. Returns ``{"diff", "lo", "hi", "level", "n", "n_boot", "seed"}``.
    """
    a = np.asarray(control_correct, dtype=float)
    b = np.asarray(candidate_correct, dtype=float)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError("control_correct and candidate_correct must be equal-length lists")
    if a.size == 0:
        raise ValueError("no items to bootstrap")
    if not 0 < level < 1 or n_boot < 1:
        raise ValueError("need 0 < level < 1 and n_boot >= 1")
    d = b - a
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, d.size, size=(n_boot, d.size))
    means = d[draws].mean(axis=1)
    tail = (1.0 - level) / 2.0
    lo, hi = np.quantile(means, [tail, 1.0 - tail])
    return {
        "diff": float(d.mean()),
        "lo": float(lo),
        "hi": float(hi),
        "level": level,
        "n": int(d.size),
        "n_boot": int(n_boot),
        "seed": int(seed),
    }


def paired_t_interval(diffs: Iterable[float], level: float = 0.95) -> tuple[float, float, float]:
    """(mean, lo, hi): Student-t interval of the mean of paired differences.

    Needs at least two differences (one gives no spread). Zero spread gives
    a degenerate interval at the mean.
    """
    d = np.asarray(list(diffs), dtype=float)
    if d.size < 2:
        raise ValueError("paired_t_interval needs at least 2 differences")
    if not np.all(np.isfinite(d)):
        raise ValueError("differences must be finite")
    if not 0 < level < 1:
        raise ValueError("need 0 < level < 1")
    m = float(d.mean())
    se = float(d.std(ddof=1)) / math.sqrt(d.size)
    from scipy import stats as _st

    half = float(_st.t.ppf((1.0 + level) / 2.0, d.size - 1)) * se
    return m, m - half, m + half


# ------------------------------------------------- minimum detectable effect

MDE_POWER = 0.8  # the conventional 80 %: a loss this large is found four times in five


def _fail_limits(n: int, alpha: float, max_net_loss: int) -> np.ndarray:
    """Per discordant count k = b + c: the largest c for which quality-v1 FAILs (b = k - c), or -1.

    FAIL needs b - c > max_net_loss and the exact two-sided p < alpha, with
    p = 2 * P(Binomial(k, 1/2) <= c) for c < b -- the same formula as
    mcnemar_exact_p. Both conditions hold for every c up to a limit.
    """
    from scipy import stats as _st

    k = np.arange(n + 1)
    # ppf gives the smallest c with cdf >= alpha/2; the answer is next to it.
    # Checking its neighbours with the exact test formula keeps float edge
    # cases (a cdf exactly at alpha/2) on the same side as mcnemar_exact_p.
    c0 = np.nan_to_num(_st.binom.ppf(alpha / 2.0, k, 0.5), nan=-1.0).astype(int)
    lim: Any = np.full(n + 1, -1, dtype=int)
    for shift in (-2, -1, 0, 1):
        c = c0 + shift
        ok = (c >= 0) & (c <= k) & (2.0 * _st.binom.cdf(c, k, 0.5) < alpha)
        lim = np.where(ok, np.maximum(lim, c), lim)
    return np.minimum(lim, (k - max_net_loss - 1) // 2).clip(min=-1)


def mcnemar_loss_power(n: int, p_control_only: float, p_candidate_only: float, *, alpha: float = 0.05,
                       max_net_loss: int = 0, _limits: np.ndarray | None = None) -> float:
    """Exact probability that quality-v1 FAILs n paired items (b - c > max_net_loss and McNemar p < alpha).

    Items are independent; each is control-only with probability
    p_control_only, candidate-only with p_candidate_only, concordant
    otherwise. Summed exactly over the discordant count k ~ Binomial(n, pd)
    and, given k, c ~ Binomial(k, p_candidate_only / pd).
    """
    pb, pc = float(p_control_only), float(p_candidate_only)
    if n < 0 or pb < 0 or pc < 0 or pb + pc > 1 + 1e-12:
        raise ValueError(f"need n >= 0 and probabilities with pb + pc <= 1, got n={n}, pb={pb}, pc={pc}")
    pd = min(1.0, pb + pc)
    if n == 0 or pd == 0:
        return 0.0
    from scipy import stats as _st

    lim = _fail_limits(n, alpha, max_net_loss) if _limits is None else _limits
    k = np.arange(n + 1)
    given_k = np.where(lim >= 0, _st.binom.cdf(lim, k, pc / pd), 0.0)
    return float(np.sum(_st.binom.pmf(k, n, pd) * given_k))


def minimum_detectable_loss(n: int, discordant: int, *, alpha: float = 0.05, power: float = MDE_POWER,
                            max_net_loss: int = 0) -> dict[str, Any]:
    """The smallest expected net loss (in items) a paired table of n items would FAIL with the given power.

    A net loss of d items is control_only - candidate_only = d in
    expectation: per item pb - pc = d / n. The discordance pb + pc is
    estimated by the observed discordant fraction (b + c) / n, raised to
    d / n when that is smaller (a loss of d items needs at least d discordant
    items). Power is exact (mcnemar_loss_power) for quality-v1's FAIL region,
    so "no significant loss" on this table means "no loss of ``net_loss``
    items or more, four times in five" -- not "no loss". ``net_loss`` is
    None when no loss of up to n items reaches the power (e.g. n < 6 at
    alpha 0.05: even b = n, c = 0 has p >= 0.0625).
    """
    for name, v in (("n", n), ("discordant", discordant), ("max_net_loss", max_net_loss)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
            raise ValueError(f"{name} must be a non-negative integer, got {v!r}")
    if discordant > n:
        raise ValueError(f"discordant {discordant} > n {n}")
    if not 0 < alpha < 1 or not 0 < power < 1:
        raise ValueError("need 0 < alpha < 1 and 0 < power < 1")
    out: dict[str, Any] = {"net_loss": None, "rate": None, "power": None, "target_power": power,
                           "alpha": alpha, "max_net_loss": int(max_net_loss), "n": int(n),
                           "discordant": int(discordant), "discordance": (discordant / n) if n else None,
                           "method": "exact McNemar power of quality-v1's FAIL region; discordance = "
                                     "max(observed (b + c) / n, d / n)"}
    if n == 0:
        return out
    lim = _fail_limits(n, alpha, max_net_loss)
    q = discordant / n
    # Power grows with d (more discordance, and more of it the control's way),
    # so the first d that reaches the target is the minimum.
    for d in range(max_net_loss + 1, n + 1):
        delta = d / n
        pd = max(q, delta)
        pw = mcnemar_loss_power(n, (pd + delta) / 2, (pd - delta) / 2, alpha=alpha,
                                max_net_loss=max_net_loss, _limits=lim)
        if pw >= power:
            out.update(net_loss=d, rate=delta, power=pw)
            break
    return out


# ------------------------------------------- the paired loss's confidence bound

def _check_counts(b: int, c: int, n: int) -> None:
    for name, v in (("b", b), ("c", c), ("n", n)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
            raise ValueError(f"{name} must be a non-negative integer, got {v!r}")
    if b + c > n:
        raise ValueError(f"discordant items b + c = {b + c} exceed the items n = {n}")


def tango_score(b: Any, c: Any, n: Any, delta: Any) -> Any:
    """Tango's score statistic for H0: loss = delta on a paired table (numpy-broadcast over its inputs).

    The loss is accuracy(control) - accuracy(candidate) = (b - c) / n, with
    b the control-only and c the candidate-only items (Tango's p12 - p21).
    Under H0 the nuisance p21 (the chance of a candidate-only item) is its
    maximum-likelihood estimate restricted to loss = delta, the positive
    root of 2n q^2 + (-b - c + (2n - b + c) delta) q - c delta (1 - delta) = 0;
    then Z = (b - c - n delta) / sqrt(n (2 q + delta (1 - delta))).
    Tango T. (1998), Statistics in Medicine 17:891-908 (with the 1999
    correction, 18:3511-3513). Z falls as delta grows.
    """
    b, c, n, d = (np.asarray(x, dtype=float) for x in (b, c, n, delta))
    a2 = 2.0 * n
    bq = -b - c + (2.0 * n - b + c) * d
    cq = -c * d * (1.0 - d)
    q = (np.sqrt(np.maximum(bq * bq - 4.0 * a2 * cq, 0.0)) - bq) / (2.0 * a2)
    var = n * (2.0 * q + d * (1.0 - d))
    num = b - c - n * d
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(var > 0, num / np.sqrt(np.where(var > 0, var, 1.0)),
                     np.where(num > 0, np.inf, np.where(num < 0, -np.inf, 0.0)))
    return z


def loss_upper_bound(b: int, c: int, n: int, level: float) -> float:
    """One-sided upper confidence bound, at ``level``, of the loss (b - c) / n: Tango's score bound.

    The largest delta that Tango's score test does not reject against a
    smaller loss at one-sided level 1 - level: the root of
    Z(delta) = -z_level above the observed loss (1.0 when none is below 1).
    """
    _check_counts(b, c, n)
    if not 0 < level < 1:
        raise ValueError(f"need 0 < level < 1, got {level!r}")
    if n == 0:
        return 1.0
    from scipy import optimize as _opt
    from scipy import stats as _st

    z = float(_st.norm.ppf(level))
    lo = (b - c) / n
    hi = 1.0 - 1e-12
    f = lambda d: float(tango_score(b, c, n, d)) + z  # noqa: E731  (falls with d)
    if f(hi) >= 0:
        return 1.0
    if f(lo) <= 0:   # only when z <= 0 (level <= 0.5): the point estimate is already beyond
        return lo
    return float(_opt.brentq(f, lo, hi, xtol=1e-12, rtol=1e-12))


# ------------------------------------- items for the loss bound to clear a margin

NONINFERIORITY_SCAN = 64   # counts after the first crossing that must all reach the power (the saw-tooth check)


def noninferiority_pass(b: Any, c: Any, n: Any, margin: float, level: float) -> Any:
    """quality-v2's PASS clause: Tango's score test rejects ``loss >= margin`` at one-sided ``level``.

    Equivalent to the Tango upper bound (``loss_upper_bound``) lying below
    the margin; stated as the test so that the gate and the sizing decide
    the same tables bit for bit.
    """
    from scipy import stats as _st

    return tango_score(b, c, n, margin) < -float(_st.norm.ppf(level))


def _pass_power_one(n: int, margin: float, discordance: float, level: float, loss: float) -> float:
    from scipy import stats as _st

    pd = min(1.0, max(0.0, float(discordance)))
    if n <= 0:
        return 0.0
    if pd == 0.0:
        return float(bool(noninferiority_pass(0, 0, n, margin, level)))
    sd = math.sqrt(n * pd * (1.0 - pd))
    lo, hi = max(0, int(n * pd - 12 * sd - 40)), min(n, int(n * pd + 12 * sd + 40))
    k = np.arange(lo, hi + 1)
    pk = _st.binom.pmf(k, n, pd)
    keep = pk > 1e-30
    k, pk = k[keep], pk[keep]
    if k.size == 0:
        return 0.0
    pb = min(1.0, max(0.0, (pd + loss) / (2.0 * pd)))   # P(control-only | discordant)
    bmax = pass_limits(k, n, margin, level)
    given_k = np.where(bmax >= 0, _st.binom.cdf(bmax, k, pb), 0.0)
    return float(np.sum(pk * given_k))


def pass_limits(k: Any, n: int, margin: float, level: float) -> Any:
    """Per discordant count k: the most control-only items b (of k) that quality-v2 still PASSes, or -1.

    For fixed k and n, more control-only items means a larger loss, so the
    PASS clause holds for every b up to a limit; found by bisection on each
    k at once (tests/test_sizing.py checks it against every b).
    """
    k = np.asarray(k, dtype=np.int64)
    lo = np.full(k.shape, -1, dtype=np.int64)      # passes (sentinel)
    hi = k + 1                                      # fails (sentinel)
    while True:
        open_ = hi - lo > 1
        if not np.any(open_):
            return lo
        mid = (lo + hi) // 2
        ok = noninferiority_pass(np.where(open_, mid, 0), np.where(open_, k - mid, 0), n, margin, level)
        lo = np.where(open_ & ok, mid, lo)
        hi = np.where(open_ & ~ok, mid, hi)


def noninferiority_power(n: int, margin: float, discordance: float, *, level: float, loss: float = 0.0) -> float:
    """Exact probability that quality-v2 PASSes n paired items: the loss bound below ``margin``.

    The model of the McNemar sizing: items independent, each discordant
    with probability ``discordance`` (D); among the discordant the
    control-only ones (the candidate's losses) have probability
    (D + loss) / 2D, so the expected loss per item is ``loss`` (fractions,
    not points). Summed over every (control-only, candidate-only) outcome
    whose binomial probability exceeds 1e-30, with the PASS clause itself.
    """
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
        raise ValueError(f"n must be a non-negative integer, got {n!r}")
    if not 0 < margin <= 1 or not 0 < level < 1 or not 0 <= discordance <= 1:
        raise ValueError(f"need 0 < margin <= 1, 0 < level < 1, 0 <= discordance <= 1; got {margin!r}, "
                         f"{level!r}, {discordance!r}")
    if abs(loss) > discordance + 1e-12:
        raise ValueError(f"a loss of {loss!r} needs a discordance of at least that, got {discordance!r}")
    return _pass_power_one(int(n), float(margin), float(discordance), float(level), float(loss))


def noninferiority_items(margin: float, discordance: float, *, level: float, power: float = MDE_POWER,
                         loss: float = 0.0, max_items: int = 100_000) -> dict[str, Any]:
    """Items per dataset for quality-v2 to PASS with ``power``: the loss bound below ``margin``.

    Under ``noninferiority_power``'s model (the candidate's true loss
    ``loss``, 0 = as good as the control). The power is saw-toothed in n
    (a discrete test), so: ``crossing`` is an n found by doubling and then
    bisection whose power reaches the target while n - 1's does not;
    ``items`` is the smallest n from there on after which the next
    ``NONINFERIORITY_SCAN`` counts all reach it too. None when not even
    ``max_items`` items do (or when the loss is not below the margin).
    """
    out: dict[str, Any] = {"items": None, "power": None, "crossing": None, "margin": margin,
                           "discordance": discordance, "level": level, "target_power": power, "loss": loss,
                           "max_items": max_items,
                           "method": "exact power of quality-v2's PASS clause (Tango's score test of loss >= margin "
                                     "at the per-dataset level); discordant items ~ Binomial(n, D), control-only "
                                     "among them ~ Binomial(k, (D + loss) / 2D)"}
    if not 0 < power < 1:
        raise ValueError(f"need 0 < power < 1, got {power!r}")
    if loss >= margin:
        return out

    def pw(n: int) -> float:
        return noninferiority_power(n, margin, discordance, level=level, loss=loss)

    # doubling, then bisection on the first crossing it brackets
    lo, hi = 0, 1
    while pw(hi) < power:
        lo, hi = hi, hi * 2
        if lo >= max_items:
            return out
        hi = min(hi, max_items)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if pw(mid) >= power:
            hi = mid
        else:
            lo = mid
    out["crossing"] = hi
    items, n = hi, hi + 1
    while n <= min(max_items, items + NONINFERIORITY_SCAN):
        if pw(n) < power:
            items = n + 1
        n += 1
    if items > max_items:
        return out
    out.update(items=items, power=pw(items))
    return out
