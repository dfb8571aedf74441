"""A server that fails under the audit is evidence for the decision, not a crash.

The audits this tool automates read a failing server this way:

- a **4xx** on a request means the request is wrong for that server (a probe
  it does not support, a limit it sets differently): nothing was learned
  about the change, so the evidence is INCONCLUSIVE, naming the request;
- a **5xx**, a refused connection or a server process that exited, on work
  the control arm did answer, is the candidate's failure: REJECT, once it is
  confirmed by sending the same request to a fresh start of the same
  candidate (the confirmation is stored beside the first failure, never over
  it); a failure that does not reproduce on a fresh start HOLDs;
- a control that fails, or both arms, is INCONCLUSIVE: the rollback itself
  does not serve the audit, so nothing can be compared.

``FailureRecord`` is what an answers phase or the speed bracket stores when its server fails;
``server_failure_v1`` turns both arms' records into the gate.
"""

from __future__ import annotations

from typing import Any, Mapping, TypedDict

RULE = "server-failure-v1"
REFUSED, SERVER_ERROR, DEAD = "refused", "server_error", "dead"
# a probe answered, but its check of the answer failed: a finding about the server, not about the change
FAILED_CHECK = "failed_check"


class FailureRecord(TypedDict, total=False):
    arm: str
    stage: str            # preflight | sampled | boundary | speed
    what: str             # the probe, dataset item or case that failed
    kind: str             # refused | server_error | dead | failed_check
    status: int | None    # HTTP status, None when no answer came back
    request: Any          # the request body that failed
    error: str | None     # the client's error text
    error_body: Any       # the server's error body
    log_tail: str         # the last lines of the server's log
    at: str
    confirmation: dict | None  # the same request on a fresh start: {kind, status, error, error_body, log_tail}


def classify(status: int | None, *, server_alive: bool = True) -> str:
    if status is None or not server_alive:
        return DEAD
    if status >= 500 or status == 429:
        return SERVER_ERROR
    if status < 400:
        # the server accepted the request and then broke its answer (a stream cut off
        # before its finish_reason, a body that is not the API's): its failure, not a refusal
        return SERVER_ERROR
    return REFUSED


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
