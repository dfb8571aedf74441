"""The API process's entry point, apart from it: the engine process spawns it without importing aiohttp."""

from __future__ import annotations


def run_api_process(conn, start: dict) -> None:
    """``multiprocessing``'s target for the API process (see :mod:`.frontend`)."""
    from .frontend import main

    main(conn, start)
