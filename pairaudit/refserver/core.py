"""The engine process's loop: requests in from the API process, one message per engine step out.

It runs in the main thread of the server's main process (on a CPU the same
torch matmuls run ~20 % slower from a secondary thread).  Between steps it
reads whatever the API process sent (new requests, aborts, metrics requests)
without waiting; with nothing to run it waits on the connection, so a new
request starts the next step at once.  After each step it sends one message
with every request that got tokens, finished or failed in it
(:class:`.protocol.Update`).
"""

from __future__ import annotations

import logging
import time

from .engine import Engine, Request
from .protocol import ABORT, ADD, METRICS, STEP, Update

log = logging.getLogger("refserver")
IDLE_WAIT_S = 0.2  # how often an idle loop looks at ``stopped``; a message wakes it at once


class ApiGone(Exception):
    """The API process closed its end of the connection (it exited)."""


class EngineCore:
    def __init__(self, engine: Engine, conn):
        self.engine, self.conn = engine, conn
        self.live: dict[str, Request] = {}
        engine.track = True

    def run(self) -> None:
        """Step until ``engine.stopped``; raises ApiGone when the API process is gone."""
        eng = self.engine
        eng.alive = True
        try:
            while not eng.stopped:
                idle = not eng.running and eng.waiting.empty()
                try:
                    ready = self.conn.poll(IDLE_WAIT_S if idle else 0)
                except OSError:
                    raise ApiGone from None
                t0 = time.monotonic()
                if ready:
                    self._inbox()
                io_s = time.monotonic() - t0
                if eng.step_once():
                    t1 = time.monotonic()
                    self._ship()
                    io_s += time.monotonic() - t1
                eng.metrics.inc("pairaudit:loop_io_seconds_total", io_s)
        finally:
            eng.alive = False

    def _inbox(self) -> None:
        eng = self.engine
        try:
            while self.conn.poll(0):
                msg = self.conn.recv()
                if msg[0] == ADD:
                    _, rid, prompt, params, arrival = msg
                    self.live[rid] = eng.submit(Request(prompt=prompt, params=params, request_id=rid,
                                                        arrival=arrival, events=None))
                elif msg[0] == ABORT:
                    req = self.live.pop(msg[1], None)
                    if req is not None:
                        eng.abort(req)
                elif msg[0] == METRICS:
                    self.conn.send((METRICS, msg[1], eng.metrics.state()))
        except (EOFError, OSError):
            raise ApiGone from None

    def _ship(self) -> None:
        updates = []
        for req in self.engine.take_touched():
            if self.live.get(req.request_id) is not req:
                continue  # aborted
            n, m = len(req.output), len(req.emitted)
            first = req.shipped == 0
            done = req.done
            updates.append(Update(req.request_id, req.output[req.shipped:n], req.emitted[req.shipped_emitted:m],
                                  req.finish_reason if done else None, req.stop_reason if done else None, req.error,
                                  req.prompt_logprobs if first else None))
            req.shipped, req.shipped_emitted = n, m
            if done:
                del self.live[req.request_id]
        if updates:
            try:
                self.conn.send((STEP, updates))
            except OSError:
                raise ApiGone from None
