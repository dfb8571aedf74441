"""How much of the reference server's inter-token time is its loop, not its decode step, in one run.

Measures, on one device and dtype, all in this run:

1. ``bare_step_ms``: the decode step alone at batch 1, the way the server runs
   it.  On CUDA, the server's own :class:`CudaDecoder` captures its step at
   batch 1 (the context bucket of this run's streams) and the graph is
   replayed back to back, timed with CUDA events (device time per step, no
   host in between).  On a CPU, one eager decode forward of one token.
2. ``itl_median_ms`` / ``itl_p99_ms``: the server's inter-token gaps at
   concurrency 1, as a client sees them: the arrival times of a streamed
   greedy chat's SSE events, ``--tokens`` forced tokens per stream
   (``ignore_eos``), ``--streams`` streams after a warm-up.
3. ``itl_over_step``: median gap / bare step (target <= 1.3 on an H200).
4. ``items_per_s``: sampled throughput at concurrency 16 on a GSM8K-like chat
   workload (generated grade-school arithmetic word problems, temperature
   0.7, seeded, up to ``--max-tokens`` tokens each, non-streamed as the
   audit's sampled phase sends them): finished items / wall time (target >= 40
   on an H200).

Prints one JSON object on stdout (progress goes to stderr) and writes it to
``--out`` when given.  The server is ``python -m pairaudit.refserver`` from
this checkout, started on a free loopback port.

On an H200:  python bench/refserver_loop.py --device cuda --dtype bfloat16 --out refserver-loop.json
A quick CPU rehearsal:  python bench/refserver_loop.py --quick
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

import requests

import refserver as bench_refserver  # one way to start and stop a server for every bench (bench/refserver.py)

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
MODEL = "SmolLM2-135M-Instruct"
ITL_PROMPT = "Write a long story about a robot who learns to paint."
CONCURRENCY = 16


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


class Server(bench_refserver.Server):
    def __init__(self, args: list[str], env: dict, timeout: float = 600):
        pythonpath = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
        super().__init__("refserver", [sys.executable, "-m", "pairaudit.refserver", *args],
                         {**env, "PYTHONPATH": pythonpath}, timeout)

    def info(self) -> dict:
        return requests.get(self.url + "/version", timeout=30).json()["pairaudit"]


# the engine's own account of a phase's steps (pairaudit/refserver/metrics.py)
STEP_COUNTERS = ("pairaudit:engine_steps_total", "pairaudit:decode_steps_total", "pairaudit:step_rows_total",
                 "pairaudit:decode_step_seconds_total", "pairaudit:forward_step_seconds_total",
                 "pairaudit:sampler_seconds_total", "pairaudit:loop_io_seconds_total",
                 "pairaudit:decode_graph_replays_total", "pairaudit:decode_graph_captures_total")


def step_breakdown(d: dict[str, float], wall: float) -> dict:
    """Where a phase's wall time went, from the engine's counters over it: which kind of step, how many,
    how long each took on average, the sampler's and the loop's shares, and the time no step ran."""
    steps, decode = d["pairaudit:engine_steps_total"], d["pairaudit:decode_steps_total"]
    forward = steps - decode
    busy = d["pairaudit:decode_step_seconds_total"] + d["pairaudit:forward_step_seconds_total"]
    io = d["pairaudit:loop_io_seconds_total"]

    def ms(seconds: float, n: float) -> float | None:
        return round(1e3 * seconds / n, 3) if n else None

    return {"steps": int(steps), "decode_steps": int(decode), "forward_steps": int(forward),
            "graph_replays": int(d["pairaudit:decode_graph_replays_total"]),
            "graph_captures": int(d["pairaudit:decode_graph_captures_total"]),
            "rows_per_step": round(d["pairaudit:step_rows_total"] / steps, 2) if steps else None,
            "decode_step_ms": ms(d["pairaudit:decode_step_seconds_total"], decode),
            "forward_step_ms": ms(d["pairaudit:forward_step_seconds_total"], forward),
            "sampler_ms_per_step": ms(d["pairaudit:sampler_seconds_total"], steps),
            "loop_io_ms_per_step": ms(io, steps),
            "steps_share_of_wall": round(busy / wall, 3), "loop_io_share_of_wall": round(io / wall, 3),
            "idle_share_of_wall": round(max(0.0, 1.0 - (busy + io) / wall), 3)}


# --- 1. the bare step ---------------------------------------------------------------
def bare_step_ms(device: str, dtype: str, context: int, max_model_len: int, reps: int) -> dict:
    import torch

    from pairaudit.refserver.model import LlamaModel, Segment, layout_cache_path
    from pairaudit.refserver.numerics import Numerics
    from pairaudit.refserver.switches import Switches
    from pairaudit.serving.modelstore import resolve_model

    path, ident = resolve_model(MODEL)
    model = LlamaModel(path, numerics=Numerics.from_switches(Switches(), dtype), device=device,
                       layout_cache=layout_cache_path(ident["weights_sha256"]))
    if device == "cuda":
        from pairaudit.refserver.cuda import CudaDecoder

        dec = CudaDecoder(model, max_num_seqs=1, max_model_len=max_model_len, graphs=True)
        cache = dec.new_cache()
        cache.length = context - 1
        dec.decode([42], [Segment(cache, context - 1, 1)])  # captures the graph of batch 1 at this bucket
        graph, _ = dec.graphs[(1, dec.bucket(context))]
        for _ in range(20):
            graph.replay()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        ms = start.elapsed_time(end) / reps
        out = {"what": f"CUDA graph replay of the server's decode step, batch 1, context bucket "
                       f"{dec.bucket(context)}, {reps} back to back (CUDA events)", "ms": ms}
        del dec, graph
        torch.cuda.empty_cache()
        return out
    cache = model.new_cache(context + 1)
    ids = torch.full((context - 1,), 42, dtype=torch.long)
    model.forward(ids, [Segment(cache, 0, context - 1)])
    cache.length = context - 1
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        model.logits(model.forward(torch.tensor([42]), [Segment(cache, context - 1, 1)]))
        times.append(time.perf_counter() - t)
    return {"what": f"eager decode forward of 1 token at position {context - 1} on the CPU, median of {reps}",
            "ms": 1e3 * statistics.median(times)}


# --- 2. inter-token gaps at concurrency 1 ---------------------------------------------
def stream_gaps(port: int, tokens: int) -> list[float]:
    """Arrival gaps (s) between the token events of one streamed greedy chat of ``tokens`` forced tokens."""
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": ITL_PROMPT}], "max_tokens": tokens,
                       "temperature": 0, "ignore_eos": True, "stream": True}).encode()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    arrivals = []
    for line in resp:
        if line.startswith(b"data: {"):
            arrivals.append(time.perf_counter())
    conn.close()
    arrivals = arrivals[1:]  # the first event is the role delta, sent before any token
    if len(arrivals) != tokens:
        raise RuntimeError(f"asked for {tokens} forced tokens, got {len(arrivals)} token events")
    return [b - a for a, b in zip(arrivals, arrivals[1:])]


def percentile(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


# --- 3. sampled items/s at concurrency 16 ---------------------------------------------
def gsm8k_like(n: int) -> list[str]:
    from pairaudit.datasets.suites import arith_suite

    return [f"{item['question']}\nSolve it step by step, then give the final answer as 'The answer is N'."
            for item in arith_suite(n, seed=11)]


def items_per_second(url: str, questions: list[str], max_tokens: int) -> tuple[float, int]:
    """(finished items / wall seconds, completion tokens) at CONCURRENCY workers over ``questions``."""
    todo = list(enumerate(questions))
    lock = threading.Lock()
    tokens = [0]
    errors: list[Exception] = []

    def worker() -> None:
        with requests.Session() as s:
            while True:
                with lock:
                    if not todo or errors:
                        return
                    i, q = todo.pop(0)
                try:
                    r = s.post(url + "/v1/chat/completions", timeout=600, json={
                        "model": MODEL, "messages": [{"role": "user", "content": q}], "max_tokens": max_tokens,
                        "temperature": 0.7, "top_p": 0.95, "seed": 1000 + i})
                    r.raise_for_status()
                    with lock:
                        tokens[0] += r.json()["usage"]["completion_tokens"]
                except Exception as exc:  # reported below
                    errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(CONCURRENCY)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    if errors:
        raise errors[0]
    return len(questions) / wall, tokens[0]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    ap.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default=None,
                    help="default: bfloat16 on CUDA, float32 on a CPU")
    ap.add_argument("--tokens", type=int, default=256, help="forced tokens per ITL stream")
    ap.add_argument("--streams", type=int, default=5, help="ITL streams measured (after one warm-up stream)")
    ap.add_argument("--items", type=int, default=320, help="GSM8K-like items in the throughput phase")
    ap.add_argument("--max-tokens", type=int, default=160, help="max_tokens per item (the audit's sampled phase)")
    ap.add_argument("--step-reps", type=int, default=500, help="bare steps timed")
    ap.add_argument("--max-model-len", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=0, help="the server's torch CPU threads (0: torch's default)")
    ap.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                    help="a server switch, e.g. PAIRAUDIT_REF_STEP_DELAY_US=200 (repeatable)")
    ap.add_argument("--quick", action="store_true",
                    help="tiny sizes for a CPU rehearsal: 16 tokens, 2 streams, 16 items of 8 tokens, 5 steps")
    ap.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    args = ap.parse_args(argv)
    if args.quick:
        args.tokens, args.streams, args.items, args.max_tokens, args.step_reps = 16, 2, 16, 8, 5
        args.threads = args.threads or 1

    import torch

    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = args.dtype or ("bfloat16" if device == "cuda" else "float32")
    env = dict(kv.split("=", 1) for kv in args.env)
    context = 40 + args.tokens  # about where the ITL streams decode (a ~30-token chat prompt, then the output)
    if args.threads:
        torch.set_num_threads(args.threads)
    log(f"bare step: {device}, {dtype}, context {context}")
    step = bare_step_ms(device, dtype, context, args.max_model_len, args.step_reps)
    log(f"  {step['ms']:.3f} ms ({step['what']})")

    server_args = ["--device", device, "--dtype", dtype, "--max-model-len", str(args.max_model_len),
                   "--max-num-seqs", str(CONCURRENCY), "--threads", str(args.threads)]
    server = Server(server_args, env)
    try:
        info = server.info()
        log(f"server started in {server.start_seconds:.1f} s: {info['device']} ({info['device_name']}), "
            f"decode {info['decode']['mode']}, switches set: "
            f"{ {k: v for k, v in info['switches'].items() if k in env} }")
        port = int(server.url.rsplit(":", 1)[1])
        stream_gaps(port, args.tokens)  # warm-up: graph capture, allocator, first-request paths
        gaps: list[float] = []
        for i in range(args.streams):
            g = stream_gaps(port, args.tokens)
            gaps += g
            log(f"  ITL stream {i + 1}: median {1e3 * statistics.median(g):.3f} ms")
        before = server.metrics(STEP_COUNTERS)
        questions = gsm8k_like(args.items)
        t0 = time.perf_counter()
        items_per_s, completion_tokens = items_per_second(server.url, questions, args.max_tokens)
        wall = time.perf_counter() - t0
        after = server.metrics(STEP_COUNTERS)
        steps = after["pairaudit:engine_steps_total"] - before["pairaudit:engine_steps_total"]
        where = step_breakdown({k: after[k] - before[k] for k in STEP_COUNTERS}, wall)
        log(f"  where the steps' time went: {where}")
        log(f"  {args.items} items at concurrency {CONCURRENCY}: {items_per_s:.2f} items/s")
    finally:
        server.stop()
    med, p99 = statistics.median(gaps), percentile(gaps, 0.99)
    result = {
        "device": device, "device_name": info["device_name"], "dtype": dtype, "torch": info["torch"],
        "cuda": info["cuda"], "decode_mode": info["decode"]["mode"], "switches": info["switches"],
        "bare_step_ms": round(step["ms"], 4), "bare_step": step["what"],
        "itl_tokens_per_stream": args.tokens, "itl_streams": args.streams, "itl_gaps": len(gaps),
        "itl_median_ms": round(1e3 * med, 4), "itl_p99_ms": round(1e3 * p99, 4),
        "itl_over_step": round(1e3 * med / step["ms"], 3), "itl_over_step_target": 1.3,
        "items": args.items, "concurrency": CONCURRENCY, "max_tokens": args.max_tokens,
        "items_per_s": round(items_per_s, 3), "items_per_s_target": 40.0,
        "completion_tokens_per_s": round(items_per_s * completion_tokens / args.items, 1),
        "engine_steps_throughput_phase": steps,
        "throughput_phase_wall_s": round(wall, 2),
        "throughput_phase_steps": where,
    }
    text = json.dumps(result, indent=2)
    print(text, flush=True)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
