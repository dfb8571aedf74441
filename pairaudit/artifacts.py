"""Artifacts: JSON documents and JSONL tables that say what they consumed.

Every stage output records the sha256 of each input it read, its parameters
and the code version, so the next stage can check that what it is handed is
what the producer saw (a stale or hand-edited file is an error, not a quiet
mix of evidence).

JSON artifact::

    {"schema": "pairaudit.<stage>/v1", ..., "provenance": {
        "consumed": {"<path>": "<sha256>", ...}, "params": {...},
        "code_version": "<sha256 of pairaudit's sources>", "created_at": "<UTC ISO>"}}

JSONL artifact: the first line is ``{"kind": "header", "schema": ..., "provenance": {...}}``,
every further line is one record (``{"kind": "record", ...}``).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Iterable

PACKAGE_DIR = Path(__file__).resolve().parent


class ArtifactError(RuntimeError):
    """An artifact is missing, malformed, or not what its consumer expects."""


def sha256_file(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def sha256_obj(obj: Any) -> str:
    return sha256_text(canonical(obj))


def code_version() -> str:
    """Content hash of the library's sources: a real code change reruns, a ``touch`` does not."""
    h = hashlib.sha256()
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        h.update(str(path.relative_to(PACKAGE_DIR)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def provenance(inputs: Iterable[str | os.PathLike], params: dict | None = None) -> dict:
    return {
        "consumed": {str(p): sha256_file(p) for p in inputs},
        "params": params or {},
        "code_version": code_version(),
        "created_at": utc_now(),
    }


def _process_umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


# Read once at import: os.umask can only be read by setting it, which is not
# safe to do while other threads create files.
_UMASK = _process_umask()


def _atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    # mkstemp makes the file 0600; an artifact gets the mode any other file
    # would, so the people reviewing a promotion on a shared host can read it.
    os.fchmod(fd, 0o666 & ~_UMASK)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def write_json(path: str | os.PathLike, doc: dict) -> None:
    _atomic_write(Path(path), json.dumps(doc, indent=1, ensure_ascii=False) + "\n")


def read_json(path: str | os.PathLike) -> dict:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ArtifactError(f"{path}: cannot read JSON artifact: {exc}") from None


def write_jsonl(path: str | os.PathLike, header: dict, records: Iterable[dict]) -> None:
    lines = [json.dumps({"kind": "header", **header}, ensure_ascii=False)]
    lines += [json.dumps({"kind": "record", **r}, ensure_ascii=False) for r in records]
    _atomic_write(Path(path), "\n".join(lines) + "\n")


def read_jsonl(path: str | os.PathLike) -> tuple[dict, list[dict]]:
    header, records = None, []
    try:
        with open(path) as f:
            for n, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ArtifactError(f"{path}:{n}: malformed JSON line: {exc}") from None
                if not isinstance(obj, dict):
                    raise ArtifactError(f"{path}:{n}: line is not a JSON object")
                kind = obj.pop("kind", None)
                if kind == "header" and header is None and n == 1:
                    header = obj
                elif kind == "record":
                    records.append(obj)
                else:
                    raise ArtifactError(f"{path}:{n}: unexpected line kind {kind!r}")
    except (OSError, UnicodeDecodeError) as exc:
        raise ArtifactError(f"{path}: cannot read JSONL artifact: {exc}") from None
    if header is None:
        raise ArtifactError(f"{path}: no header line")
    return header, records


def check_consumed(doc: dict, inputs: Iterable[str | os.PathLike], *, where: str) -> None:
    """Every input this job also holds must still be the file ``doc`` was computed from."""
    recorded = (doc.get("provenance") or {}).get("consumed") or {}
    for p in inputs:
        key = str(p)
        if key in recorded:
            actual = sha256_file(p)
            if actual != recorded[key]:
                raise ArtifactError(
                    f"{where}: {key} changed since it was consumed (sha256 {actual[:12]}... != recorded "
                    f"{recorded[key][:12]}...); rerun the workflow so the chain is rebuilt"
                )


def check_schema(doc: dict, schema: str, path: str | os.PathLike) -> dict:
    if doc.get("schema") != schema:
        raise ArtifactError(f"{path}: schema {doc.get('schema')!r}, expected {schema!r}")
    return doc
