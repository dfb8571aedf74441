"""Measure how the embedded default's datasets fare on the reference server, per suite and base seed.

For each arm (its env switches from the config), starts the reference server
once, sends the exact request bodies the sampled stage sends
(``pairaudit.plans.requests.request_body``) for every dataset of the config under
each base seed, scores the answers with ``pairaudit.quality.scoring`` and prints, per
dataset, arm and seed: accuracy, natural finishes (finish_reason "stop") and
the longest answer in tokens; then wall times. Seeds differ only in
``sampling.base_seed`` (item seed = base_seed + index), so each seed is an
independent sampled run of the same items.

Usage (from the repository root)::

    .venv/bin/python bench/calibrate_default.py                       # config/config.yaml, 3 seeds, both arms
    .venv/bin/python bench/calibrate_default.py --seeds 3 --arms control --datasets arith,algebra
    .venv/bin/python bench/calibrate_default.py --count 8             # fewer items per dataset (quick look)
    .venv/bin/python bench/calibrate_default.py --seed-index 1,2 --arms candidate   # base seeds k = 1 and 2 only

The machine's load average is printed before and after: on a shared CPU the
wall times are only comparable to runs at a similar load.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pairaudit.core import defaults  # noqa: E402
from pairaudit.datasets import formats as datasets  # noqa: E402
from pairaudit.plans import change  # noqa: E402
from pairaudit.plans import requests as plan_requests  # noqa: E402
from pairaudit.quality import scoring  # noqa: E402

# Every reference-server switch, so a switch left in the caller's environment never leaks into an arm.
SWITCHES = ("PAIRAUDIT_REF_LM_HEAD_BF16", "PAIRAUDIT_REF_SPEC_NGRAM", "PAIRAUDIT_REF_FAULT_TAIL",
            "PAIRAUDIT_REF_FAULT_NOISE")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """The reference server of one arm on a free loopback port; stopped (its process group) on exit."""

    def __init__(self, env: dict, max_model_len: int, log: Path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        full = {**os.environ, **{k: "0" for k in SWITCHES}, **{k: str(v) for k, v in env.items()}}
        self.log = open(log, "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pairaudit.refserver", "--host", "127.0.0.1", "--port", str(self.port),
             "--max-model-len", str(max_model_len)],
            env=full, cwd=REPO, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"refserver exited {self.proc.returncode}; see {log}")
            try:
                if requests.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.3)
        self.stop()
        raise RuntimeError("refserver did not become healthy in 300 s")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()


def ask(url: str, body: dict, timeout_s: float) -> dict:
    r = requests.post(url + "/v1/chat/completions", json=body, timeout=timeout_s)
    return {"index": None, "response": r.json() if r.status_code == 200 else None,
            "error": None if r.status_code == 200 else f"HTTP {r.status_code}: {r.text[:200]}"}


def run_dataset(url: str, doc: dict, sampling: dict, *, audit: str, model: str, limits: dict) -> dict:
    bodies = [plan_requests.request_body(it, sampling, model=model, audit=audit, dataset=doc["name"])
              for it in doc["items"]]
    with ThreadPoolExecutor(max_workers=int(sampling.get("concurrency", 4))) as ex:
        recs = list(ex.map(lambda b: ask(url, b, float(sampling.get("request_timeout_s", 900))), bodies))
    for it, rec in zip(doc["items"], recs):
        rec["index"] = it["index"]
    scores = scoring.score_records(doc, recs, sandbox_limits=limits)
    tokens = [((r["response"] or {}).get("usage") or {}).get("completion_tokens") or 0 for r in recs]
    return {"n": len(scores), "correct": sum(bool(s["correct"]) for s in scores),
            "natural": sum(s.get("finish_reason") == "stop" for s in scores), "max_tokens_used": max(tokens or [0])}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=str(REPO / "config" / "config.yaml"))
    ap.add_argument("--seeds", type=int, default=3, help="base seeds: sampling.base_seed + 1000 * k, k < N")
    ap.add_argument("--seed-index", default=None,
                    help="comma-separated k of the base seeds to run (instead of --seeds): on a loaded machine, "
                         "run k=0 for every arm first and the other seeds after")
    ap.add_argument("--arms", default="control,candidate")
    ap.add_argument("--datasets", default=None, help="comma-separated names (default: all of the config)")
    ap.add_argument("--count", type=int, default=None, help="override every dataset's select count")
    args = ap.parse_args(argv)
    # A SIGTERM (e.g. a timeout) unwinds through the finally below, so the server is stopped too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    cfg = yaml.safe_load(Path(args.config).read_text())
    problems = change.derive_arms(cfg)  # a config in the change form: its arms, as the workflow derives them
    if problems:
        raise SystemExit("\n".join(problems))
    wanted = set(args.datasets.split(",")) if args.datasets else None
    docs = []
    with tempfile.TemporaryDirectory() as cache:
        for i, d in enumerate(cfg["datasets"]):
            if wanted and d["name"] not in wanted:
                continue
            d = dict(d)
            if args.count:
                d["select"] = {**d["select"], "count": args.count}
            docs.append(datasets.prepare_dataset(d, cache_dir=Path(cache), base_dir=REPO, where=f"datasets[{i}]"))
    sampling = cfg["sampling"]
    ks = [int(k) for k in args.seed_index.split(",")] if args.seed_index else range(args.seeds)
    seeds = [sampling["base_seed"] + 1000 * k for k in ks]
    limits = {**defaults.section("scoring", "sandbox"), **((cfg.get("scoring") or {}).get("sandbox") or {})}
    print(f"load average before: {os.getloadavg()}; cpus {os.cpu_count()}", flush=True)
    print("dataset      arm        base_seed  correct  natural  longest", flush=True)
    t_all = time.monotonic()
    walls, totals, rows = {}, {}, []
    for arm in args.arms.split(","):
        acfg = cfg["arms"][arm]
        t0 = time.monotonic()
        with tempfile.TemporaryDirectory() as logdir:
            srv = Server(acfg.get("env") or {}, int(acfg.get("max_model_len", 2048)), Path(logdir) / "server.log")
            try:
                for seed in seeds:
                    for doc in docs:
                        t1 = time.monotonic()
                        res = run_dataset(srv.url, doc, {**sampling, "base_seed": seed}, audit=cfg["audit"],
                                          model=acfg.get("served_model_name") or acfg["model"], limits=limits)
                        walls[(doc["name"], arm, seed)] = time.monotonic() - t1
                        tot = totals.setdefault((doc["name"], arm), [0, 0, 0])
                        tot[0] += res["correct"]
                        tot[1] += res["n"]
                        tot[2] += res["natural"]
                        rows.append((doc, arm, seed, res))
                        print(f"{doc['name']:<12} {arm:<10} {seed:<10} {res['correct']:>3}/{res['n']:<4} "
                              f"{res['natural']:>3}/{res['n']:<4} {res['max_tokens_used']:>5}  "
                              f"({res['correct'] / max(res['n'], 1):.0%}, {walls[(doc['name'], arm, seed)]:.0f} s)",
                              flush=True)
            finally:
                srv.stop()
        print(f"arm {arm}: {time.monotonic() - t0:.0f} s including server start", flush=True)
    print("\nper dataset and arm over all seeds:")
    for (name, arm), (c, n, nat) in totals.items():
        per_seed = [walls[(name, arm, s)] for s in seeds]
        print(f"  {name:<12} {arm:<10} {c}/{n} = {c / max(n, 1):.0%}, natural {nat}/{n}; sampled wall per seed "
              f"{min(per_seed):.0f}-{max(per_seed):.0f} s")
    # The same rows as a Markdown table, ready for docs/default-audit.md.
    print("\n| suite | arm | base seed | correct | natural finishes | longest answer |\n|---|---|---|---|---|---|")
    for doc, arm, seed, res in rows:
        gen = ((doc.get("source") or {}).get("level"), doc.get("prompt_template"))
        print(f"| {doc['name']} (level {gen[0]}, {gen[1]}) | {arm} | {seed} | {res['correct']}/{res['n']} "
              f"({res['correct'] / max(res['n'], 1):.0%}) | {res['natural']}/{res['n']} | "
              f"{res['max_tokens_used']} tokens |")
    print(f"total wall {time.monotonic() - t_all:.0f} s; load average after: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
