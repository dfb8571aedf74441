"""Append-only JSON-lines logs: one writer at a time, fsynced, safe across crashes.

The journals of answered requests, the decision ledger and the speed control
archive are all logs of this kind: lines are only ever appended, a line cut
short by a crash is left where it is (the next record starts on a fresh line,
so it is never glued onto the cut one), and readers skip lines that do not
parse.  A second process that tries to write the same log while the first
still holds it is refused by name (``LogBusy``): two writers on one journal
would ask the same items twice.  The lock is an ``flock`` on the log file
itself, so the kernel releases it when the holder dies, however it dies.
A journal that several jobs share by design (a sweep's control arm, which
each candidate's diagnostics job asks for what the journal lacks) is opened
with ``wait=True`` instead: the second writer waits for the first, then
reads what it wrote before asking anything.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any, Iterator, Mapping

from pairaudit.core import lifecycle


log = logging.getLogger(__name__)

# How often a writer waiting for a shared journal says who holds it.
WAIT_REPORT_S = 60.0


class LogBusy(RuntimeError):
    """Another process is writing this log."""


class LogIOError(OSError):
    """An I/O error while writing a log; the message names the file."""


def read_log(path: str | os.PathLike) -> list[dict]:
    """Every parseable record, in file order; a cut or garbled line is skipped, never repaired."""
    return list(iter_log(path))


def iter_log(path: str | os.PathLike) -> Iterator[dict]:
    p = Path(path)
    if not p.exists():
        return
    # errors="replace": a crash can cut a line inside a multi-byte character; that
    # line then fails to parse and is skipped instead of making the log unreadable.
    with open(p, encoding="utf-8", errors="replace") as f:
        for line in f:
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(rec, dict):
                yield rec


def _holder(path: Path) -> str:
    try:
        return Path(f"{path}.writer").read_text().strip() or "unknown"
    except OSError:
        return "unknown"


class AppendLog:
    """An open, exclusively locked log.  ``append`` writes one record and fsyncs it.

    ``exclusive=False`` is for shared logs (ledger, archive) that many audits
    append to: each append then takes the lock only for its own line.
    ``wait=True`` waits for another process's exclusive hold to end instead of
    refusing (``LogBusy``), logging the holder every ``WAIT_REPORT_S``: the
    caller must then read the log again, since the holder may have written
    what the caller was about to ask.
    """

    def __init__(self, path: str | os.PathLike, *, exclusive: bool = True, owner: str = "", wait: bool = False):
        self.path = Path(path)
        self.exclusive = exclusive
        self._lock = threading.Lock()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._f = open(self.path, "a", encoding="utf-8")
        except OSError as exc:
            raise LogIOError(exc.errno, f"cannot open {self.path} for appending: {exc.strerror}") from exc
        if exclusive:
            self._lock_exclusive(wait)
            try:
                Path(f"{self.path}.writer").write_text(f"pid {os.getpid()} {owner}".strip() + "\n")
            except OSError:
                pass
            self._end_line()

    def _lock_exclusive(self, wait: bool) -> None:
        since = time.monotonic()
        reported: float | None = None
        while True:
            try:
                fcntl.flock(self._f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not wait:
                    self._f.close()
                    raise LogBusy(f"{self.path} is being written by another process ({_holder(self.path)}); "
                                  "a second writer would ask the same items twice: wait for it to finish or "
                                  "stop it") from None
            now = time.monotonic()
            if reported is None or now - reported >= WAIT_REPORT_S:
                reported = now
                log.info("waiting for %s: written by another process (%s) for %.0f s", self.path,
                         _holder(self.path), now - since)
            # polled, not a blocking flock: a blocked flock call can neither report the wait nor see a stop
            try:
                lifecycle.check_stop()
            except lifecycle.Interrupted:
                self._f.close()
                raise
            time.sleep(0.2)
        if reported is not None:
            log.info("%s is free after %.0f s: reading what the other writer added", self.path,
                     time.monotonic() - since)

    def _end_line(self) -> None:
        # Look at the last byte in binary: a cut line may end inside a multi-byte character.
        with open(self.path, "rb") as fb:
            fb.seek(0, os.SEEK_END)
            if fb.tell() > 0:
                fb.seek(-1, os.SEEK_END)
                if fb.read(1) != b"\n":
                    self._write("\n")

    def _write(self, text: str) -> None:
        try:
            self._f.write(text)
            self._f.flush()
            os.fsync(self._f.fileno())
        except OSError as exc:
            raise LogIOError(exc.errno, f"cannot append to {self.path}: {exc.strerror} "
                                        "(records already written are kept)") from exc

    def append(self, record: Mapping[str, Any]) -> None:
        line = json.dumps(record, ensure_ascii=False) + "\n"
        with self._lock:
            if self.exclusive:
                self._write(line)
                return
            fcntl.flock(self._f.fileno(), fcntl.LOCK_EX)
            try:
                self._end_line()
                self._write(line)
            finally:
                fcntl.flock(self._f.fileno(), fcntl.LOCK_UN)

    def close(self) -> None:
        if self._f.closed:
            return
        if self.exclusive:
            try:
                Path(f"{self.path}.writer").unlink()
            except OSError:
                pass
        self._f.close()

    def __enter__(self) -> "AppendLog":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def append_record(path: str | os.PathLike, record: Mapping[str, Any]) -> None:
    """Append one record to a shared log (ledger, archive) under a short lock."""
    log = AppendLog(path, exclusive=False)
    try:
        log.append(record)
    finally:
        log.close()
