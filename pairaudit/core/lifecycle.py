"""A job's life: stop asking when told to, and never outlive the snakemake that started it.

Two things end a phase early and must stop it within seconds without sending
anything new:

- an interrupt (SIGINT, SIGTERM, SIGHUP): ``stopping()`` turns true, request
  loops stop taking work, and the job's servers are stopped on the way out;
- the death of the snakemake process the job belongs to (``kill -9`` of
  snakemake alone leaves its jobs orphaned): a watchdog thread notices the
  ancestor is gone and delivers SIGTERM to the job itself, whose handler stops
  its servers (see ``launch``);
- a SIGINT to snakemake alone (``kill -INT``; a terminal's Ctrl-C reaches the
  jobs too): snakemake would wait for its running jobs to finish, so the
  Snakefile installs ``relay_interrupts``, which leaves a marker the jobs'
  watchdogs see within a second.

Answers already journaled are kept either way; the journal's lock is released
by the kernel when the job exits, so the recovery run can take it.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from pathlib import Path

log = logging.getLogger("pairaudit")

_STOP = threading.Event()
_WATCHED: int | None = None


class Interrupted(RuntimeError):
    """The phase was told to stop; what was answered is in the journal."""


def stopping() -> bool:
    return _STOP.is_set()


def request_stop(why: str) -> None:
    if not _STOP.is_set():
        log.warning("stopping: %s; nothing new is sent, answered items stay in the journal", why)
    _STOP.set()


def check_stop() -> None:
    if _STOP.is_set():
        raise Interrupted("the job was interrupted; rerun to resume from the journal")


def _argv(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a for a in raw.decode(errors="replace").split("\0") if a]


def _ppid(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # the command field may hold spaces and parentheses: split after the last ')'
    return int(stat.rsplit(")", 1)[1].split()[1])


def is_snakemake(argv: list[str]) -> bool:
    """True for the snakemake command itself (``snakemake ...``, ``python .../snakemake``, ``-m snakemake``)."""
    head = argv[:3]
    names = [os.path.basename(a) for a in head]
    if names and names[0] == "snakemake":
        return True
    if len(names) > 1 and names[0].startswith("python") and names[1] == "snakemake":
        return True
    return len(head) > 2 and head[1] == "-m" and head[2] == "snakemake"


def snakemake_ancestor(pid: int | None = None) -> int | None:
    """The nearest ancestor process that is snakemake itself, if any."""
    cur = _ppid(pid if pid is not None else os.getpid())
    while cur and cur > 1:
        if is_snakemake(_argv(cur)):
            return cur
        cur = _ppid(cur)
    return None


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def interrupt_marker(pid: int, workdir: str | Path = ".") -> Path:
    return Path(workdir, ".snakemake", "pairaudit", f"interrupted-{pid}")


def relay_interrupts(workdir: str | Path = ".") -> None:
    """In the snakemake process (the Snakefile): a SIGINT leaves a marker for its jobs, then interrupts as usual."""
    if threading.current_thread() is not threading.main_thread():
        return
    marker = interrupt_marker(os.getpid(), workdir)
    marker.unlink(missing_ok=True)  # a marker of an earlier process with this pid
    prev = signal.getsignal(signal.SIGINT)

    def handler(signum, frame):
        try:
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.write_text(f"SIGINT at {time.time()}\n")
        except OSError:
            pass
        if callable(prev):
            prev(signum, frame)
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, handler)


def _watch(pid: int, interval_s: float) -> None:
    marker = interrupt_marker(pid)
    while _alive(pid):
        if marker.exists():
            request_stop(f"snakemake (pid {pid}) was interrupted")
            break
        time.sleep(interval_s)
    else:
        request_stop(f"snakemake (pid {pid}) is gone")
    os.kill(os.getpid(), signal.SIGTERM)


def _on_interrupt(signum, frame):
    request_stop(f"received {signal.Signals(signum).name}")
    raise KeyboardInterrupt


def install(*, watch_snakemake: bool = True, interval_s: float = 0.5) -> int | None:
    """Set up interrupt handling for this job; returns the watched snakemake pid, if any."""
    global _WATCHED
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, _on_interrupt)
    if watch_snakemake and _WATCHED is None:
        _WATCHED = snakemake_ancestor()
        if _WATCHED is not None:
            threading.Thread(target=_watch, args=(_WATCHED, interval_s), daemon=True,
                             name="snakemake-watchdog").start()
    return _WATCHED
