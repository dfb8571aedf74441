"""Resuming after a crash with the same command: stale locks, and processes told apart from the living.

A ``kill -9`` of snakemake, or a node that reboots under it, leaves
Snakemake's lock files in ``.snakemake/locks/`` (the next run refuses with
``LockException`` until ``snakemake --unlock``). The lock files name only the
files locked, not who locked them, so every snakemake that loads the
Snakefile records itself first (``register_owner``): its pid, host, boot id,
the process's start time (ticks since boot, from ``/proc/<pid>/stat``) and
the Slurm job it runs in, if any, in ``.snakemake/pairaudit/owners/``; the
record goes when the process exits normally (after Snakemake has released
its locks). Snakemake takes its locks only after the Snakefile is loaded, so
every lock a snakemake of this workflow holds has an owner record.

``clear_stale_locks`` (also at load, before Snakemake looks at the locks)
removes the lock files only when every recorded owner is known to be dead:

- on this host (same hostname): dead when the boot id differs (the node
  rebooted), or no process with that pid runs, or the one that does started
  at another time (the pid was reused); alive otherwise;
- on another host (a shared file system, a Slurm job): dead when it ran as
  the Slurm job this process runs as (a requeued job: its earlier run is
  over) or when ``squeue`` no longer lists its job as running; otherwise it
  cannot be told from here, and its locks are left alone.

A live owner, an owner that cannot be judged, or a lock with no owner record
at all (left by a snakemake started without this Snakefile) leaves every
lock as it is: Snakemake then refuses as usual, and the message logged here
names the owner.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

OWNERS = Path(".snakemake", "pairaudit", "owners")
LOCKS = Path(".snakemake", "locks")
ALIVE, DEAD, UNKNOWN = "alive", "dead", "unknown"


def boot_id() -> str | None:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


def start_ticks(pid: int) -> int | None:
    """When the process started, in clock ticks since boot (None: no such process)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def identity(pid: int | None = None) -> dict[str, Any]:
    """What tells this process (or ``pid`` on this host) apart from every other, now and after a reboot."""
    pid = os.getpid() if pid is None else pid
    return {"pid": pid, "host": socket.gethostname(), "boot_id": boot_id(), "start_ticks": start_ticks(pid),
            "slurm_job_id": os.environ.get("SLURM_JOB_ID") if pid == os.getpid() else None}


def _slurm_job_running(job_id: str) -> bool | None:
    """True/False from squeue; None when there is no squeue to ask or it does not answer."""
    if shutil.which("squeue") is None:
        return None
    try:
        out = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True,
                             timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        # squeue refuses a job id it no longer knows: the job is over
        return False if "Invalid job id" in out.stderr else None
    return any(s.strip() in ("RUNNING", "COMPLETING", "PENDING", "CONFIGURING", "SUSPENDED")
               for s in out.stdout.splitlines())


def state(rec: dict[str, Any]) -> tuple[str, str]:
    """(ALIVE | DEAD | UNKNOWN, why) for a recorded process identity."""
    pid, host = rec.get("pid"), rec.get("host")
    where = f"pid {pid} on {host}"
    if not isinstance(pid, int) or not host:
        return UNKNOWN, f"{where}: the record does not say which process it was"
    if host == socket.gethostname():
        if rec.get("boot_id") and boot_id() and rec["boot_id"] != boot_id():
            return DEAD, f"{where}: the host has rebooted since"
        now = start_ticks(pid)
        if now is None:
            return DEAD, f"{where}: no longer runs"
        if rec.get("start_ticks") is not None and now != rec["start_ticks"]:
            return DEAD, f"{where}: no longer runs (that pid is another process now)"
        return ALIVE, f"{where}: still runs"
    job = rec.get("slurm_job_id")
    if job:
        if job == os.environ.get("SLURM_JOB_ID"):
            return DEAD, f"{where}: ran as Slurm job {job}, which this process now runs as (the job was requeued)"
        running = _slurm_job_running(str(job))
        if running is False:
            return DEAD, f"{where}: its Slurm job {job} no longer runs"
        if running is True:
            return ALIVE, f"{where}: its Slurm job {job} still runs"
    return UNKNOWN, f"{where}: another host, whose processes cannot be seen from here"


def owner_path(workdir: str | Path, rec: dict[str, Any]) -> Path:
    return Path(workdir, OWNERS, f"{rec['host']}-{rec['pid']}.json")


def register_owner(workdir: str | Path = ".") -> Path:
    """Record this snakemake as a lock owner of ``workdir``; the record goes when it exits normally."""
    rec = {**identity(), "started_at": time.time(), "cwd": str(Path(workdir).resolve())}
    path = owner_path(workdir, rec)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(rec) + "\n")
    os.replace(tmp, path)

    def forget() -> None:
        try:
            path.unlink()
        except OSError:
            pass

    atexit.register(forget)
    return path


def owners(workdir: str | Path = ".") -> list[tuple[Path, dict[str, Any]]]:
    out = []
    for path in sorted(Path(workdir, OWNERS).glob("*.json")):
        try:
            out.append((path, json.loads(path.read_text())))
        except (OSError, ValueError):
            continue
    return out


def lock_files(workdir: str | Path = ".") -> list[Path]:
    d = Path(workdir, LOCKS)
    return sorted(p for p in d.glob("*.lock") if p.is_file()) if d.is_dir() else []


_LOADED: list[str] | None = None


def at_load(workdir: str | Path = ".") -> list[str]:
    """Once per process (the Snakefile is loaded again by the calibration module): register, then clear."""
    global _LOADED
    if _LOADED is None:
        register_owner(workdir)
        _LOADED = clear_stale_locks(workdir)[1]
        return _LOADED
    return []


def clear_stale_locks(workdir: str | Path = ".", *, me: int | None = None) -> tuple[bool, list[str]]:
    """Remove Snakemake's lock files when every snakemake that could hold them is dead; (cleared, what was found).

    Records of dead owners are removed too (also when there was no lock). ``me``: this process's
    pid, whose own record never counts.
    """
    me = os.getpid() if me is None else me
    here = socket.gethostname()
    found: list[str] = []
    judged = []
    for path, rec in owners(workdir):
        if rec.get("pid") == me and rec.get("host") == here:
            continue
        st, why = state(rec)
        judged.append((path, rec, st, why))
    locks = lock_files(workdir)
    dead = [j for j in judged if j[2] == DEAD]
    others = [j for j in judged if j[2] != DEAD]
    for path, *_ in dead:
        try:
            path.unlink()
        except OSError:
            pass
    if not locks:
        return False, found
    if others:
        found += [f"lock kept: snakemake {why}" for _, _, _, why in others]
        return False, found
    if not dead:
        found.append(f"lock kept: {len(locks)} lock file(s) in {LOCKS} have no recorded owner (a snakemake "
                     "started without this Snakefile); if none runs here, `snakemake --unlock`")
        return False, found
    for lock in locks:
        try:
            lock.unlink()
        except OSError:
            pass
    found += [f"cleared the lock of snakemake {why}" for _, _, _, why in dead]
    return True, found
