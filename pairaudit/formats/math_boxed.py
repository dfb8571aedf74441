"""The ``math`` format: competition problems whose answer is the last ``\\boxed{}`` of the reply.

Source row: ``problem``, ``solution`` (optional), ``answer`` (optional: else
the last ``\\boxed{}`` of the solution), optionally ``unique_id`` or ``id``.
Item reference: ``{"answer": str, "solution": str | None}``.

Scoring: the reply's last ``\\boxed{}`` / ``\\fbox{}`` (:mod:`pairaudit.formats.boxed`,
the parser the reference answer is read with) is compared with the gold
answer by math-verify; where math-verify says no (or cannot parse),
identical text up to spacing and ``\\left``/``\\right`` still matches, and
the record says which of the two decided (``method``).
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Mapping
from typing import Any

from pairaudit.formats.base import DatasetFormat, FormatError, ScoreContext, required
from pairaudit.formats.boxed import last_boxed

MATH_VERIFY_TIMEOUT_S = 5
# math-verify has no timeout off the main thread; very long answers are where
# sympy can stall, so they are judged by text only (and the record says so).
MAX_MATH_ANSWER_CHARS = 1000


def normalize_row(i: int, row: dict, options: Mapping[str, Any]) -> dict:
    (problem,) = required("math", i, row, ("problem",))
    sol = row.get("solution")
    answer = row.get("answer")
    if answer is None:
        box = last_boxed(sol or "")
        if box is None:
            raise FormatError(f"math row {i}: no 'answer' field and no \\boxed{{}} in 'solution'")
        answer = box[0]
    return {"id": str(row.get("unique_id", row.get("id", i))), "question": problem,
            "reference": {"answer": str(answer), "solution": sol}}


def normalize_latex(s: str) -> str:
    """A light, conservative normal form: only rewrites that cannot change the value."""
    s = s.strip()
    s = re.sub(r"\\(left|right)(?![a-zA-Z])", "", s)
    s = re.sub(r"\\[,!;: ]", "", s)
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = re.sub(r"\s+", "", s)
    s = s.rstrip(".")
    return s


class _TimeoutLog(logging.Handler):
    """Collects math-verify's own timeout warnings (it returns False on timeout and only logs)."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record):
        msg = record.getMessage()
        if msg.startswith("Timeout during"):
            self.messages.append(msg.split(":")[0])


def math_verify_equal(gold: str, pred: str) -> tuple[bool, str | None]:
    """Equivalence by math-verify; returns (equal, error). Never raises."""
    if len(pred) > MAX_MATH_ANSWER_CHARS:
        return False, f"answer longer than {MAX_MATH_ANSWER_CHARS} chars, not parsed"
    try:
        from math_verify import parse, verify
    except ImportError as exc:  # pragma: no cover - math-verify is a pinned dependency
        return False, f"math-verify unavailable: {exc}"
    # math-verify's own timeouts use SIGALRM, which only works in the main thread;
    # elsewhere they must be off.
    main = threading.current_thread() is threading.main_thread()
    limit = MATH_VERIFY_TIMEOUT_S if main else None
    watch = _TimeoutLog()
    mv_logger = logging.getLogger("math_verify")
    mv_logger.addHandler(watch)
    try:
        g = parse("\\boxed{" + gold + "}", parsing_timeout=limit)
        p = parse("\\boxed{" + pred + "}", parsing_timeout=limit)
        timed_out = f"math-verify timeout ({limit}s): {watch.messages[0]}" if watch.messages else None
        if not g:
            return False, timed_out or "math-verify could not parse the gold answer"
        if not p:
            return False, timed_out or "math-verify could not parse the extracted answer"
        equal = bool(verify(g, p, timeout_seconds=limit))
        if not equal and watch.messages:
            return False, f"math-verify timeout ({limit}s): {watch.messages[0]}"
        return equal, None
    except Exception as exc:  # math-verify/sympy failures must not kill a scoring run
        return False, f"math-verify error: {type(exc).__name__}: {exc}"
    finally:
        mv_logger.removeHandler(watch)


def score(item: dict, text: str, ctx: ScoreContext | None = None) -> dict:
    gold = item["reference"]["answer"]
    box = last_boxed(text)
    if box is None:
        return {"correct": False, "extracted": None, "method": "none", "gold": gold,
                "boxed_command": None, "math_verify": None, "reason": "no \\boxed{} answer found"}
    pred, cmd = box
    equal, error = math_verify_equal(gold, pred)
    mv = {"equal": equal, "error": error}
    base = {"extracted": pred, "gold": gold, "boxed_command": cmd, "math_verify": mv}
    if equal:
        return {**base, "correct": True, "method": "math-verify",
                "reason": f"{cmd} '{pred}' equivalent to gold '{gold}' (math-verify)"}
    # Identical text (up to spacing and \left/\right) is the same answer even
    # where math-verify cannot parse it (e.g. plain words); say so explicitly.
    if normalize_latex(pred) == normalize_latex(gold):
        note = f"; math-verify: {error}" if error else "; math-verify said not equal"
        return {**base, "correct": True, "method": "normalized-string",
                "reason": f"{cmd} '{pred}' matches gold '{gold}' as normalized text{note}"}
    why = f" ({error})" if error else ""
    return {**base, "correct": False, "method": "math-verify",
            "reason": f"{cmd} '{pred}' not equivalent to gold '{gold}'{why}"}


# The shots: two worked exchanges before the question, asked as "brief" (gsm8k's module says why).
FORMAT = DatasetFormat(
    name="math",
    normalize_row=normalize_row,
    templates={
        "default": "{question}\n\nSolve it step by step and put the final answer in \\boxed{{}}.",
        "brief": "{question}\n\nGive only the final answer, written in \\boxed{{}}.",
    },
    shots=(("Compute $4 + 3$.", "$4 + 3 = \\boxed{7}$"), ("Compute $8 - 5$.", "$8 - 5 = \\boxed{3}$")),
    score=score,
)
