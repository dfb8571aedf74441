"""``python -m pairaudit.refserver``: serve the reference model over vLLM's OpenAI-compatible API."""

from __future__ import annotations

import argparse
import logging
import platform
import signal
import sys
import threading
import time

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
    ap.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32",
                    help="weights, activations and KV cache (the reference is float32)")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(asctime)s %(message)s", stream=sys.stderr)
    log = logging.getLogger("refserver")
    t0 = time.monotonic()
    try:
        import torch

        from pairaudit.serving.modelstore import resolve_model

        from .api import Api, serve
        from .cuda import CudaDecoder, device_info, resolve_device, set_tf32
        from .engine import Engine, Switches
        from .metrics import Metrics
        from .model import LlamaModel, layout_cache_path
        from .numerics import Numerics
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
        tokenizer = ChatTokenizer(path)
        model = LlamaModel(path, numerics=numerics, device=device,
                           layout_cache=layout_cache_path(identity["weights_sha256"]))
        limit = model.cfg.max_positions
        if args.max_model_len > limit:
            raise ValueError(f"--max-model-len {args.max_model_len} exceeds the model's context of {limit} tokens")
        name = args.served_model_name or args.model
        metrics = Metrics(name)
        decoder = None
        if device == "cuda":
            decoder = CudaDecoder(model, max_num_seqs=args.max_num_seqs, max_model_len=args.max_model_len,
                                  graphs=switches.cuda_graphs, metrics=metrics)
        log.info("model %s ready in %.1fs (torch, tokenizer, weights) from %s on %s, %s (switches %s)", args.model,
                 time.monotonic() - t0, path, device, args.dtype, switches.as_env())
    except Exception as exc:
        print(f"ERROR: refserver cannot start: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
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
    api = Api(engine, tokenizer, served_name=name, model_root=str(path), info=info)
    try:
        server = serve(api, metrics, args.host, args.port, VERSION)
    except OSError as exc:
        print(f"ERROR: refserver cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr, flush=True)
        return 1

    def stop(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    # the engine owns the main thread (its matmuls are slower from any other); HTTP gets a background one
    http = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, name="http", daemon=True)
    http.start()
    log.info("serving %s on http://%s:%d (max_model_len %d)", name, args.host, server.server_port,
             args.max_model_len)
    try:
        engine.run()
    except KeyboardInterrupt:
        log.info("shutting down")
    finally:
        engine.stopped = True
        server.shutdown()
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
