"""boundary-v1: long-context retrieval and the capacity tail -> PASS | FAIL | INCONCLUSIVE.

Stated in full, with its clauses and history, in docs/rules.md."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from pairaudit.core.contracts import NATURAL_FINISH

# The capacity tail (max_model_len - 16 input, 16 output) is the case the
# boundary gate exists for; a boundary run without it is not the gate.
CAPACITY_TAIL_CASE = "tail-16"


BOUNDARY_REQUIRED_CASES = (CAPACITY_TAIL_CASE,)


def boundary_missing_cases(result: Mapping[str, Any]) -> list[str]:
    """Required boundary cases absent from a boundary-v1 result's candidate cases."""
    have = set(result.get("candidate_cases") or [])
    return [c for c in BOUNDARY_REQUIRED_CASES if c not in have]


def boundary_v1(cases: Sequence[Mapping[str, Any]]) -> dict:
    """boundary-v1: every candidate case correct with natural EOS.

    cases: ``[{"arm": "control"|"candidate", "case": str, "correct": bool,
    "finish_reason": str, "expected": str, "text": str, "config_error": str|None}]``.
    Control failures are listed beside the verdict and never excuse a
    candidate failure. A set with no candidate case has shown nothing:
    INCONCLUSIVE. A case the server refused as a request (``config_error``,
    e.g. HTTP 400 for a length over max_model_len) is a configuration error,
    not a model failure: it makes the verdict INCONCLUSIVE unless a real
    candidate failure elsewhere already FAILs.
    """
    fails: dict[str, list[dict[str, Any]]] = {"control": [], "candidate": []}
    seen: dict[str, list[str]] = {"control": [], "candidate": []}
    config_errors: list[dict[str, Any]] = []
    texts: dict[str, dict[str, Any]] = {}
    for c in cases:
        arm = c.get("arm")
        if arm not in fails:
            raise ValueError(f"unknown arm {arm!r} in boundary case {c.get('case')!r}")
        seen[arm].append(c["case"])
        texts.setdefault(c["case"], {})[arm] = c.get("text")
        if c.get("config_error"):
            config_errors.append({"arm": arm, "case": c["case"], "config_error": c["config_error"]})
            continue
        ok = bool(c.get("correct")) and c.get("finish_reason") == NATURAL_FINISH
        if not ok:
            fails[arm].append({"case": c["case"], "correct": bool(c.get("correct")),
                               "finish_reason": c.get("finish_reason"),
                               "expected": c.get("expected"), "text": c.get("text")})
    reasons = [f"configuration error: {e['arm']} {e['case']} refused by the server: {e['config_error']}"
               for e in config_errors]
    for f in fails["candidate"]:
        reasons.append(f"candidate {f['case']}: correct={f['correct']} finish_reason={f['finish_reason']!r} "
                       f"expected {f['expected']!r} got {f['text']!r}")
    for f in fails["control"]:
        reasons.append(f"control {f['case']} also fails (reported beside; excuses nothing): "
                       f"correct={f['correct']} finish_reason={f['finish_reason']!r}")
    if not seen["candidate"]:
        verdict = "INCONCLUSIVE"
        reasons.append("no candidate boundary case was run")
    elif fails["candidate"]:
        verdict = "FAIL"
    elif config_errors:
        verdict = "INCONCLUSIVE"
        reasons.append(f"{len(config_errors)} case(s) not evaluated because of a configuration error; "
                       "fix the boundary lengths or the arm's max_model_len")
    else:
        verdict = "PASS"
        reasons.append(f"all {len(seen['candidate'])} candidate cases correct with natural EOS")
    identical = sorted(k for k, v in texts.items()
                       if "control" in v and "candidate" in v and v["control"] == v["candidate"])
    return {"rule": "boundary-v1", "verdict": verdict, "reasons": reasons, "params": {},
            "deviations": {}, "candidate_failures": fails["candidate"],
            "control_failures": fails["control"], "candidate_cases": seen["candidate"],
            "control_cases": seen["control"], "identical_text_cases": identical,
            "config_errors": config_errors}
