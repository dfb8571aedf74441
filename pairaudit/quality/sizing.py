"""How many paired items quality-v1 needs to see a given net loss: its exact McNemar power, inverted.

The model (the same one ``stats.minimum_detectable_loss`` states a finished
table's detectable loss with):

* items are independent; each is *discordant* (one arm right, the other
  wrong) with probability ``D``, the **discordance**: the expected fraction
  of discordant items;
* the **net loss** ``L`` is the expected ``(b - c) / n``, where ``b`` counts
  control-only items (the candidate lost them) and ``c`` candidate-only
  items; so an item is control-only with probability ``(D + L) / 2`` and
  candidate-only with ``(D - L) / 2`` (a loss of ``L`` needs ``D >= L``);
* quality-v1 *sees* the loss when it FAILs the table: ``b - c >
  max_net_loss`` and the exact two-sided McNemar ``p < alpha``.

The power is exact: summed over the discordant count ``k ~ Binomial(n, D)``
and, given ``k``, ``c ~ Binomial(k, (D - L) / (2 D))``, with the FAIL region
of quality-v1 itself (``stats._fail_limits``, the limits ``mcnemar_loss_power``
uses), so what is planned here is what the paired stage will decide. Terms
of ``Binomial(n, D)`` below 1e-30 are left out of the sum (it is exact to
that).

The exact test's power is saw-toothed in ``n``: a discrete test's level
jumps as ``n`` grows, and ``n + 1`` items can have less power than ``n``.
So two numbers come out: ``first_items``, the smallest ``n`` whose power
reaches the target, and ``items``, the smallest ``n`` from which every
larger ``n`` up to the scan limit (twice ``first_items`` plus 50, where the
dips are far above the target) reaches it too. Plan with ``items``.
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from pairaudit.core import stats
from pairaudit.core.settings import QualitySettings

DEFAULT_MAX_ITEMS = 100_000
_TAIL = 1e-30  # pmf terms below this are left out of the power sum
_BATCH = 64  # item counts whose power is summed in one vectorized step


class SizingError(ValueError):
    """A sizing input out of range; the message names the parameter and its allowed values."""


@dataclass(frozen=True)
class SizePlan:
    """What ``items_needed`` found: the items per dataset, and the model it was computed under."""

    loss_pct: float             # net loss to see, percentage points of the items
    discordance: float          # expected fraction of discordant items (0..1)
    alpha: float
    power: float                # the target power
    max_net_loss: int           # quality-v1's tolerated net loss, in items
    items: int | None           # smallest n from which every larger n (to scan_limit) reaches the power
    items_power: float | None   # the power at ``items``
    first_items: int | None     # smallest n whose power reaches the target (a larger n may dip below)
    first_power: float | None
    scan_limit: int             # the largest n looked at
    method: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _check(loss_pct: float, discordance: float, alpha: float, power: float, max_net_loss: int) -> None:
    for name, v in (("loss_pct", loss_pct), ("discordance", discordance), ("alpha", alpha), ("power", power)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise SizingError(f"{name} must be a finite number, got {v!r}")
    if not 0 < loss_pct <= 100:
        raise SizingError(f"loss_pct must be in (0, 100] percentage points, got {loss_pct!r}")
    if not 0 < discordance <= 1:
        raise SizingError(f"discordance must be a fraction in (0, 1], got {discordance!r}")
    if discordance + 1e-12 < loss_pct / 100:
        raise SizingError(f"discordance {discordance!r} is below the loss {loss_pct / 100!r}: a net loss of "
                          f"{loss_pct} % of the items needs at least that fraction of discordant items")
    if not 0 < alpha < 1 or not 0 < power < 1:
        raise SizingError(f"need 0 < alpha < 1 and 0 < power < 1, got alpha={alpha!r}, power={power!r}")
    if isinstance(max_net_loss, bool) or not isinstance(max_net_loss, (int, np.integer)) or max_net_loss < 0:
        raise SizingError(f"max_net_loss must be a non-negative integer, got {max_net_loss!r}")


class _Power:
    """Exact FAIL power of quality-v1 for any n, with the per-k conditional probabilities computed once."""

    def __init__(self, loss: float, discordance: float, alpha: float, max_net_loss: int):
        self.pd = min(1.0, float(discordance))
        # P(candidate-only | discordant); clipped at 0 where the loss takes all the discordance
        self.q = max(0.0, (self.pd - loss) / (2.0 * self.pd))
        self.alpha, self.m = alpha, int(max_net_loss)
        self.g = np.zeros(0)
        self.lfact = np.zeros(0)  # log(j!) for j = 0..size-1: the binomial coefficients by lookup

    def _grow(self, n: int) -> None:
        if n < self.g.size:
            return
        from scipy import stats as _st

        size = max(n + 1, 2 * self.g.size, 1024)
        lim = stats._fail_limits(size - 1, self.alpha, self.m)  # quality-v1's FAIL region, per k
        k = np.arange(size)
        self.g = np.where(lim >= 0, _st.binom.cdf(lim, k, self.q), 0.0)
        from scipy.special import gammaln

        self.lfact = gammaln(k + 1.0)

    def batch(self, ns: np.ndarray) -> np.ndarray:
        """The power for each n of ``ns`` (positive, increasing), in one vectorized sum."""
        ns = np.asarray(ns, dtype=np.int64)
        self._grow(int(ns[-1]))
        p = self.pd
        if p >= 1.0:
            return self.g[ns].astype(float)
        mean = ns * p
        width = 12.0 * np.sqrt(ns * p * (1.0 - p)) + 40.0
        while True:
            lo = max(0, int(np.min(mean - width)))
            hi = min(int(ns[-1]), int(np.max(mean + width)) + 1)
            k = np.arange(lo, hi + 1)
            n2, k2 = ns[:, None], k[None, :]
            valid = k2 <= n2
            lf = self.lfact
            logpmf = (lf[n2] - lf[k2] - lf[np.where(valid, n2 - k2, 0)]
                      + k2 * math.log(p) + (n2 - k2) * math.log1p(-p))
            pmf = np.where(valid, np.exp(logpmf), 0.0)
            # widen until the terms left out are negligible: at k = lo for every n, and at k = hi where n > hi
            left_ok = lo == 0 or bool(np.all(pmf[:, 0] < _TAIL))
            right_ok = bool(np.all((ns <= hi) | (pmf[:, -1] < _TAIL)))
            if left_ok and right_ok:
                return pmf @ self.g[lo:hi + 1]
            width *= 2.0

    def __call__(self, n: int) -> float:
        """P(quality-v1 FAILs n items) = sum_k P(K = k) P(c <= lim(k) | k)."""
        if n <= 0:
            return 0.0
        return float(self.batch(np.array([n]))[0])


def fail_power(n: int, loss_pct: float, discordance: float, *, alpha: float = 0.05,
               max_net_loss: int = 0) -> float:
    """Exact probability that quality-v1 FAILs n items under the model (module docstring)."""
    _check(loss_pct, discordance, alpha, 0.5, max_net_loss)
    return _Power(loss_pct / 100.0, discordance, alpha, max_net_loss)(int(n))


def items_needed(loss_pct: float, discordance: float, *, alpha: float = 0.05, power: float = stats.MDE_POWER,
                 max_net_loss: int = 0, max_items: int = DEFAULT_MAX_ITEMS) -> SizePlan:
    """Items per dataset for quality-v1 to FAIL a net loss of ``loss_pct`` points with ``power`` (module docstring).

    ``items`` is None when not even ``max_items`` items reach the power.
    """
    _check(loss_pct, discordance, alpha, power, max_net_loss)
    if isinstance(max_items, bool) or not isinstance(max_items, int) or max_items < 1:
        raise SizingError(f"max_items must be a positive integer, got {max_items!r}")
    pw = _Power(loss_pct / 100.0, discordance, alpha, max_net_loss)
    method = ("exact power of quality-v1's FAIL region (b - c > max_net_loss and exact McNemar p < alpha); "
              "discordant items ~ Binomial(n, D), candidate-only among them ~ Binomial(k, (D - L) / 2D)")
    first, first_p = None, None
    start = 1
    while start <= max_items and first is None:
        ns = np.arange(start, min(max_items, start + _BATCH - 1) + 1)
        values = pw.batch(ns)
        hit = np.flatnonzero(values >= power)
        if hit.size:
            first, first_p = int(ns[hit[0]]), float(values[hit[0]])
        start = int(ns[-1]) + 1
    if first is None:
        return SizePlan(loss_pct, discordance, alpha, power, int(max_net_loss), None, None, None, None,
                        max_items, method)
    limit = min(max_items, 2 * first + 50)
    ns = np.arange(first, limit + 1)
    tail: dict[int, float] = dict(zip(ns.tolist(), np.concatenate([pw.batch(ns[i:i + _BATCH])
                                                                   for i in range(0, ns.size, _BATCH)]).tolist()))
    # the smallest n from which nothing up to the limit dips below the target
    items = first
    for m in range(limit, first - 1, -1):
        if tail[m] < power:
            items = m + 1
            break
    if items > limit:
        return SizePlan(loss_pct, discordance, alpha, power, int(max_net_loss), None, None, first, first_p,
                        limit, method)
    return SizePlan(loss_pct, discordance, alpha, power, int(max_net_loss), items, tail[items], first, first_p,
                    limit, method)


# ------------------------------------------------------------ calibrated discordance

@dataclass(frozen=True)
class CalibratedDiscordance:
    """The discordance an A/A calibration measured per dataset: two starts of the control against each other."""

    log: str
    time: str | None
    audit: str | None             # the calibration audit (<audit>-calibration)
    of_audit: str | None          # the audit it calibrates
    summary_path: str
    datasets: dict[str, tuple[int, int]]   # dataset -> (discordant items, items)

    def rate(self, dataset: str) -> float | None:
        d, n = self.datasets.get(dataset, (0, 0))
        return d / n if n else None


def calibrated_discordance(log_path: str | os.PathLike, *, of_audit: str | None = None) -> CalibratedDiscordance:
    """The latest calibration in the log (of ``of_audit`` when given), its summary read and hash-checked.

    SizingError naming the file when there is none, or when the summary is
    not the file the log recorded (its sha256) or fails its own content hash.
    """
    from pairaudit.core import artifacts, jsonlog
    from pairaudit.core.contracts import CALIBRATION_LOG_SCHEMA, CALIBRATION_SCHEMA

    if not Path(log_path).is_file():
        raise SizingError(f"{log_path}: no calibration log (run `snakemake --cores 4 calibrate` first)")
    lines = [(r.get("time") or "", n, r) for n, r in enumerate(jsonlog.read_log(log_path))
             if r.get("schema") == CALIBRATION_LOG_SCHEMA and (of_audit is None or r.get("of_audit") == of_audit)]
    if not lines:
        which = f" of audit {of_audit!r}" if of_audit else ""
        raise SizingError(f"{log_path}: no calibration{which} in the log")
    entry = max(lines, key=lambda x: (x[0], x[1]))[2]
    path = entry.get("summary_path")
    if not path or not Path(path).is_file():
        raise SizingError(f"{log_path}: the latest calibration's summary {path!r} is not there")
    actual = artifacts.sha256_file(path)
    if actual != entry.get("summary_sha256"):
        raise SizingError(f"{path}: sha256 {actual} is not the {entry.get('summary_sha256')} the calibration log "
                          "recorded: the summary was replaced or edited after the calibration")
    try:
        summary = artifacts.check_schema(artifacts.read_json(path), CALIBRATION_SCHEMA, path)
    except artifacts.ArtifactError as exc:
        raise SizingError(str(exc)) from None
    per = {ds: (int(q.get("discordant") or 0), int(q.get("n") or 0)) for ds, q in (summary.get("quality") or {}).items()}
    return CalibratedDiscordance(log=str(log_path), time=entry.get("time"), audit=entry.get("audit"),
                                 of_audit=entry.get("of_audit"), summary_path=str(path), datasets=per)


# ------------------------------------------------------------ the load-time note

@dataclass(frozen=True)
class SelectedCount:
    """How many items a dataset entry selects, as the load check knows it (``where``: ``datasets[i]``)."""
    where: str
    name: str
    n: int


def detect_loss_notes(quality: QualitySettings, selected: Sequence[SelectedCount], *, audit: str | None,
                      calibration_log: str, base_dir: str | os.PathLike = ".") -> list[str]:
    """Notes for datasets too small to see ``rules.quality.detect_loss_pct`` (none when it is not set).

    Each dataset's selected item count is compared with the items quality-v1
    needs at the smallest discordance the loss allows (every discordant item
    a loss: a lower bound), and, when the calibration log
    (``calibration.log``) holds an A/A calibration of this audit with that
    dataset, at its measured discordance too.
    """
    loss = quality.detect_loss_pct
    if loss is None:
        return []
    alpha, m = quality.alpha, quality.max_net_loss
    log = Path(calibration_log)
    log = log if log.is_absolute() else Path(base_dir) / log
    try:
        cal = calibrated_discordance(log, of_audit=audit) if log.is_file() else None
    except SizingError:
        cal = None
    cal_audit = cal.audit if cal is not None else None
    notes = []
    floor = items_needed(loss, loss / 100, alpha=alpha, max_net_loss=m)
    for sel in selected:
        name, n = sel.name, sel.n
        where = (f"{sel.where} ({name}): {n} selected items cannot see a net loss of {loss:g} points "
                 f"(rules.quality.detect_loss_pct) at alpha {alpha:g} with power {stats.MDE_POWER:g}")
        rate = cal.rate(name) if cal is not None else None
        measured = (items_needed(loss, rate, alpha=alpha, max_net_loss=m)
                    if rate is not None and rate > loss / 100 else None)
        cal_words = ("" if measured is None else
                     f"; the A/A calibration {cal_audit} measured discordance {rate:.3g} there, which needs "
                     + (f"{measured.items} items" if measured.items else f"more than {measured.scan_limit} items"))
        if floor.items is None or n < floor.items:
            notes.append(f"{where}: that needs at least {floor.items or f'more than {floor.scan_limit}'} items even "
                         f"if every discordant item were a loss (discordance {loss / 100:g}){cal_words}")
        elif measured is not None and (measured.items is None or n < measured.items):
            notes.append(f"{where} at the discordance its A/A calibration {cal_audit} measured ({rate:.3g}): that "
                         f"needs {measured.items or f'more than {measured.scan_limit}'} items")
    return notes


# ------------------------------------------------------------ quality-v2: items to rule out the margin

# The discordance assumed when nothing was measured: the embedded default audit's, rounded (8 and 10
# discordant of 32 items, docs/default-audit.md). More discordance needs more items, so a host
# quieter than this is over-provisioned, never under.
DEFAULT_DISCORDANCE = 0.25


@dataclass(frozen=True)
class ExpectedDiscordance:
    """The discordance to plan with, per dataset where measured, and where it came from."""

    source: str                       # "last audit <name> (<decision.json>)", "A/A calibration ...", or "default"
    rates: dict[str, float]           # dataset -> measured discordance
    default: float = DEFAULT_DISCORDANCE

    def rate(self, dataset: str | None) -> float:
        if dataset is not None and dataset in self.rates:
            return self.rates[dataset]
        return max(self.rates.values()) if self.rates else self.default


def expected_discordance(base_dir: str | os.PathLike = ".", *, audit: str | None = None,
                         calibration_log: str | os.PathLike | None = None,
                         ledger: str | os.PathLike | None = None) -> ExpectedDiscordance:
    """What the last audit observed (the ledger's latest non-calibration decision, of ``audit`` when given),
    else what the host's latest A/A calibration observed, else ``DEFAULT_DISCORDANCE``.

    A change's own audit is preferred: an A/A run measures two starts of one
    server, and a candidate that changes answers is discordant more often.
    """
    from pairaudit.core import artifacts, jsonlog

    base = Path(base_dir)
    led = Path(ledger) if ledger is not None else base / "results" / "ledger.jsonl"
    led = led if led.is_absolute() else base / led
    if led.is_file():
        try:
            entries = [e for e in jsonlog.read_log(led) if not e.get("calibration")
                       and (audit is None or e.get("audit") == audit)]
        except (OSError, ValueError):
            entries = []
        for e in reversed(entries):
            path = Path(str(e.get("decision_path") or ""))
            path = path if path.is_absolute() else base / path
            try:
                doc = artifacts.read_json(path)
            except (artifacts.ArtifactError, OSError, ValueError):
                continue
            rates = {ds: (len(s.get("control_only") or []) + len(s.get("candidate_only") or [])) / s["n"]
                     for ds, s in (doc.get("datasets") or {}).items() if s.get("n")}
            if rates:
                return ExpectedDiscordance(f"last audit {e.get('audit')} ({path})", rates)
    log = Path(calibration_log) if calibration_log is not None else base / "results" / "calibrations.jsonl"
    log = log if log.is_absolute() else base / log
    if log.is_file():
        try:
            cal = calibrated_discordance(log, of_audit=audit)
        except SizingError:
            cal = None
        if cal is not None:
            rates = {ds: d / n for ds, (d, n) in cal.datasets.items() if n}
            if rates:
                return ExpectedDiscordance(f"A/A calibration {cal.audit} ({cal.summary_path})", rates)
    return ExpectedDiscordance(f"default {DEFAULT_DISCORDANCE:g} (nothing measured: no ledger entry or A/A "
                               "calibration)", {})


@functools.lru_cache(maxsize=256)
def margin_items(margin_pct: float, discordance: float, level: float, datasets: int,
                 power: float = stats.MDE_POWER) -> dict[str, Any]:
    """Items per dataset for quality-v2 to rule out ``margin_pct`` with ``power`` if the candidate loses
    nothing: ``stats.noninferiority_items`` at the per-dataset (Bonferroni) level -- the arithmetic of the
    rule's own "about M items would"."""
    from pairaudit import gates

    each = gates.per_dataset_level(level, datasets)
    return stats.noninferiority_items(margin_pct / 100.0, discordance, level=each, power=power)


def margin_notes(quality: QualitySettings, selected: Sequence[SelectedCount], *, datasets: int,
                 audit: str | None, base_dir: str | os.PathLike = ".") -> list[str]:
    """Load-time notes: each dataset too small for the quality rule to rule out its margin at the expected
    discordance (a rule that registers a ``margin_pct``, quality-v2; none for the others).

    ``datasets``: how many datasets the audit judges (quality-v2's Bonferroni family).
    A note, not a refusal: the audit still runs, and its quality gates will
    say INCONCLUSIVE with the same count unless the candidate is better
    than expected.
    """
    from pairaudit import gates

    spec = gates.rule(quality.rule, "quality")
    if "margin_pct" not in spec.params:
        return []
    margin, level = float(quality.margin_pct), float(quality.level)
    family = max(1, datasets)
    expected = expected_discordance(base_dir, audit=audit)
    notes = []
    for sel in selected:
        name, n = sel.name, sel.n
        rate = expected.rate(name)
        plan = margin_items(margin, rate, level, family)
        if plan["items"] is not None and n >= plan["items"]:
            continue
        need = f"about {plan['items']} items" if plan["items"] is not None else f"more than {plan['max_items']} items"
        notes.append(f"{sel.where} ({name}): {n} selected items are too few for {spec.name} to rule out a loss of "
                     f"{margin:g} points (rules.quality.margin_pct) at {100 * gates.per_dataset_level(level, family):.4g} "
                     f"% per dataset: at the expected discordance {rate:.3g} ({expected.source}) it would need "
                     f"{need} (power {stats.MDE_POWER:g}, `pairaudit size`); with {n} its quality gate will likely be "
                     "INCONCLUSIVE")
    return notes
