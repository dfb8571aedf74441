"""What every registered decision rule shares: its return shape and how a changed threshold shows.

Every rule is a pure function returning a JSON-able dict::

    {"rule": "<registered name>",   # e.g. "quality-v1"
     "verdict": str,                # rule-specific vocabulary (below)
     "reasons": [str, ...],         # human-readable, names items/clauses
     "params": {...},               # thresholds actually used
     "deviations": {name: {"registered": x, "used": y}},  # non-default params
     ...evidence}

Thresholds are keyword parameters whose defaults are the registered values.
Passing a different value is allowed (a user may register a stricter bar),
but it is never silent: it appears under ``deviations`` and as a reason.

Verdict vocabularies:

- quality-v2:      PASS | FAIL | INCONCLUSIVE (a loss of the margin not ruled out) | INVALID
- quality-v1:      PASS | HOLD | FAIL | INVALID
- grid-tie-v1:     PASS | STOP | INCONCLUSIVE (nothing compared, or a dataset not evaluated)
- determinism-v1:  PASS | STOP
- boundary-v1:     PASS | FAIL | INCONCLUSIVE (no candidate case at all, or a configuration error)
- win2-v1:         WIN | NO_WIN | LOSS | INCONCLUSIVE
- win2-v2, -v3, -v4: WIN | NO_WIN | LOSS | INCONCLUSIVE (too noisy to decide at the bar)
- promotion-v1:    PROMOTE | HOLD | REJECT | INCONCLUSIVE
"""

from __future__ import annotations

from typing import Any


def registered_params(used: dict[str, Any], registered: dict[str, Any]) -> tuple[dict, dict, list[str]]:
    dev = {k: {"registered": registered[k], "used": used[k]}
           for k in registered if used[k] != registered[k]}
    reasons = [f"parameter {k}={v['used']!r} differs from the registered {v['registered']!r}"
               for k, v in dev.items()]
    return dict(used), dev, reasons
