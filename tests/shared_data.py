"""Where the real benchmark files live (../shared/datasets, never copied into the project)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def shared_datasets() -> Path:
    env = os.environ.get("PAIRAUDIT_SHARED_DATASETS")
    return Path(env) if env else Path(__file__).resolve().parents[2] / "shared" / "datasets"


def shared_file(rel: str) -> Path:
    """The file, or a clean skip that says where it was looked for."""
    path = shared_datasets() / rel
    if not path.is_file():
        pytest.skip(f"shared datasets absent: {path}")
    return path
