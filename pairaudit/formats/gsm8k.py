"""The ``gsm8k`` format: grade-school word problems whose answer is the number on a final ``#### N`` line.

Source row: ``question``, ``answer`` (the worked solution ending ``#### N``),
optionally ``id``. Item reference: ``{"answer": "<number>", "solution": str}``.

Scoring extracts like lm-eval-harness's gsm8k task (the first ``#### N``, the
same regex, the same stripping of ``,``, ``$`` and a trailing ``.``) but
compares the numbers, not the strings: ``#### 72.0``, ``#### 072`` and
``#### 0.50`` equal gold 72, 72 and 0.5. A model that writes the right number
is right. lm-eval compares strings, so its strict score can be lower on the
same answers; every record keeps lm-eval's verdict beside ours
(``lm_eval_exact_match``) and lm-eval's flexible extraction (the last number,
``flexible``), which the lm-eval export writes as its ``flexible-extract``
lines.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from typing import Any

from pairaudit.formats.base import DatasetFormat, FormatError, LmEvalFilter, ScoreContext, required

# lm-eval-harness gsm8k filters (strict takes the first match, flexible the last).
GSM8K_STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")
GSM8K_FLEXIBLE = re.compile(r"(-?[$0-9.,]{2,})|(-?[0-9]+)")
GSM8K_COMPARISON = "numeric"


def final_answer(solution: str) -> str:
    """The number after the last ``####`` of a GSM8K solution, commas removed."""
    if "####" not in solution:
        raise FormatError("gsm8k row: answer has no '#### N' line")
    return solution.rsplit("####", 1)[1].strip().replace(",", "")


def normalize_row(i: int, row: dict, options: Mapping[str, Any]) -> dict:
    q, sol = required("gsm8k", i, row, ("question", "answer"))
    return {"id": str(row.get("id", i)), "question": q,
            "reference": {"answer": final_answer(sol), "solution": sol}}


def normalize_number(text: str) -> str:
    """Strip what lm-eval strips before comparing: ``,``, ``$``, surrounding space, a trailing ``.``."""
    out = text.replace(",", "").replace("$", "").strip()
    if out.endswith("."):
        out = out[:-1]
    return out


def numbers_equal(a: str, b: str) -> bool:
    """Numeric equality of two normalized number strings (72.0 == 72); string equality otherwise."""
    try:
        return Decimal(a) == Decimal(b)
    except (InvalidOperation, ValueError):
        return a == b


def _flexible(text: str) -> str | None:
    matches = GSM8K_FLEXIBLE.findall(text)
    if not matches:
        return None
    last = matches[-1]
    return last[0] or last[1]


def score(item: dict, text: str, ctx: ScoreContext | None = None) -> dict:
    gold = normalize_number(item["reference"]["answer"])
    flex_raw = _flexible(text)
    flex_norm = normalize_number(flex_raw) if flex_raw is not None else None
    flexible = {"extracted": flex_norm,
                "correct": flex_norm is not None and numbers_equal(flex_norm, gold)}
    m = GSM8K_STRICT.search(text)
    if m is None:
        return {"correct": False, "extracted": None, "method": "strict-regex", "gold": gold,
                "reason": "no '#### N' found", "flexible": flexible,
                "comparison": GSM8K_COMPARISON, "lm_eval_exact_match": False}
    got = normalize_number(m.group(1))
    ok = numbers_equal(got, gold)
    lm_eval = got == gold  # lm-eval: the same normalization, then string equality
    reason = (f"strict match '#### {m.group(1)}' == gold {gold}" if ok
              else f"strict match '#### {m.group(1)}' != gold {gold}")
    if ok and not lm_eval:
        reason += " (equal as numbers; lm-eval's string comparison counts it wrong)"
    return {"correct": ok, "extracted": got, "method": "strict-regex", "gold": gold,
            "reason": reason, "flexible": flexible,
            "comparison": GSM8K_COMPARISON, "lm_eval_exact_match": lm_eval}


# Short on purpose: a 135M model with short outputs; each template states the line the scorer reads.
# The shots (two worked exchanges before the question, asked as "brief"): a 135M model told the
# format in words alone rarely writes it; shown it twice, it writes one worked line and the
# `#### N` line, then stops. Fixed texts, not items of any suite.
FORMAT = DatasetFormat(
    name="gsm8k",
    normalize_row=normalize_row,
    templates={
        "default": "{question}\n\nSolve it step by step. End with a final line of the form `#### <number>`.",
        "brief": "{question}\n\nAnswer with only one line: `#### <number>`.",
    },
    shots=(("Mia has 3 shells and finds 5 more. How many shells does Mia have now?", "3 + 5 = 8\n#### 8"),
           ("Leo has 9 cards and gives 4 of them to Sam. How many cards does Leo have now?", "9 - 4 = 5\n#### 5")),
    score=score,
    lmeval_filters=(LmEvalFilter("flexible-extract", "flexible"),),
)
