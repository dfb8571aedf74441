"""promotion-v1: the gates' verdicts -> PROMOTE | HOLD | REJECT | INCONCLUSIVE.

Stated in full, with its clauses and history, in docs/rules.md."""

from __future__ import annotations

from typing import Any, Mapping

# How each gate verdict bears on the decision. Unknown verdicts are treated as
# incomparable evidence, never as a pass.
_GATE_OUTCOME = {
    "PASS": "PROMOTE", "WIN": "PROMOTE",
    "FAIL": "REJECT", "LOSS": "REJECT",
    "HOLD": "HOLD", "STOP": "HOLD", "NO_WIN": "HOLD",
    "INVALID": "INCONCLUSIVE", "INCONCLUSIVE": "INCONCLUSIVE",
}


_PRECEDENCE = ("REJECT", "HOLD", "INCONCLUSIVE", "PROMOTE")


NO_CHANGE = "no change under audit"


def promotion_v1(gates: Mapping[str, Mapping[str, Any] | None], *, identical_arms: bool = False) -> dict:
    """promotion-v1: one decision from every gate's rule result.

    gates: name -> rule result (with "verdict") or None (not evaluated).
    Mapping of gate verdicts:

    - PASS, WIN -> may promote;
    - FAIL, LOSS -> REJECT;
    - HOLD, STOP, NO_WIN -> HOLD (NO_WIN: the speed gain is not shown, which
      is a finding of the measured bracket, not missing evidence);
    - INVALID, INCONCLUSIVE, None, missing/unknown verdict -> INCONCLUSIVE
      (incomplete or incomparable evidence).
    - a gate result with ``"informational": true`` (speed with config
      ``speed.informational``) gates only through REJECT: its LOSS/FAIL
      still rejects; any other verdict (WIN, NO_WIN, INCONCLUSIVE) gets the
      outcome INFORMATIONAL, is reported, and neither allows nor blocks. A
      decision of only informational gates is INCONCLUSIVE.

    Precedence REJECT > HOLD > INCONCLUSIVE > PROMOTE: a failure found
    anywhere rejects whatever else is missing; a concern found by an
    evaluated gate stands even if other evidence is incomplete (completing it
    cannot lift the concern); a missing gate never allows PROMOTE. No gates
    at all is INCONCLUSIVE. Every gate gets one reason line.

    identical_arms (control and candidate are the same server spec, and the
    decision is not an A/A calibration): INCONCLUSIVE, "no change under
    audit", whatever the gates say -- there is no change to promote or to
    reject, and a gate that flags something there flagged noise. The gates'
    own verdict is kept as ``gate_verdict``.
    """
    per_gate, reasons, not_evaluated, informational = {}, [], [], []
    by_outcome: dict[str, list[str]] = {k: [] for k in _PRECEDENCE}
    for name, res in gates.items():
        if res is None:
            v, rule, outcome = None, None, "INCONCLUSIVE"
            not_evaluated.append(name)
            reasons.append(f"{name}: not evaluated")
        else:
            v, rule = res.get("verdict"), res.get("rule")
            outcome = _GATE_OUTCOME.get(str(v), "INCONCLUSIVE")
            if res.get("informational") is True and outcome != "REJECT":
                outcome = "INFORMATIONAL"
            why = "; ".join(res.get("reasons", [])[:3])
            reasons.append(f"{name}: {rule or 'rule?'} {v} -> {outcome}" + (f" ({why})" if why else "")
                           + ("" if v in _GATE_OUTCOME else " [unknown verdict]"))
        per_gate[name] = {"rule": rule, "verdict": v, "outcome": outcome}
        if outcome == "INFORMATIONAL":
            informational.append(name)
        else:
            by_outcome[outcome].append(name)
    if not gates:
        verdict = "INCONCLUSIVE"
        reasons.append("no gates were given")
    elif not any(by_outcome.values()):
        verdict = "INCONCLUSIVE"
        reasons.append("only informational gates were given")
    else:
        verdict = next(k for k in _PRECEDENCE if by_outcome[k])
    gate_verdict = verdict
    if identical_arms is True:
        verdict = "INCONCLUSIVE"
        reasons.insert(0, f"{NO_CHANGE}: control and candidate are the same server spec (same spec_sha256); "
                          f"the gates alone would give {gate_verdict}, which says nothing about a change")
    return {"rule": "promotion-v1", "verdict": verdict, "reasons": reasons, "params": {},
            "deviations": {}, "gates": per_gate, "not_evaluated": not_evaluated,
            "gate_verdict": gate_verdict, "no_change": identical_arms is True,
            "rejecting": by_outcome["REJECT"], "holding": by_outcome["HOLD"],
            "inconclusive": by_outcome["INCONCLUSIVE"], "informational": informational}
