"""The config schema (``config/schema.yaml``): the one place every default is kept.

Library functions that take a config section fill what the caller left out
from here, so a default cannot differ between the workflow (where Snakemake's
``validate`` fills them) and a direct call.
"""

from __future__ import annotations

import copy
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

PATH = Path(__file__).resolve().parents[2] / "config" / "schema.yaml"


@lru_cache(maxsize=1)
def _schema() -> dict:
    try:
        # read by every process that imports a stage module: the C loader where PyYAML has it
        return yaml.load(PATH.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except OSError as exc:
        raise RuntimeError(f"the config schema {PATH} cannot be read ({exc}): pairaudit runs from its checkout") from exc


def _properties(path: tuple[str, ...]) -> dict[str, Any]:
    node = _schema()
    for key in path:
        node = node["properties"][key]
    return node["properties"]


def section(*path: str) -> dict[str, Any]:
    """``{key: default}`` of the section at ``path`` (e.g. ``"speed"``, ``"scoring", "sandbox"``); a fresh copy."""
    return {k: copy.deepcopy(v["default"]) for k, v in _properties(path).items() if "default" in v}


def items(*path: str) -> dict[str, Any]:
    """``{key: default}`` of each item of the array at ``path`` (e.g. ``"speed", "cells"``); a fresh copy."""
    node = _properties(path[:-1])[path[-1]]["items"]["properties"]
    return {k: copy.deepcopy(v["default"]) for k, v in node.items() if "default" in v}


def filled(value: Any, *path: str) -> Any:
    """A copy of the section ``value`` at ``path`` with the schema's defaults filled in, nested sections too.

    What Snakemake's ``validate`` does to the workflow's config, for a caller
    that holds a config the schema has not seen (a library call, a test); a
    validated section comes back equal.
    """
    node = _node(path)
    if value is None:  # an absent section: the schema's default for it, as validation fills it
        value = copy.deepcopy(node.get("default"))
    return _fill(copy.deepcopy(value), node)


def _node(path: tuple[str, ...]) -> dict[str, Any]:
    node = _schema()
    for key in path:
        node = node["properties"][key]
    return node


def _fill(value: Any, node: dict[str, Any]) -> Any:
    if isinstance(value, dict) and "properties" in node:
        for key, sub in node["properties"].items():
            if key in value:
                value[key] = _fill(value[key], sub)
            elif "default" in sub:
                value[key] = _fill(copy.deepcopy(sub["default"]), sub)
    elif isinstance(value, list) and isinstance(node.get("items"), dict):
        value = [_fill(v, node["items"]) for v in value]
    return value


def keys(*path: str) -> set[str]:
    """Every key the section at ``path`` allows."""
    return set(_properties(path))
