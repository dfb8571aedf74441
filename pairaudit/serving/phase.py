"""Phases of the audit: one server start serves a whole phase, not one job.

Real inference servers take minutes to start, and on a cluster every start
is an allocation that loads the model again, so the audit starts each arm's
server once per phase:

- **answers** (one job per arm): the launch receipt, the preflight rehearsal,
  the sampled runs of every dataset, the greedy runs of every item and the
  determinism repeats, and the boundary cases, all on one start;
- **diagnostics** (one job, no server): the discordant items' greedy runs of
  both arms read from the answers phases' journals, their first divergences
  and grid-tie-v1 on each arm's own top-20 there;
- **speed** (``pairaudit.speed.bracket``): the three fresh starts of the bracket.

Every request of a phase is journaled as it is answered, and a phase asks only
what its journals do not already hold, so a rerun after a change to one
dataset asks only that dataset's items, and a phase with nothing to ask does
not start its server at all.  A phase checks its server's identity at start
and again before it writes each output: a server that died or restarted
mid-phase stops the phase with its log tail; the journal keeps what was
answered.  Every start and stop is appended to the audit's server log of
starts (``results/<audit>/servers/starts.jsonl``).

The per-dataset artifacts are assembled from the journals by their own cheap
jobs (``pairaudit.answers.stage.assemble``), so one dataset's change reruns only that
dataset's downstream jobs.

Every ``ready`` line says ``why`` its phase needed that start (``PhaseServer(why=...)``) and where the
start's seconds went (``breakdown``, :mod:`pairaudit.serving.startlog`).  The diagnostics share the answers
phases' starts by running greedy on every item there: which items they compare (the discordant ones) is
known only once both arms' answers are scored, in other jobs, and a server here never outlives its job
(``pairaudit.serving.launch``).  So a two-arm audit makes one start per arm outside the speed bracket.
"""

from __future__ import annotations

import logging
from typing import Any, Mapping

from pairaudit.serving import launch
from pairaudit.serving.armspec import ArmSpec
from pairaudit.serving.client import Endpoint
from pairaudit.serving.launch import Server

log = logging.getLogger("pairaudit")



class PhaseError(RuntimeError):
    pass


# --------------------------------------------------------------- server session

def _start_time(ep: Endpoint) -> float | None:
    """The server process's start time from /metrics, where it publishes one (vLLM does)."""
    _, parsed = ep.scrape_metrics(timeout_s=30)
    return (parsed or {}).get("process_start_time_seconds")


class PhaseServer:
    """One arm's server for one phase: started on first use, checked before every output, stopped once."""

    def __init__(self, spec: ArmSpec, *, phase: str, log_path: str, receipt: dict | None, starts_log: str | None,
                 timeout_s: float = 900, why: str | None = None):
        self.spec, self.phase, self.log_path = spec, phase, log_path
        self.receipt, self.starts_log, self.timeout_s = receipt, starts_log, timeout_s
        # why this phase needs a start of its own: the starts log says it beside the start's cost
        self.why = why
        self.server: Server | None = None
        self.starts = 0
        self._start_time: float | None = None

    def get(self) -> Server:
        if self.server is None:
            self.server = Server(self.spec, log_path=self.log_path, receipt=self.receipt,
                                 timeout_s=self.timeout_s).start()
            self.starts += 1
            facts = self.server.facts()
            self._start_time = _start_time(self.server.endpoint)
            self._event("ready", {**facts, "why": self.why})
            log.info("%s phase: %s server ready in %.1f s (%s)", self.phase, self.spec.arm,
                     facts.get("ready_s") or 0.0, facts.get("url"))
        return self.server

    def verify(self) -> None:
        """The same server as at start, alive: else a ``ServerError`` with its log tail."""
        if self.server is None:
            return
        srv = self.server
        srv.assert_alive()
        models = srv.endpoint.get_json("/v1/models", timeout_s=60)
        version = srv.endpoint.get_json("/version", timeout_s=60)
        chk = launch.check_identity(self.spec, models, version, self.receipt)
        problems = list(chk["problems"])
        if models.get("status") != 200:
            problems.append(f"/v1/models answered {models.get('status')} ({models.get('error')})")
        start_time = _start_time(srv.endpoint)
        if self._start_time is not None and start_time != self._start_time:
            problems.append(f"the server restarted mid-phase (process start {self._start_time} -> {start_time})")
        if problems:
            raise srv._fail("server changed mid-phase: " + "; ".join(problems) + "\n--- last lines of "
                            f"{srv.log_path} ---\n" + srv.log_tail(30))

    def close(self) -> None:
        if self.server is not None and self.server.facts().get("stop") is None:
            stop = self.server.stop()
            self._event("stopped", {"stop": stop, "pid": self.server.facts().get("pid")})

    def _event(self, event: str, facts: Mapping[str, Any]) -> None:
        launch.log_start_event(self.starts_log, event=event, phase=self.phase, spec=self.spec,
                               receipt=self.receipt, facts=facts)

    def __enter__(self) -> "PhaseServer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()



