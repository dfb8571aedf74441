"""Where a server's repeat-to-repeat speed noise comes from: one start per variant, many repeats, and what each
repeat ran beside (the GPU's clocks, the host's CPU), printed as one table.

The speed bracket sees a server's repeat-to-repeat noise three repeats a start; this runs the control of a
config once per variant and measures ``--repeats`` repeats of every speed cell back to back, as the bracket
does (``pairaudit.speed.bracket.run_start``: the same warm-up, wave plan, prompts and pooled counters), so
that one start says what the bracket needs many for.  Per variant and cell it prints:

- the per-repeat noise (sd / mean of the pooled rate) at the configured ``repeat_s`` and, pooling three
  consecutive repeats, at three times it (what a longer ``speed.repeat_s`` would buy);
- the stream-to-stream spread of TPOT and the inter-token gaps' median and p99;
- how closely the cells' repeats move together (a slow spell of the host slows every cell it covers);
- the GPU's SM clock and utilisation during each repeat (``nvidia-smi`` sampled every 100 ms, where there is
  one) and their correlation with the repeat's rate; the host's busy and steal shares;
- what the busiest thread (the server's host-side loop) went through during each repeat
  (``pairaudit.speed.hostthreads``, sampled every 100 ms by a process of its own): its CPU share, how often it
  moved between CPUs, its run-queue wait, its CPU's clock, and how often another busy thread sat on its
  physical core; and each one's correlation with the repeat's rate.

Variants (``--variant NAME``, repeatable, in order; default ``as-is pin``):

- ``as-is``: the config's own command and environment;
- ``pin``: the server (and every process it starts) on all but the first two of this process's cores, the
  client on those two: no core is shared between the server's host-side loop and the client;
- ``phys``: the client on the first physical core (both its hyperthreads), the server on one hyperthread of
  each other physical core: no two of the server's threads, and no server and client thread, share a
  physical core (on a host without SMT the same as ``pin``);
- ``ENV=VALUE``, or one of ``bench/gpu/vllm_starts.py``'s named variants (``debug``, ``fork``, ...): the server
  started with that variable (its arm's own ``env`` still wins).

Each start's breakdown (``pairaudit.serving.startlog``) comes with its row.  Every start is stopped before the
next.  One JSON line per variant to ``--out``.

Usage: python3 bench/gpu/vllm_noise.py CONFIG [--variant V ...] [--repeats N] [--out FILE] [--logs DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from pairaudit.serving import armspec, launch  # noqa: E402
from pairaudit.speed import bracket, hostthreads  # noqa: E402
from pairaudit.speed.workload import build_prompts  # noqa: E402
from pairaudit.timeplan.history import epoch  # noqa: E402
from vllm_starts import control_spec, variant_env  # noqa: E402   (the start bench beside this one)


class GpuSampler:
    """``nvidia-smi`` every 100 ms in the background, each row stamped on arrival (epoch seconds, as the streams'
    own start stamps)."""

    QUERY = "clocks.sm,clocks.mem,utilization.gpu,power.draw"

    def __init__(self) -> None:
        self.rows: list[tuple[float, list[float]]] = []
        self.proc = None
        exe = shutil.which("nvidia-smi")
        if exe is None:
            return
        self.proc = subprocess.Popen([exe, f"--query-gpu={self.QUERY}", "--format=csv,noheader,nounits", "-i", "0",
                                      "-lms", "100"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                self.rows.append((time.time(), [float(v) for v in line.split(",")]))
            except ValueError:
                continue   # "[N/A]" on a card that does not report a field

    def window(self, t0: float, t1: float) -> dict | None:
        vals = [v for t, v in self.rows if t0 <= t <= t1]
        if not vals:
            return None
        arr = np.array(vals)
        return {"sm_mhz": float(arr[:, 0].mean()), "sm_mhz_min": float(arr[:, 0].min()),
                "mem_mhz": float(arr[:, 1].mean()), "util_pct": float(arr[:, 2].mean()),
                "power_w": float(arr[:, 3].mean()), "samples": len(vals)}

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=10)


def cv_pct(xs) -> float | None:
    xs = [x for x in xs if x is not None]
    return 100.0 * statistics.stdev(xs) / statistics.fmean(xs) if len(xs) >= 2 and statistics.fmean(xs) else None


def corr(a, b) -> float | None:
    pairs = [(x, y) for x, y in zip(a, b) if x is not None and y is not None]
    if len(pairs) < 3:
        return None
    x, y = np.array(pairs).T
    return float(np.corrcoef(x, y)[0, 1]) if x.std() > 0 and y.std() > 0 else None


HOST_KEYS = ("top_share", "top_moves", "top_wait_ms", "top_mhz", "shared_core_pct", "busy_threads")


def summarise(result: dict, records: list[dict], windows: dict, gpu: GpuSampler, host=None) -> dict:
    """Per cell: the noise at repeat_s and at three times it, the streams' spread, the GPU and the host's busiest
    thread beside each repeat (``host(t0, t1)``: ``hostthreads.window`` over the sampler's rows, or None)."""
    cells: dict[str, dict] = {}
    for name, res in result.items():
        rates = [p["pooled_rate_tps"] for p in res["pooled"]]
        triples = [statistics.fmean(rates[i:i + 3]) for i in range(0, len(rates) - 2, 3)]
        streams = [r for r in records if r["cell"] == name]
        tpots = [s["tpot_s"] for s in streams if s.get("tpot_s")]
        itls = [g for s in streams for g in (s.get("itl_s") or [])]
        clocks = [gpu.window(*windows[(name, r)]) for r in range(len(rates))]
        firsts = [s["wave_host_cpu"] for s in streams if s.get("stream") == 0 and s.get("wave_host_cpu")]
        busy = [w.get("busy_pct") for w in firsts]
        threads = [host(*windows[(name, r)]) if host else None for r in range(len(rates))]
        per_repeat = {k: [t and t[k] for t in threads] for k in HOST_KEYS}
        cells[name] = {
            "rates": [round(x, 2) for x in rates],
            "per_repeat_pct": cv_pct(rates), "per_3_repeats_pct": cv_pct(triples),
            "stream_tpot_pct": cv_pct(tpots),
            "itl_ms_median": 1000 * float(np.median(itls)) if itls else None,
            "itl_ms_p99": 1000 * float(np.percentile(itls, 99)) if itls else None,
            "sm_mhz": [c and round(c["sm_mhz"]) for c in clocks],
            "util_pct": [c and round(c["util_pct"]) for c in clocks],
            "corr_rate_sm": corr(rates, [c and c["sm_mhz"] for c in clocks]),
            "host_busy_pct": busy or None,
            "host_steal_pct": [w.get("steal_pct") for w in firsts] or None,
            "top_thread": sorted({t["top"] for t in threads if t}) or None,
            **per_repeat,
            **{f"corr_rate_{k}": corr(rates, v) for k, v in per_repeat.items()},
        }
    names = list(cells)
    if len(names) >= 2:
        cells["_cells_move_together"] = corr(cells[names[0]]["rates"], cells[names[1]]["rates"])
    return cells


def start_thread_sampler(out: Path) -> subprocess.Popen:
    """The host sampler as a process of its own (on this process's cores as they are now), following this
    process and everything under it: the client, the server and the server's engine process."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    return subprocess.Popen([sys.executable, "-m", "pairaudit.speed.hostthreads", str(os.getpid()), str(out), "0.1"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def measure(spec: armspec.ArmSpec, speed, *, model: str, log_path: Path, client_cpus: set[int] | None) -> dict:
    gpu = GpuSampler()
    mine = os.sched_getaffinity(0)
    threads_path = log_path.with_suffix(".threads.jsonl")
    sampler = None
    try:
        with launch.Server(spec, log_path=log_path, timeout_s=speed.request_timeout_s) as srv:
            if client_cpus:
                os.sched_setaffinity(0, client_cpus)   # the server, started above, kept the wider set
            sampler = start_thread_sampler(threads_path)
            facts = srv.facts()
            ep = srv.endpoint
            prompts = build_prompts(ep, model, speed.cells, speed.repeats, speed.waves, speed.base_seed)
            durations, _ = bracket.warm_up(ep, model=model, speed=speed, prompts=prompts, start="s1", arm="control",
                                           timed=bool(speed.repeat_s))
            plan = bracket.wave_plan(speed, durations)
            prompts = build_prompts(ep, model, speed.cells, speed.repeats, plan, speed.base_seed)
            result, records = bracket.run_start(ep, model=model, speed=speed, prompts=prompts, start="s1",
                                                arm="control", plan=plan)
            srv.assert_alive()
    finally:
        os.sched_setaffinity(0, mine)
        gpu.stop()
        if sampler is not None:
            sampler.terminate()
            sampler.wait(timeout=10)
    # each repeat's window: from its first wave's start stamp to the end of its last wave's first stream
    windows: dict = {}
    for rec in records:
        if rec["cell"] == "warmup" or rec["stream"] != 0:
            continue
        started = epoch(rec["wave_started_at"])
        lo, hi = windows.get((rec["cell"], rec["repeat"]), (started, started))
        windows[(rec["cell"], rec["repeat"])] = (min(lo, started), max(hi, started + (rec.get("e2el_s") or 0.0)))
    rows = hostthreads.load(threads_path)
    cores = hostthreads.core_of()
    return {"ready_s": facts.get("ready_s"), "breakdown": facts.get("breakdown"), "plan": plan,
            "cells": summarise(result, records, windows, gpu,
                               host=lambda t0, t1: hostthreads.window(rows, t0, t1, cores)),
            "gpu_samples": len(gpu.rows), "thread_samples": len(rows), "threads_file": str(threads_path)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("config")
    ap.add_argument("--variant", action="append", default=None)
    ap.add_argument("--repeats", type=int, default=12, help="repeats of every cell in one start")
    ap.add_argument("--out", default=None, help="append one JSON line per variant here")
    ap.add_argument("--logs", default=None, help="server logs here (default: a temp dir)")
    args = ap.parse_args(argv)
    cfg, spec, logs = control_spec(args.config, args.logs, "vllm-noise-")
    speed = dataclasses.replace(bracket.resolve(cfg.get("speed")), repeats=args.repeats)
    model = spec.served_model_name
    cores = sorted(os.sched_getaffinity(0))
    topology = hostthreads.host_topology()
    print(json.dumps({"host": topology, "cores": cores}), flush=True)
    for name in args.variant or ["as-is", "pin"]:
        env: dict[str, str] = {}
        client = server = None
        if name in ("pin", "phys"):
            split = split_cores(cores, hostthreads.core_of(), phys=name == "phys")
            if split is None:
                print(json.dumps({"variant": name, "error": f"{len(cores)} cores: too few to pin apart"}))
                continue
            client, server = split
            os.sched_setaffinity(0, server)   # the server inherits this set at its start
        else:
            try:
                env = variant_env(name)
            except SystemExit as exc:
                raise SystemExit(f"{exc}, or pin") from None
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        t0 = time.monotonic()
        try:
            row = {"variant": name, "host": topology,
                   "client_cpus": sorted(client) if client else None, "server_cpus": sorted(server) if server else None,
                   **measure(spec, speed, model=model,
                             log_path=logs / f"{name.replace('=', '-')}.log", client_cpus=client)}
        except Exception as exc:   # a variant that fails is a result too
            row = {"variant": name, "error": str(exc).split("\n")[0]}
        finally:
            os.sched_setaffinity(0, set(cores))
            for k, v in saved.items():
                os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
        row["wall_s"] = round(time.monotonic() - t0, 1)
        print(json.dumps(row, default=str), flush=True)
        if args.out:
            with open(args.out, "a") as fh:
                fh.write(json.dumps(row, default=str) + "\n")
        for cell, c in row.get("cells", {}).items():
            if isinstance(c, dict):
                print(f"{name:>8} {cell:>10}: per repeat {_p(c['per_repeat_pct'])} % (x3: {_p(c['per_3_repeats_pct'])} %)"
                      f"  stream TPOT {_p(c['stream_tpot_pct'])} %  ITL p50/p99 {_p(c['itl_ms_median'])}/"
                      f"{_p(c['itl_ms_p99'])} ms  rate~SM clock r={_p(c['corr_rate_sm'])}", flush=True)
                print(f"{name:>8} {cell:>10}: busiest thread {c['top_thread']}: rate~ core shared"
                      f" r={_p(c['corr_rate_shared_core_pct'])}, moves r={_p(c['corr_rate_top_moves'])},"
                      f" run-queue wait r={_p(c['corr_rate_top_wait_ms'])}, CPU clock r={_p(c['corr_rate_top_mhz'])},"
                      f" CPU share r={_p(c['corr_rate_top_share'])}", flush=True)
    return 0


def split_cores(cores: list[int], core_of: dict[int, tuple[int, ...]], *, phys: bool
                ) -> tuple[set[int], set[int]] | None:
    """(client CPUs, server CPUs) out of ``cores``. ``pin``: the first two for the client, the rest for the server.
    ``phys``: the client on every hyperthread of the first physical core (two physical cores where there is no
    SMT), the server on one hyperthread of each physical core left. None where too few are left."""
    if not phys:
        return (set(cores[:2]), set(cores[2:])) if len(cores) >= 4 else None
    firsts = hostthreads.one_per_core(cores, core_of)
    taken = [c for c in cores if core_of.get(c, (c,)) == core_of.get(cores[0], (cores[0],))]
    if len(taken) < 2:                                  # no SMT: two whole cores for the client
        taken = firsts[:2]
    client_cores = {core_of.get(c, (c,)) for c in taken}
    server = [c for c in firsts if core_of.get(c, (c,)) not in client_cores]
    return (set(taken), set(server)) if len(server) >= 2 else None


def _p(x) -> str:
    return "-" if x is None else f"{x:.2f}"


if __name__ == "__main__":
    sys.exit(main())
