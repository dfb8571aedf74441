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

A snakemake that dies *as it starts a job* leaves the job reparented before
the job can look for its ancestor, so the ancestor alone cannot be trusted:
``relay_interrupts`` also records the snakemake process in the environment
every job inherits (``PAIRAUDIT_SNAKEMAKE``: host, pid and the process's
start time, so a reused pid is not mistaken for it). A job watches every
recorded snakemake of its own host, whether or not it is still its ancestor,
and one whose recorded snakemake is already gone stops at once. Under Slurm
the snakemake inside the job's allocation appends itself to the record it
inherited from the snakemake that submitted the job, so a job on the
submitter's host (a one-node cluster, a workstation) also ends when the
submitter is killed (``kill -9`` leaves Slurm's jobs running, and a rerun of
their phase would find their journals taken); a job on another node watches
the snakemake of its own node only.

Answers already journaled are kept either way; the journal's lock is released
by the kernel when the job exits, so the recovery run can take it.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from pathlib import Path

log = logging.getLogger("pairaudit")

_STOP = threading.Event()
_WATCHED: int | None = None
SNAKEMAKE_ENV = "PAIRAUDIT_SNAKEMAKE"


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


def _alive(pid: int, started: int | None = None) -> bool:
    """``pid`` runs (not a zombie) and, given ``started``, is the process that started then (not a reuse)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    fields = stat.rsplit(")", 1)[1].split()
    return fields[0] != "Z" and (started is None or int(fields[19]) == started)


def start_time(pid: int) -> int | None:
    """The process's start time (clock ticks after boot, /proc/<pid>/stat field 22): with its pid, one process."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def mark_snakemake(environ=None) -> str:
    """In the snakemake process: record it (host, pid, start time) for every job it starts, after the
    snakemakes it inherited a record of (the one that submitted this one's Slurm job)."""
    env = os.environ if environ is None else environ
    me = f"{socket.gethostname()}:{os.getpid()}:{start_time(os.getpid())}"
    kept = [r for r in env.get(SNAKEMAKE_ENV, "").split(";") if r and r != me]
    env[SNAKEMAKE_ENV] = ";".join([*kept, me])
    return env[SNAKEMAKE_ENV]


def recorded_snakemakes(environ=None) -> list[tuple[int, int | None]]:
    """(pid, start time) of every snakemake recorded for this job that ran on this host, the nearest last."""
    out = []
    for rec in (os.environ if environ is None else environ).get(SNAKEMAKE_ENV, "").split(";"):
        parts = rec.rsplit(":", 2)
        if len(parts) != 3 or parts[0] != socket.gethostname():
            continue
        try:
            out.append((int(parts[1]), None if parts[2] == "None" else int(parts[2])))
        except ValueError:
            continue
    return out


def interrupt_marker(pid: int, workdir: str | Path = ".") -> Path:
    return Path(workdir, ".snakemake", "pairaudit", f"interrupted-{pid}")


def relay_interrupts(workdir: str | Path = ".") -> None:
    """In the snakemake process (the Snakefile): a SIGINT leaves a marker for its jobs, then interrupts as usual."""
    mark_snakemake()
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


def _watch(watched: list[tuple[int, int | None]], interval_s: float) -> None:
    """Until one of ``watched`` (pid, start time or None) is gone or interrupted; then stop this job."""
    while True:
        gone = next((pid for pid, started in watched if not _alive(pid, started)), None)
        if gone is not None:
            request_stop(f"snakemake (pid {gone}) is gone")
            break
        hit = next((pid for pid, _ in watched if interrupt_marker(pid).exists()), None)
        if hit is not None:
            request_stop(f"snakemake (pid {hit}) was interrupted")
            break
        time.sleep(interval_s)
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
        # the snakemakes that started this job, as they recorded themselves: one that died before this job
        # looked for its ancestor is found gone at the watchdog's first look, and the job stops
        watched = recorded_snakemakes()
        ancestor = snakemake_ancestor()
        if ancestor is not None and ancestor not in [pid for pid, _ in watched]:
            watched.append((ancestor, None))
        if watched:
            _WATCHED = watched[-1][0]
            threading.Thread(target=_watch, args=(watched, interval_s), daemon=True,
                             name="snakemake-watchdog").start()
    return _WATCHED
