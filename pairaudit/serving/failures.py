"""A server that fails under the audit is evidence for the decision, not a crash.

``FailureRecord`` is what an answers phase or the speed bracket stores when
its server fails; ``classify`` names its kind from the HTTP status and
whether the process still runs. What the kinds mean for the decision is the
registered rule server-failure-v1 (``pairaudit.gates.server_failure``).
"""

from __future__ import annotations

from typing import Any, TypedDict

from pairaudit.gates.server_failure import DEAD, REFUSED, SERVER_ERROR


class FailureRecord(TypedDict, total=False):
    arm: str
    stage: str            # preflight | sampled | greedy | boundary | speed
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
