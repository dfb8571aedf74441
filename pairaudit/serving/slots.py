"""Machine-wide server slots: at most N launched servers on one host at once, whoever started them.

Snakemake's ``server_slots`` resource only bounds the jobs of one invocation;
a second audit started beside it (another directory, another terminal, another
user) would run its servers at the same time.  So every launched server also
holds one of N slot files, ``slot-<i>.lock`` under ``$PAIRAUDIT_SLOTS_DIR``
(default ``/tmp/pairaudit-slots``, shared by every user of the host: the
directory is made world-writable and sticky like ``/tmp``), by an exclusive
``flock`` for as long as the server runs.  The kernel drops the lock when the
holding process dies, however it dies, so a killed job never leaks a slot.

N is ``$PAIRAUDIT_SERVER_SLOTS``; the workflow sets it at load from the
invocation's ``server_slots`` resource (``profiles/default``: 1).  An
invocation with N = 2 may use slots 0 and 1, one with N = 1 only slot 0, so
each invocation's own bound holds on the host.  Unset (the library used on its
own, the tests) means no machine-wide bound.

The holder writes who it is into the slot file (pid, host, audit, arm, log,
since); a waiter logs that, e.g. ``waiting for a server slot: slot 0 held by
pid 4242 (audit default, arm control, since ...)``, once and then every
``log_every_s``.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Mapping

if TYPE_CHECKING:  # launch imports this module; the spec is only named here
    from pairaudit.serving.armspec import ArmSpec

SLOTS_DIR_ENV = "PAIRAUDIT_SLOTS_DIR"
SLOTS_ENV = "PAIRAUDIT_SERVER_SLOTS"
AUDIT_ENV = "PAIRAUDIT_AUDIT"
DEFAULT_DIR = "/tmp/pairaudit-slots"

log = logging.getLogger("pairaudit")

# slot files this process holds now: waiting on a slot only this process holds would never end
_HELD: set[str] = set()


class SlotError(RuntimeError):
    """No slot can ever be had (a bad count, or this process already holds every slot)."""


@dataclass
class Slot:
    index: int
    path: Path
    fd: int | None

    def release(self) -> None:
        """Give the slot back. Idempotent."""
        if self.fd is None:
            return
        fd, self.fd = self.fd, None
        _HELD.discard(str(self.path))
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def slot_count(env: Mapping[str, str] = os.environ) -> int | None:
    raw = env.get(SLOTS_ENV, "").strip()
    if not raw:
        return None
    try:
        n = int(raw)
    except ValueError:
        raise SlotError(f"{SLOTS_ENV}={raw!r}: expected a positive integer (the server_slots resource)") from None
    if n < 1:
        raise SlotError(f"{SLOTS_ENV}={raw!r}: expected a positive integer (the server_slots resource)")
    return n


def slots_dir(env: Mapping[str, str] = os.environ) -> Path:
    return Path(env.get(SLOTS_DIR_ENV) or DEFAULT_DIR)


def _ensure_dir(d: Path) -> None:
    if d.is_dir():
        return
    try:
        d.mkdir(parents=True)
    except FileExistsError:
        return
    with contextlib.suppress(OSError):  # every user of the host must be able to add a slot file
        os.chmod(d, 0o1777)


def _open(path: Path) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
    with contextlib.suppress(OSError):  # the creator makes it usable by every user; others cannot and need not
        os.fchmod(fd, 0o666)
    return fd


def holder(path: Path) -> dict:
    """Who holds (or last held) a slot file, as its holder wrote it; {} when unreadable."""
    try:
        return json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        return {}


def describe(info: Mapping) -> str:
    if not info.get("pid"):
        return "an unknown process"
    extra = ", ".join(f"{k} {info[k]}" for k in ("audit", "arm", "host", "since") if info.get(k))
    return f"pid {info['pid']}" + (f" ({extra})" if extra else "")


def try_acquire(count: int, directory: Path, label: Mapping) -> Slot | None:
    """One pass over slots 0..count-1: the first free one, held; None when all are taken."""
    _ensure_dir(directory)
    for i in range(count):
        path = directory / f"slot-{i}.lock"
        try:
            fd = _open(path)
        except OSError as exc:
            raise OSError(exc.errno, f"cannot open server slot file: {exc.strerror}", str(path)) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                continue
            raise OSError(exc.errno, f"cannot lock server slot file: {exc.strerror}", str(path)) from None
        info = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                **{k: v for k, v in label.items() if v is not None}}
        with contextlib.suppress(OSError):  # the holder note is for the waiters' log line only
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps(info) + "\n").encode(), 0)
        _HELD.add(str(path))
        return Slot(i, path, fd)
    return None


def acquire(label: Mapping | None = None, *, count: int | None = None, directory: Path | None = None,
            poll_s: float = 0.5, log_every_s: float = 30.0,
            on_wait: Callable[[str], None] | None = None) -> Slot | None:
    """Hold a slot, waiting as long as it takes; None when no machine-wide bound is configured.

    ``label`` (audit, arm, log, ...) is written for waiters to read.  Waiting
    is logged as it starts and then every ``log_every_s`` (``on_wait`` gets
    the same line).
    """
    count = slot_count() if count is None else count
    if count is None:
        return None
    if count < 1:
        raise SlotError(f"server slots: {count!r} is not a positive integer")
    directory = slots_dir() if directory is None else Path(directory)
    label = dict(label or {})
    label.setdefault("audit", os.environ.get(AUDIT_ENV))
    last_log = None
    while True:
        slot = try_acquire(count, directory, label)
        if slot is not None:
            if last_log is not None:
                log.info("got server slot %d (%s)", slot.index, slot.path)
            return slot
        paths = [directory / f"slot-{i}.lock" for i in range(count)]
        if all(str(p) in _HELD for p in paths):
            raise SlotError(f"this process already holds all {count} server slot(s) in {directory}; a second "
                            f"server at once needs server_slots >= {count + 1}")
        now = time.monotonic()
        if last_log is None or now - last_log >= log_every_s:
            held = "; ".join(f"slot {i} held by {describe(holder(p))}" for i, p in enumerate(paths))
            line = f"waiting for a server slot ({count} on this machine, {directory}): {held}"
            log.warning("%s", line)
            if on_wait is not None:
                on_wait(line)
            last_log = now
        time.sleep(poll_s)


def acquire_for(spec: ArmSpec, log_path=None) -> Slot | None:
    """The slot a launched server of ``spec`` holds while it runs (``launch.Server.start``)."""
    return acquire({"arm": spec.arm, "log": str(log_path) if log_path else None})


def release(slot: Slot | None) -> None:
    if slot is not None:
        slot.release()
