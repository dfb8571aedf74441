"""server-failure-v1: what a server that failed under the audit means for the decision.

- a **4xx** on a request means the request is wrong for that server (a probe
  it does not support, a limit it sets differently): nothing was learned
  about the change, so the evidence is INCONCLUSIVE, naming the request;
- a **5xx**, a refused connection, a stream broken after it was accepted, or
  a server process that exited, on work the control arm did answer, is the
  candidate's failure: FAIL, once it is confirmed by sending the same request
  to a fresh start of the same candidate (the confirmation is stored beside
  the first failure, never over it); a failure that does not reproduce on a
  fresh start HOLDs;
- an answer that failed a check the control's passed HOLDs: a finding about
  the candidate, to be understood;
- a control that fails, or both arms, is INCONCLUSIVE: the rollback itself
  does not serve the audit, so nothing can be compared.

The failure records are ``serving.failures.FailureRecord``, written by the
answers phases and the speed bracket; their ``kind`` is one of this module's.
"""

from __future__ import annotations

from typing import Any, Mapping

RULE = "server-failure-v1"
REFUSED, SERVER_ERROR, DEAD = "refused", "server_error", "dead"
# a probe answered, but its check of the answer failed: a finding about the server, not about the change
FAILED_CHECK = "failed_check"


def is_server_failure(kind: str | None) -> bool:
    return kind in (SERVER_ERROR, DEAD)


def summary(f: Mapping[str, Any]) -> str:
    body = f.get("error_body")
    body = body if isinstance(body, str) else (str(body) if body is not None else "")
    status = f.get("status")
    return (f"{f.get('arm')} {f.get('stage')} {f.get('what')}: "
            f"{'HTTP ' + str(status) if status is not None else 'no answer'} ({f.get('kind')})"
            + (f", server said: {body[:300]}" if body else "")
            + (f", {f.get('error')}" if f.get("error") and not body else ""))


def server_failure_v1(failures: Mapping[str, Mapping[str, Any] | None]) -> dict:
    """The gate over both arms' failure records (None: that arm answered everything it was asked)."""
    control, candidate = failures.get("control"), failures.get("candidate")
    reasons: list[str] = []
    if control is None and candidate is None:
        verdict = "PASS"
        reasons.append("both arms' servers answered every request of the audit")
    elif control is not None:
        verdict = "INCONCLUSIVE"
        reasons.append("the control failed: " + summary(control) + "; nothing can be compared")
        if candidate is not None:
            reasons.append("the candidate failed too: " + summary(candidate))
    elif candidate is None:  # unreachable (both None is PASS); says so to the type checker
        raise AssertionError("no failure to judge")
    elif candidate.get("kind") == REFUSED:
        verdict = "INCONCLUSIVE"
        reasons.append("the candidate refused a request the control answered (a 4xx: the request is wrong for "
                       "that server, not evidence about the change): " + summary(candidate))
    elif candidate.get("kind") == FAILED_CHECK:
        # e.g. the same seeded request answered two ways: a finding about the candidate, to be understood
        verdict = "HOLD"
        reasons.append("the candidate's answer failed a check the control's passed: " + summary(candidate))
    else:
        conf = candidate.get("confirmation") or {}
        if is_server_failure(conf.get("kind")):
            verdict = "FAIL"
            reasons.append("the candidate's server failed on a request the control answered, and again on a "
                           "fresh start: " + summary(candidate))
        else:
            verdict = "HOLD"
            reasons.append("the candidate's server failed on a request the control answered, but not on a fresh "
                           f"start ({conf.get('kind') or 'no confirmation'}): " + summary(candidate))
    return {"rule": RULE, "verdict": verdict, "reasons": reasons,
            "failures": {"control": control, "candidate": candidate}}
