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

Content self-hash: every writer records ``content_sha256`` -- in the JSON
document, or in the JSONL header -- the sha256 of what it wrote, computed over
the canonical JSON (sorted keys, no spaces) of everything else: for a
document, the document without that key; for a table, the header (without
``kind`` and that key) followed by each record (without ``kind``), one
canonical line each, joined by newlines.  Every reader recomputes it and
refuses a file whose content no longer matches, or that carries no hash,
naming the file and both hashes.  So an edit after writing is caught by
whichever stage reads the file next (and at workflow load, by
``verify_tree``), whatever its mtime.  Reformatting a file (indentation, key
order) changes no content and is accepted.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Iterable

PACKAGE_DIR = Path(__file__).resolve().parent


CONTENT_KEY = "content_sha256"
# Directories under an audit that hold no artifacts: the append-only journals
# (resume logs, re-read line by line) and the job and server logs.
# append-only logs (journals, the log of server starts) and job logs are not artifacts; nor are
# exports/, the evidence rewritten in other tools' formats (pairaudit.interop), which carry no self-hash
NOT_ARTIFACT_DIRS = ("journal", "logs", "servers", "exports")


class ArtifactError(RuntimeError):
    """An artifact is missing, malformed, or not what its consumer expects."""


@contextlib.contextmanager
def named_io(path: str | os.PathLike):
    """Re-raise an OSError that names no file (``[Errno 28] No space left on device``) naming ``path``.

    The exception keeps its class and errno, so callers that handle OSError
    still do; only the message gains the file.
    """
    try:
        yield
    except OSError as exc:
        if exc.filename is not None or exc.errno is None:
            raise
        raise type(exc)(exc.errno, exc.strerror, str(path)) from exc


def sha256_file(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def canonical_json(obj: Any) -> str:
    # One byte string per value, whatever the dict insertion order, so hashes
    # of request bodies match across arms and reruns.
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def sha256_json(obj: Any) -> str:
    return sha256_text(canonical_json(obj))


def code_version() -> str:
    """Content hash of the library's sources: a real code change reruns, a ``touch`` does not."""
    h = hashlib.sha256()
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        h.update(str(path.relative_to(PACKAGE_DIR)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def utc_now(timespec: str = "seconds") -> str:
    # Artifacts' timestamps are to the second; server events and streams ask
    # for milliseconds, where start-to-healthy and wave timings are read.
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec=timespec)


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


@contextlib.contextmanager
def atomic_file(path: Path, mode: str = "w"):
    """A new file that replaces ``path`` only once it is written completely."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        # mkstemp makes the file 0600; an artifact gets the mode any other file
        # would, so the people reviewing a promotion on a shared host can read it.
        os.fchmod(fd, 0o666 & ~_UMASK)
        with os.fdopen(fd, mode) as f:
            yield f
        os.replace(tmp, path)
    except BaseException:
        # a full disk must not leave a half-written temp file beside the artifact
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _atomic_write(path: Path, text: str) -> None:
    with named_io(path), atomic_file(path) as f:
        f.write(text)


def _round_trip(obj: Any) -> Any:
    # Hash what a reader will see: JSON turns int keys into strings and tuples
    # into lists, which changes the canonical form of the original object.
    return json.loads(json.dumps(obj, ensure_ascii=False))


def content_sha256_doc(body: dict) -> str:
    """The self-hash of a JSON document (``body`` without its ``content_sha256``)."""
    return sha256_text(canonical_json(body))


def content_sha256_table(header: dict, records: Iterable[dict]) -> str:
    """The self-hash of a JSONL table: header (no ``kind``, no hash) and records (no ``kind``)."""
    h = hashlib.sha256(canonical_json(header).encode())
    for r in records:
        h.update(b"\n")
        h.update(canonical_json(r).encode())
    return h.hexdigest()


def _refuse(path, recorded: str | None, actual: str) -> ArtifactError:
    if recorded is None:
        return ArtifactError(
            f"{path}: carries no {CONTENT_KEY}, so its content cannot be checked (not written by pairaudit's "
            f"artifact writer, or the hash was removed); refusing it. Delete it so its stage recomputes it")
    return ArtifactError(
        f"{path}: content sha256 {actual} does not match the {CONTENT_KEY} {recorded} recorded when it was "
        f"written: the file was edited after it was written. Refusing it; delete it (or rerun its stage with "
        f"--forcerun {path}) so it is recomputed from its inputs")


def write_json(path: str | os.PathLike, doc: dict) -> None:
    body = _round_trip({k: v for k, v in doc.items() if k != CONTENT_KEY})
    body[CONTENT_KEY] = content_sha256_doc(body)
    _atomic_write(Path(path), json.dumps(body, indent=1, ensure_ascii=False) + "\n")


def read_json(path: str | os.PathLike, *, verify: bool = True) -> dict:
    """The document without its ``content_sha256``; refused when that hash does not match (``verify``)."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ArtifactError(f"{path}: cannot read JSON artifact: {exc}") from None
    if not isinstance(doc, dict):
        raise ArtifactError(f"{path}: a JSON artifact must be an object, got {type(doc).__name__}")
    recorded = doc.pop(CONTENT_KEY, None)
    if verify:
        actual = content_sha256_doc(doc)
        if recorded != actual:
            raise _refuse(path, recorded, actual)
    return doc


def write_jsonl(path: str | os.PathLike, header: dict, records: Iterable[dict]) -> None:
    head = _round_trip({k: v for k, v in header.items() if k not in ("kind", CONTENT_KEY)})
    recs = [_round_trip({k: v for k, v in r.items() if k != "kind"}) for r in records]
    head[CONTENT_KEY] = content_sha256_table({k: v for k, v in head.items() if k != CONTENT_KEY}, recs)
    lines = [json.dumps({"kind": "header", **head}, ensure_ascii=False)]
    lines += [json.dumps({"kind": "record", **r}, ensure_ascii=False) for r in recs]
    _atomic_write(Path(path), "\n".join(lines) + "\n")


def read_jsonl(path: str | os.PathLike, *, verify: bool = True) -> tuple[dict, list[dict]]:
    """(header, records) without ``kind`` and ``content_sha256``; refused when the hash does not match."""
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
    recorded = header.pop(CONTENT_KEY, None)
    if verify:
        actual = content_sha256_table(header, records)
        if recorded != actual:
            raise _refuse(path, recorded, actual)
    return header, records


def verify_file(path: str | os.PathLike) -> None:
    """Check one artifact's self-hash (``.json`` or ``.jsonl``); ArtifactError naming it if it fails."""
    if str(path).endswith(".jsonl"):
        read_jsonl(path)
    else:
        read_json(path)


def artifact_paths(root: str | os.PathLike) -> list[Path]:
    """Every JSON/JSONL artifact under an audit directory (journals, logs and temp files excluded)."""
    root = Path(root)
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel = Path(dirpath).relative_to(root)
        if rel.parts[:1] and rel.parts[0] in NOT_ARTIFACT_DIRS:
            dirnames[:] = []
            continue
        dirnames[:] = [d for d in dirnames if not (rel == Path(".") and d in NOT_ARTIFACT_DIRS)]
        for name in filenames:
            if not name.startswith(".") and name.endswith((".json", ".jsonl")):
                out.append(Path(dirpath) / name)
    return sorted(out)


def verify_tree(root: str | os.PathLike) -> list[str]:
    """The problems (one line each, naming the file) of every artifact under ``root``; [] when all match."""
    problems = []
    for p in artifact_paths(root):
        try:
            verify_file(p)
        except ArtifactError as exc:
            problems.append(str(exc))
    return problems


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
