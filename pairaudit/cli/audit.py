"""Audit two running OpenAI-compatible endpoints with one command: write their config, keep it, run the workflow.

``pairaudit audit --control URL --candidate URL [--datasets arith,algebra] [--limit N] [--audit NAME]``

Asks each URL's ``/v1/models`` for the model it serves and its context length,
writes a config with the two as attach arms (the form of
``config/examples/vllm-attach.yaml``) to ``config/audits/<audit>.yaml``, and
runs ``snakemake --cores N promotion`` on it in this directory (the pairaudit
checkout). Datasets are named from the ones the project ships: the embedded
default's suites (``config/config.yaml``: no download) and the pinned hub sets
(``config/hub-datasets.yaml``); ``--limit N`` selects N items of each, for a
first look. Sampling is the embedded default's, ``--max-tokens`` aside.

The config is kept: a later ``pairaudit audit`` with the same audit name runs
the kept file as it is (edits included), so the second run reuses every
answer the first one journaled; ``--rewrite`` writes it from the arguments
again. ``snakemake --cores 4 promotion --configfile config/audits/<audit>.yaml
--replace-workflow-config`` runs the same audit. Exit: the decision's code
(PROMOTE 0, REJECT 1, HOLD 3, INCONCLUSIVE 4), 2 when an endpoint does not
answer, an argument is refused or the workflow stops on an error of its own.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from pairaudit.core import artifacts, defaults
from pairaudit.serving.client import Endpoint

from .codes import EXIT, OK, REFUSED
from .verdict import DECISION_REL, load

HELP = "audit two running OpenAI-compatible endpoints: write their config (kept), run the workflow, exit with the decision"
REPO = defaults.PATH.parents[1]
CONFIG_DIR = Path("config") / "audits"
DATASET_FILES = ("config/config.yaml", "config/hub-datasets.yaml")   # where --datasets names come from
DEFAULT_DATASETS = ("arith", "algebra")     # the embedded default's generated suites: nothing to download


class AuditArgsError(ValueError):
    """An argument or an endpoint this command cannot audit; the message says which and why."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--control", required=True, metavar="URL", help="the control server (the change rolled back)")
    p.add_argument("--candidate", required=True, metavar="URL", help="the candidate server (the change on)")
    p.add_argument("--datasets", default=",".join(DEFAULT_DATASETS),
                   help=f"comma list of dataset names (default {','.join(DEFAULT_DATASETS)}; known: the entries of "
                        f"{' and '.join(DATASET_FILES)})")
    p.add_argument("--limit", type=int, default=None, metavar="N",
                   help="N items of each dataset (a first look with few; default: each entry's own selection)")
    p.add_argument("--audit", default="attach", help="the audit's name: results/<audit>/, config/audits/<audit>.yaml")
    p.add_argument("--model", default=None, help="the served model id (default: the one each /v1/models lists)")
    p.add_argument("--max-tokens", type=int, default=None,
                   help="sampling.max_tokens (default: the embedded default's; raise it for a model that reasons "
                        "at length: an answer cut at max_tokens makes its quality gate INVALID)")
    p.add_argument("--api-key-env", default=None, metavar="VAR",
                   help="the environment variable holding both endpoints' API key (sent as a bearer token)")
    p.add_argument("--speculative", choices=("control", "candidate", "both"), default=None,
                   help="the arm(s) that run speculative decoding (preflight checks their draft counters)")
    p.add_argument("--no-speed", action="store_true", help="leave the speed bracket out (speed.enabled false: the "
                   "gate is not evaluated, so the decision cannot be PROMOTE)")
    p.add_argument("--speed-informational", action="store_true",
                   help="a change that is not about speed: only a speed LOSS can block it (speed.informational)")
    p.add_argument("--cores", type=int, default=4, help="snakemake --cores (default 4)")
    p.add_argument("--dry-run", action="store_true", help="write the config and show the jobs (snakemake -n)")
    p.add_argument("--rewrite", action="store_true", help="write config/audits/<audit>.yaml from these arguments "
                   "even when it is kept from an earlier run")


def served_model(url: str, *, model: str | None, api_key: str | None) -> tuple[str, int | None]:
    """(the model id, its max_model_len or None) that ``url``'s /v1/models lists; AuditArgsError otherwise."""
    with Endpoint(url, timeout_s=30, api_key=api_key) as ep:
        res = ep.get_json("/v1/models")
    if res.get("error") is not None or res.get("status") != 200:
        raise AuditArgsError(f"{url}/v1/models did not answer ({res.get('status')}: {res.get('error')}): is the "
                             "server running, and does it need --api-key-env?")
    try:
        cards = [c for c in res["body"]["data"] if isinstance(c, dict) and c.get("id")]
    except (TypeError, KeyError):
        cards = []
    if not cards:
        raise AuditArgsError(f"{url}/v1/models lists no model: {str(res.get('body'))[:200]}")
    ids = [c["id"] for c in cards]
    if model is None and len(cards) > 1:
        raise AuditArgsError(f"{url} serves {len(cards)} models ({', '.join(ids)}): name one with --model")
    card = cards[0] if model is None else next((c for c in cards if c["id"] == model), None)
    if card is None:
        raise AuditArgsError(f"{url} does not serve {model!r} (it serves {', '.join(ids)})")
    mml = card.get("max_model_len")
    return str(card["id"]), mml if isinstance(mml, int) and mml > 0 else None


def known_datasets(root: Path = REPO) -> dict[str, dict]:
    """name -> dataset entry, from the project's own configs (the embedded default's first)."""
    out: dict[str, dict] = {}
    for rel in DATASET_FILES:
        doc = yaml.safe_load((root / rel).read_text()) or {}
        for entry in doc.get("datasets") or []:
            out.setdefault(entry["name"], entry)
    return out


def limited(entry: dict, limit: int | None) -> dict:
    """The entry selecting ``limit`` items (its own seed kept; a generated suite's size at most), a copy."""
    entry = yaml.safe_load(yaml.safe_dump(entry))
    if limit is None:
        return entry
    select = entry.get("select") or {}
    if "indices" in select:
        entry["select"] = {"indices": list(select["indices"])[:limit]}
    else:
        n = (entry.get("source") or {}).get("generated", {}).get("n")
        entry["select"] = {"count": min(limit, n) if isinstance(n, int) else limit, "seed": select.get("seed", 0)}
    return entry


def build_config(args: argparse.Namespace, *, root: Path = REPO) -> dict[str, Any]:
    """The config these arguments give, the endpoints asked for their model (AuditArgsError on a refusal)."""
    if args.limit is not None and args.limit < 1:
        raise AuditArgsError(f"--limit {args.limit}: at least 1")
    api_key = None
    if args.api_key_env:
        api_key = os.environ.get(args.api_key_env)
        if not api_key:
            raise AuditArgsError(f"--api-key-env {args.api_key_env}: the variable is unset or empty here")
    catalogue = known_datasets(root)
    names = [n.strip() for n in args.datasets.split(",") if n.strip()]
    unknown = [n for n in names if n not in catalogue]
    if not names or unknown:
        raise AuditArgsError(f"--datasets {args.datasets}: unknown {', '.join(unknown) or 'empty list'} "
                             f"(allowed: {', '.join(catalogue)})")
    default = yaml.safe_load((root / "config" / "config.yaml").read_text())
    arms: dict[str, dict] = {}
    for arm, url in (("control", args.control), ("candidate", args.candidate)):
        model, mml = served_model(url, model=args.model, api_key=api_key)
        spec: dict[str, Any] = {"mode": "attach", "url": url.rstrip("/"), "model": model,
                                "served_model_name": model}
        if mml is not None:
            spec["max_model_len"] = mml
        spec["speculative"] = args.speculative in (arm, "both")
        spec["health_timeout_s"] = 60
        if args.api_key_env:
            spec["api_key_env"] = args.api_key_env
        arms[arm] = spec
    sampling = dict(default["sampling"])
    if args.max_tokens is not None:
        sampling["max_tokens"] = args.max_tokens
    config: dict[str, Any] = {
        "audit": args.audit,
        "arms": arms,
        "datasets": [limited(catalogue[n], args.limit) for n in names],
        "sampling": sampling,
        # the greedy runs answer the same prompts: no longer than a sampled answer
        "greedy": {"max_tokens": min(sampling["max_tokens"], defaults.section("greedy")["max_tokens"])},
    }
    if args.no_speed:
        config["speed"] = {"enabled": False}
    else:
        speed: dict[str, Any] = {}
        cells = fitted_cells([a["max_model_len"] for a in arms.values() if "max_model_len" in a])
        if cells is not None:
            speed["cells"] = cells
        if args.speed_informational:
            speed["informational"] = True
        if speed:
            config["speed"] = speed
    return config


def fitted_cells(max_model_lens: list[int]) -> list[dict] | None:
    """The schema's speed cells with every prompt that would not fit the smallest context shortened to fit
    (the load check refuses a cell whose input_len + output_len exceeds an arm's max_model_len); None when
    they fit as they are."""
    speed = defaults.section("speed")
    cells = [{**defaults.items("speed", "cells"), **c} for c in speed["cells"]]
    if not max_model_lens:
        return None
    room = min(max_model_lens) - int(speed["output_len"]) - 16   # a few tokens for the chat markers
    if all(c["prompt"] == "short" or c["input_len"] <= room for c in cells):
        return None
    if room < 16:
        raise AuditArgsError(f"max_model_len {min(max_model_lens)} leaves no room for the speed bracket's "
                             f"{speed['output_len']} forced output tokens: pass --no-speed")
    return [c if c["prompt"] == "short" else {**c, "input_len": min(c["input_len"], room)} for c in cells]


def header(args: argparse.Namespace) -> str:
    return ("# written by `pairaudit audit` (pairaudit/cli/audit.py) for two attached endpoints; kept for the next\n"
            f"# run: `pairaudit audit --control {args.control} --candidate {args.candidate} --audit {args.audit}`\n"
            "# runs this file as it is (edit it freely; --rewrite writes it from the arguments again), and so does\n"
            f"# `snakemake --cores 4 promotion --configfile {CONFIG_DIR / (args.audit + '.yaml')} "
            "--replace-workflow-config`.\n")


def kept_config(path: Path, args: argparse.Namespace) -> dict[str, Any]:
    """The kept config at ``path``, checked to be of these endpoints (AuditArgsError naming the difference)."""
    doc = yaml.safe_load(path.read_text()) or {}
    arms = doc.get("arms") or {}
    for arm, url in (("control", args.control), ("candidate", args.candidate)):
        kept = (arms.get(arm) or {}).get("url")
        if kept != url.rstrip("/"):
            raise AuditArgsError(f"{path} is kept from an earlier run with arms.{arm}.url {kept}, not {url}: "
                                 "pass --audit NAME for another audit, or --rewrite to write it from these arguments")
    return doc


def snakemake_command() -> list[str]:
    exe = Path(sys.executable).with_name("snakemake")
    return [str(exe) if exe.exists() else (shutil.which("snakemake") or "snakemake")]


def run(args: argparse.Namespace) -> int:
    project = Path.cwd()
    if not (project / "Snakefile").is_file():
        print(f"pairaudit audit: no Snakefile in {project}: run it in the pairaudit checkout", file=sys.stderr)
        return REFUSED
    if not all(c.isalnum() or c in "_.-" for c in args.audit) or not args.audit:
        print(f"pairaudit audit: --audit {args.audit!r}: letters, digits, '_', '.', '-' only", file=sys.stderr)
        return REFUSED
    path = project / CONFIG_DIR / f"{args.audit}.yaml"
    try:
        if path.is_file() and not args.rewrite:
            kept_config(path, args)
            print(f"pairaudit audit: running the kept {path.relative_to(project)} (--rewrite writes it anew)")
        else:
            config = build_config(args)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(header(args) + yaml.safe_dump(config, sort_keys=False))
            print(f"pairaudit audit: wrote {path.relative_to(project)}")
    except (AuditArgsError, OSError) as exc:
        print(f"pairaudit audit: {exc}", file=sys.stderr)
        return REFUSED
    cmd = [*snakemake_command(), "--cores", str(args.cores), "promotion", "--configfile",
           str(path.relative_to(project)), "--replace-workflow-config", *(["-n"] if args.dry_run else [])]
    print("pairaudit audit: " + " ".join(cmd), flush=True)
    proc = subprocess.run(cmd, cwd=project)
    if proc.returncode != 0:
        print(f"pairaudit audit: snakemake exited {proc.returncode} (an error of the audit itself: its log "
              "above names it)", file=sys.stderr)
        return REFUSED
    if args.dry_run:
        return OK
    decision_file = project / "results" / args.audit / DECISION_REL
    try:
        decision = load(decision_file)
    except artifacts.ArtifactError as exc:
        print(f"pairaudit audit: {exc}", file=sys.stderr)
        return REFUSED
    return EXIT[decision["decision"]]
