"""Decode tokens/s of the reference server, CUDA-graphed vs eager, through its real HTTP server, in one run.

Starts the server as a subprocess per decode mode (``PAIRAUDIT_REF_CUDA_GRAPHS=1``
and ``=0``) on a loopback port, streams greedy chat requests with a fixed
output length (``ignore_eos``) at concurrency 1 and 4, and prints the decode
rate of each mode and the graphed/eager ratios, all measured in this run.
Rounds alternate the servers (graphed, eager, graphed, eager, ...) so a burst
of outside load hits both; the median of the rounds is reported.  Decode rate
= tokens after each stream's first / (end of the last stream - latest first
token): the prefill is left out.

Each server's ``/version`` (torch, CUDA, device, decode mode) is printed, and
the change of ``pairaudit:decode_graph_replays_total`` during the measurement,
so a "graphed" row that did not replay graphs cannot pass unnoticed.

On a CPU (``--device cpu``, or ``auto`` without a GPU) only the eager server
runs: CUDA graphs are not applicable there and are reported so, which makes
the script testable on a machine without a GPU.

Usage: python bench/refserver_gpu.py [--device auto|cuda|cpu] [--dtype bfloat16] [--tokens 128]
           [--rounds 3] [--max-num-seqs 8] [--threads 0]
Smoke test on a CPU: python bench/refserver_gpu.py --device cpu --dtype float32 --tokens 16 --rounds 1 --threads 1
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
from pathlib import Path

import requests

# one way to start and stop a server for every bench (bench/refserver.py)
import refserver as bench_refserver  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
MODEL = "SmolLM2-135M-Instruct"
PROMPTS = ["Write a short story about a robot.", "Explain why the sky is blue.", "List some fruits.",
           "Describe a busy city street."]
CONCURRENCY = (1, 4)
REPLAYS = "pairaudit:decode_graph_replays_total"


class Server(bench_refserver.Server):
    """bench/refserver.py's server process, started with this checkout on its PYTHONPATH, plus its facts."""

    def __init__(self, name: str, args: list[str], env: dict, timeout: float = 600):
        pythonpath = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
        super().__init__(name, [sys.executable, "-m", "pairaudit.refserver", *args],
                         {**env, "PYTHONPATH": pythonpath}, timeout)

    def info(self) -> dict:
        return requests.get(self.url + "/version", timeout=10).json()["pairaudit"]



def chat_body(prompt: str, n: int) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": prompt}], "max_tokens": n, "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}


def decode_rate(url: str, concurrency: int, n: int) -> float:
    """Decode tokens/s summed over ``concurrency`` simultaneous streams of ``n`` forced tokens each."""
    results: list = [None] * concurrency
    errors: list[Exception] = []

    def run(i: int) -> None:
        try:
            results[i] = bench_refserver.stream_times(url, chat_body(PROMPTS[i % len(PROMPTS)], n))
        except Exception as exc:  # reported below, not swallowed
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    tokens = [r[3] for r in results]
    if tokens != [n] * concurrency:
        raise RuntimeError(f"{url}: asked for {n} forced tokens per stream, got {tokens}")
    first_all = max(r[1] for r in results)
    end_all = max(r[2] for r in results)
    return sum(t - 1 for t in tokens) / (end_all - first_all)


def warm_up(server: Server, n: int) -> None:
    """Every concurrency once, at full length: a graphed server captures its shapes here, not while timed."""
    for c in CONCURRENCY:
        decode_rate(server.url, c, n)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    ap.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="bfloat16")
    ap.add_argument("--tokens", type=int, default=128, help="forced output tokens per request")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds; the median is reported")
    ap.add_argument("--max-num-seqs", type=int, default=8)
    ap.add_argument("--max-model-len", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=0, help="the server's torch CPU threads (0: torch's default)")
    args = ap.parse_args(argv)

    import torch  # only to resolve auto as the server will

    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    modes = ("graphed", "eager") if device == "cuda" else ("eager",)
    common = ["--device", device, "--dtype", args.dtype, "--max-model-len", str(args.max_model_len),
              "--max-num-seqs", str(args.max_num_seqs), "--threads", str(args.threads)]
    print(f"device {device}, dtype {args.dtype}, {args.tokens} forced tokens, concurrency {CONCURRENCY}, "
          f"{args.rounds} rounds; torch {torch.__version__} (CUDA {torch.version.cuda})", flush=True)
    servers: dict[str, Server] = {}
    rates: dict[tuple[str, int], list[float]] = {}
    replays: dict[str, float] = {}
    try:
        for mode in modes:
            env = {"PAIRAUDIT_REF_CUDA_GRAPHS": "1" if mode == "graphed" else "0"}
            s = servers[mode] = Server(mode, common, env)
            info = s.info()
            print(f"{mode}: started in {s.start_seconds:.1f} s on {info['device']} ({info['device_name']}), "
                  f"torch {info['torch']}, CUDA {info['cuda']}, decode {info['decode']['mode']}", flush=True)
            warm_up(s, args.tokens)
        before = {m: s.metrics((REPLAYS,))[REPLAYS] for m, s in servers.items()}
        for r in range(args.rounds):
            for c in CONCURRENCY:
                for mode, s in servers.items():
                    rate = decode_rate(s.url, c, args.tokens)
                    rates.setdefault((mode, c), []).append(rate)
                    print(f"  round {r + 1} {mode:8s} c={c}: {rate:8.1f} tok/s", flush=True)
        replays = {m: s.metrics((REPLAYS,))[REPLAYS] - before[m] for m, s in servers.items()}
    finally:
        for s in servers.values():
            s.stop()
    med = {k: statistics.median(v) for k, v in rates.items()}
    print(f"\n| decode ({device}, {args.dtype}) | c=1 tok/s | c=4 tok/s | graph replays while timed |")
    print("|---|---|---|---|")
    for mode in modes:
        print(f"| {mode} | {med[(mode, 1)]:.1f} | {med[(mode, 4)]:.1f} | {replays[mode]:.0f} |")
    if device == "cuda":
        if not replays["graphed"] or replays["eager"]:
            print(f"WARNING: graph replays graphed={replays['graphed']:.0f}, eager={replays['eager']:.0f}: "
                  "the modes did not run as labelled")
        print("\n| ratio graphed / eager | c=1 | c=4 |\n|---|---|---|")
        print(f"| this run | {med[('graphed', 1)] / med[('eager', 1)]:.2f}x | "
              f"{med[('graphed', 4)] / med[('eager', 4)]:.2f}x |")
        spreads = {k: (max(v) - min(v)) / statistics.median(v) for k, v in rates.items()}
        print("\nspread over rounds (max-min)/median: "
              + ", ".join(f"{m} c={c} {100 * spreads[(m, c)]:.1f} %" for m, c in rates))
    else:
        print("\ngraphed: not applicable (CUDA graphs need a CUDA device; this run is on the CPU)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
