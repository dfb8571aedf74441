"""Progress lines for long stages: items done / total, rate and ETA, in the job's log.

A stage calls ``Progress(total, what)``, then ``step()`` once per finished
item.  Lines go to the ``pairaudit`` logger (which ``jobs.run_job`` points at
the job's log file), at most one every ``every_s`` seconds plus the last one,
so a multi-hour run on a GPU host shows where it is without flooding the log.
"""

from __future__ import annotations

import logging
import time

log = logging.getLogger("pairaudit")


def _eta(seconds: float) -> str:
    seconds = int(round(seconds))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s"


class Progress:
    def __init__(self, total: int, what: str, *, done: int = 0, every_s: float = 10.0, clock=time.monotonic):
        self.total, self.what, self.every_s, self.clock = int(total), what, every_s, clock
        # Items already done when the stage starts (a resumed journal) do not
        # count toward the rate, or the ETA would be too optimistic.
        self.done = self.start_done = int(done)
        self.t0 = self.last = clock()
        self.lines: list[str] = []

    def line(self) -> str:
        elapsed = self.clock() - self.t0
        new = self.done - self.start_done
        rate = new / elapsed if elapsed > 0 else 0.0
        left = self.total - self.done
        eta = _eta(left / rate) if rate > 0 else "?"
        pct = 100.0 * self.done / self.total if self.total else 100.0
        return f"{self.what}: {self.done}/{self.total} ({pct:.0f} %), {rate:.3g}/s, ETA {eta}"

    def step(self, n: int = 1) -> None:
        self.done += n
        now = self.clock()
        if self.done >= self.total or now - self.last >= self.every_s:
            self.last = now
            msg = self.line()
            self.lines.append(msg)
            log.info("%s", msg)
