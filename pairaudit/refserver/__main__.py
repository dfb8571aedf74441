"""``python -m pairaudit.refserver``: serve the reference model over vLLM's OpenAI-compatible API.

Two processes: this one loads the model and runs the engine's step loop in its
main thread (:mod:`.core`); the HTTP side runs in a child process
(:mod:`.frontend`, aiohttp), spawned as soon as the model's files are found so
its imports overlap the weights' loading.  Either exits when the other does.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import multiprocessing
import os
import platform
import signal
import sys
import time
from typing import Any

from pairaudit import __version__

VERSION = f"0.0.0+pairaudit.refserver.{__version__}"


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m pairaudit.refserver", description=__doc__)
    ap.add_argument("--model", default="SmolLM2-135M-Instruct",
                    help="the embedded model name, or a directory with a llama transformers checkpoint")
    ap.add_argument("--served-model-name", default=None, help="name clients use (default: --model)")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--max-model-len", type=int, default=8192)
    ap.add_argument("--max-num-seqs", type=int, default=8, help="requests decoded together")
    ap.add_argument("--max-num-batched-tokens", type=int, default=512, help="tokens per engine step")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--device", choices=("cpu", "cuda", "auto"), default="auto",
                    help="where the model runs (auto: CUDA where torch sees a GPU, else the CPU)")
    ap.add_argument("--engine-cpu", default="auto",
                    help="on a GPU: the CPU the engine's step loop runs on (auto: one of its own; none: unpinned)")
    ap.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32",
                    help="weights, activations and KV cache (the reference is float32)")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(asctime)s %(message)s", stream=sys.stderr)
    log = logging.getLogger("refserver")
    t0 = time.monotonic()
    front: Any = None  # the API process, once spawned, and the engine's end of its connection
    conn: Any = None
    try:
        import torch

        from pairaudit.serving.modelstore import resolve_model

        from .core import ApiGone, EngineCore
        from .cuda import CudaDecoder, device_info, resolve_device, set_tf32
        from .engine import Engine, Switches
        from .metrics import Metrics
        from .model import LlamaModel, layout_cache_path
        from .numerics import Numerics
        from .protocol import CONFIG
        from .tokenizer import ChatTokenizer

        switches = Switches.from_env()
        device = resolve_device(args.device)
        problems = switches.device_problems(device, args.dtype)
        if problems:
            raise ValueError("; ".join(problems))
        if args.threads:
            torch.set_num_threads(args.threads)
        if device == "cuda":
            set_tf32(switches.tf32)
        numerics = Numerics.from_switches(switches, args.dtype)
        path, identity = resolve_model(args.model)
        name = args.served_model_name or args.model
        front, conn = start_api_process(args, name, str(path))
        tokenizer = ChatTokenizer(path)
        model = LlamaModel(path, numerics=numerics, device=device,
                           layout_cache=layout_cache_path(identity["weights_sha256"]))
        limit = model.cfg.max_positions
        if args.max_model_len > limit:
            raise ValueError(f"--max-model-len {args.max_model_len} exceeds the model's context of {limit} tokens")
        metrics = Metrics(name)
        decoder = None
        if device == "cuda":
            decoder = CudaDecoder(model, max_num_seqs=args.max_num_seqs, max_model_len=args.max_model_len,
                                  graphs=switches.cuda_graphs, metrics=metrics)
        log.info("model %s ready in %.1fs (torch, tokenizer, weights) from %s on %s, %s (switches %s)", args.model,
                 time.monotonic() - t0, path, device, args.dtype, switches.as_env())
    except Exception as exc:
        print(f"ERROR: refserver cannot start: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        if front is not None:
            stop_api_process(front, conn)
        return 1
    engine = Engine(model, tokenizer, max_model_len=args.max_model_len, switches=switches, metrics=metrics,
                    max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
                    decoder=decoder)
    info = {
        "switches": switches.as_env(),
        "model": identity,
        "dtype": args.dtype,
        "lm_head_dtype": numerics.describe()["lm_head"],
        "speculative": {"method": "ngram", "num_speculative_tokens": switches.spec_ngram} if switches.spec_ngram
        else None,
        "max_num_seqs": args.max_num_seqs,
        "max_num_batched_tokens": args.max_num_batched_tokens,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        # where it runs: torch's CUDA build (None for a CPU build), the device, its name
        **device_info(device),
        "numerics": numerics.describe(),
        "decode": decoder.describe() if decoder is not None
        else {"mode": "eager", "graph_batch_sizes": [], "note": "CUDA graphs are not applicable on a CPU"},
    }

    if device == "cuda":
        try:
            info["cpu_affinity"] = pin_engine(args.engine_cpu, front.pid)
        except ValueError as exc:
            print(f"ERROR: refserver cannot start: {exc}", file=sys.stderr, flush=True)
            stop_api_process(front, conn)
            return 1
    # Everything loaded so far lives as long as the server: out of the collector's sight, so a full
    # collection does not walk the model's and tokenizer's objects in the middle of a step.
    gc.collect()
    gc.freeze()

    def stop(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    code = 0
    try:
        # as JSON data: torch.__version__ is a torch class, and unpickling it would import torch over there
        facts = json.loads(json.dumps({"info": info, "vocab": engine.vocab, "eos": engine.eos,
                                       "max_model_len": args.max_model_len}))
        conn.send((CONFIG, facts))
        port = wait_listening(front, conn)
        if isinstance(port, str):
            print(f"ERROR: refserver cannot listen on {args.host}:{args.port}: {port}", file=sys.stderr, flush=True)
            return 1
        log.info("serving %s on http://%s:%d (max_model_len %d; HTTP in process %d)", name, args.host, port,
                 args.max_model_len, front.pid)
        # the engine owns the main thread (its matmuls are slower from any other)
        EngineCore(engine, conn).run()
    except KeyboardInterrupt:
        log.info("shutting down")
    except (ApiGone, EOFError, OSError):
        log.error("the API process (HTTP) exited (code %s): stopping the engine", front.exitcode)
        code = 1
    finally:
        engine.stopped = True
        stop_api_process(front, conn)
    return code


def pin_engine(choice: str, api_pid: int) -> dict:
    """On a GPU, the engine's step loop on a CPU of its own and the API process on the others.

    Each decode step is a few milliseconds of host work around a graph replay;
    where the scheduler puts that work (a core shared with the API process's
    event loop, an SMT sibling, a migration mid-step) shows up as a start that
    runs a few percent slower throughout. ``auto`` takes the last allowed CPU,
    counted back by the server's first CUDA device index, so servers on
    different GPUs of one host take different CPUs; ``none`` leaves the
    scheduler alone; a number names the CPU.
    """
    allowed = sorted(os.sched_getaffinity(0))
    if choice == "none" or len(allowed) < 2:
        return {"engine": allowed, "api": allowed, "pinned": False}
    if choice == "auto":
        first = (os.environ.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0].strip()
        index = int(first) if first.isdigit() else 0
        cpu = allowed[-1 - index % len(allowed)]
    else:
        cpu = int(choice)
        if cpu not in allowed:
            raise ValueError(f"--engine-cpu {cpu}: not one of the CPUs this process may use {allowed}")
    rest = [c for c in allowed if c != cpu]
    os.sched_setaffinity(0, {cpu})
    try:
        os.sched_setaffinity(api_pid, set(rest))
    except OSError:  # the API process is gone: the engine notices at its first message
        pass
    return {"engine": [cpu], "api": [rest[0], rest[-1]] if len(rest) > 2 else rest, "pinned": True}


def start_api_process(args: argparse.Namespace, name: str, model_root: str):
    """Spawn the HTTP process; it waits for the engine's facts (CONFIG) before it listens."""
    from .apiproc import run_api_process  # aiohttp is imported over there only

    ctx = multiprocessing.get_context("spawn")
    conn, child_end = ctx.Pipe(duplex=True)
    start = {"host": args.host, "port": args.port, "served_name": name, "model_root": model_root,
             "version": VERSION, "parent_pid": os.getpid()}
    # daemon: multiprocessing ends it if this process exits on any path
    proc = ctx.Process(target=run_api_process, args=(child_end, start), name="refserver-api", daemon=True)
    proc.start()
    child_end.close()
    return proc, conn


def wait_listening(front, conn) -> int | str:
    """The port the API process listens on, or why it cannot."""
    from .protocol import LISTEN_ERROR, LISTENING

    while True:
        if conn.poll(0.2):
            msg = conn.recv()
            if msg[0] == LISTENING:
                return msg[1]
            if msg[0] == LISTEN_ERROR:
                return msg[1]
        elif not front.is_alive():
            return f"the API process exited with code {front.exitcode} before listening"


def stop_api_process(front, conn) -> None:
    conn.close()  # end-of-file: the API process stops on its own
    front.join(5)
    if front.is_alive():
        front.terminate()
        front.join(5)


if __name__ == "__main__":
    sys.exit(main())
