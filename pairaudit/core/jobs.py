"""Run one Snakemake job's stage function with its log, and fail it with a readable message."""

from __future__ import annotations

import logging
import sys
import traceback

from pairaudit.core import lifecycle


def run_job(log_path: str | None, fn, **kwargs):
    """Call ``fn(**kwargs)``; the job log gets the full traceback, the console the reason."""
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if log_path:
        handlers.append(logging.FileHandler(log_path, mode="a"))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", handlers=handlers,
                        force=True)
    log = logging.getLogger("pairaudit")
    watched = lifecycle.install()
    log.info("%s start%s", fn.__name__, f" (stops if snakemake pid {watched} goes)" if watched else "")
    try:
        result = fn(**kwargs)
    except KeyboardInterrupt:
        log.error("%s interrupted: answered items are kept in the journals; rerun to resume", fn.__name__)
        sys.exit(130)
    except Exception as exc:
        if log_path:
            with open(log_path, "a") as f:
                traceback.print_exc(file=f)
        log.error("%s failed: %s: %s", fn.__name__, type(exc).__name__, exc)
        sys.exit(1)
    log.info("%s done", fn.__name__)
    return result
