"""Servers never outlive the job that started them.

A job tracks every server it launched while it runs. At interpreter exit, and
on SIGTERM or SIGHUP (snakemake cancelling the job, a cluster ending it, a
closed terminal), every tracked server is stopped; the job then runs the
handler that was there before, or dies of the same signal, so its parent sees
the truth. A job killed with SIGKILL runs no handler: ``pdeathsig_preexec``
has the kernel SIGTERM the server when the thread that started it dies.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import signal
import threading
from typing import Any, Protocol

from pairaudit.core import lifecycle


class Stoppable(Protocol):
    """What is tracked: a started server (``launch.Server``)."""

    def stop(self) -> Any: ...


_LIVE: dict[int, Stoppable] = {}
_HANDLERS_INSTALLED = False
_ATEXIT_REGISTERED = False
_PREV_HANDLERS: dict[int, Any] = {}


def stop_all() -> None:
    """Stop every server this process started and has not stopped yet."""
    for srv in list(_LIVE.values()):
        try:
            srv.stop()
        except Exception:  # never let one failed stop leave the others running
            pass


def _on_signal(signum, frame):
    prev = _PREV_HANDLERS.get(signum, signal.SIG_DFL)
    if prev == signal.SIG_IGN:
        return
    lifecycle.request_stop(f"received {signal.Signals(signum).name}")
    stop_all()
    if callable(prev):
        prev(signum, frame)
        return
    # Default disposition: die of the same signal so our parent sees the truth.
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def track(pid: int, server: Stoppable) -> None:
    """Stop ``server`` with the others on a signal or at exit, until ``untrack``."""
    _LIVE[pid] = server


def untrack(pid: int) -> None:
    _LIVE.pop(pid, None)


def install_handlers() -> None:
    """Stop every tracked server at exit and on SIGTERM/SIGHUP (once per process; handlers from the main thread)."""
    global _HANDLERS_INSTALLED, _ATEXIT_REGISTERED
    if not _ATEXIT_REGISTERED:
        atexit.register(stop_all)
        _ATEXIT_REGISTERED = True
    # Signal handlers can only be set from the main thread; a server started
    # from a worker thread still gets atexit and the per-context stop.
    if _HANDLERS_INSTALLED or threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGTERM, signal.SIGHUP):
        try:
            _PREV_HANDLERS[sig] = signal.getsignal(sig)
            signal.signal(sig, _on_signal)
        except (ValueError, OSError):
            pass
    _HANDLERS_INSTALLED = True


def pdeathsig_preexec() -> None:
    """A ``preexec_fn``: the kernel SIGTERMs the child when the thread that started it dies.

    Belt and braces for a parent killed with SIGKILL, when no handler runs.
    """
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG
    except OSError:
        pass
