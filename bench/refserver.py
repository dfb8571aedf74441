"""Benchmark the reference server against real vLLM on this machine, in one run.

Prints decode tokens/s (128 forced greedy tokens by default) of the reference
server and of real vLLM at concurrency 1 and 4, and their ratios (goal >= 0.9,
aim >= 1.0).  Both servers are started here on loopback ports, measured
alternately (reference, vLLM, reference, vLLM, ...) so load from other
processes hits both sides alike, and stopped.  The thread count each side
computes with is printed: vLLM's CPU backend keeps one core for itself and
computes on the rest.

vLLM's interpreter is ``$PAIRAUDIT_VLLM_PYTHON`` or ``<repo>/.venv-vllm/bin/python``;
without either the vLLM columns say so and only the reference server is measured.

Start-up is timed too: spawn to the first healthy ``/health``, polled every
50 ms; ``--start-trials`` starts of the default reference server alone give its
median and worst (goal <= 3 s), timed before anything else starts.

``--extra`` adds the older rows: transformers ``generate`` at batch 1 and 4, the
bandwidth floor, and n-gram speculation on vs off.

Usage: .venv/bin/python bench/refserver.py [--tokens 128] [--rounds 2]
           [--vllm-mode compile|eager|both] [--ref-threads 0,1] [--start-trials 5] [--extra]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import requests
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pairaudit.serving.modelstore import EMBEDDED_NAME, resolve_model  # noqa: E402

PROMPTS = ["Write a short story about a robot.", "Explain why the sky is blue.", "List some fruits.",
           "Describe a busy city street."]
REPETITIVE = ("Copy this list exactly, ten times:\n" + "alpha beta gamma delta epsilon\n" * 3)
MAX_MODEL_LEN = 2048


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def vllm_python() -> Path | None:
    env = os.environ.get("PAIRAUDIT_VLLM_PYTHON")
    candidates = [Path(env)] if env else []
    candidates.append(REPO / ".venv-vllm" / "bin" / "python")
    return next((p for p in candidates if p.is_file()), None)


class Server:
    """A server process in its own session on a loopback port; its output goes to a log file."""

    def __init__(self, name: str, argv: list[str], env: dict, timeout: float):
        self.name = name
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile("w+", prefix=f"bench-{name}-", suffix=".log", delete=False)
        t0 = time.monotonic()
        self.proc = subprocess.Popen([*argv, "--port", str(self.port)], env={**os.environ, **env}, cwd=REPO,
                                     stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        self.argv = argv
        self.start_seconds = None
        while time.monotonic() - t0 < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{name} exited {self.proc.returncode}; log {self.log.name}")
            try:
                if requests.get(self.url + "/health", timeout=1).ok:
                    self.start_seconds = time.monotonic() - t0
                    return
            except requests.RequestException:
                pass
            time.sleep(0.05)
        self.stop(keep_log=True)
        raise RuntimeError(f"{name} not healthy after {timeout:.0f} s; log {self.log.name}")

    def metrics(self, names: tuple[str, ...]) -> dict[str, float]:
        """Each named counter's value (summed over its labels) from one scrape of /metrics."""
        totals = dict.fromkeys(names, 0.0)
        for line in requests.get(self.url + "/metrics", timeout=60).text.splitlines():
            name = line.split("{", 1)[0].split(" ", 1)[0]
            if name in totals:
                totals[name] += float(line.rsplit(" ", 1)[1])
        return totals

    def log_text(self) -> str:
        return Path(self.log.name).read_text(errors="replace")

    def stop(self, keep_log: bool = False) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        if not keep_log:
            os.unlink(self.log.name)


def start_ref(threads: int, env: dict | None = None) -> Server:
    argv = [sys.executable, "-m", "pairaudit.refserver", "--max-model-len", str(MAX_MODEL_LEN),
            "--threads", str(threads)]
    return Server(f"ref-t{threads}", argv, {"PYTHONPATH": str(REPO), **(env or {})}, timeout=300)


def start_times(trials: int) -> list[float]:
    """Seconds from spawn to healthy for ``trials`` starts of the default reference server, one at a time."""
    times = []
    for _ in range(trials):
        s = start_ref(0)
        times.append(s.start_seconds)
        s.stop()
    return times


def start_vllm(python: Path, mode: str, model_dir: Path, timeout: float) -> Server:
    argv = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
            "--served-model-name", EMBEDDED_NAME, "--max-model-len", str(MAX_MODEL_LEN), "--dtype", "float32",
            "--host", "127.0.0.1"]
    if mode == "eager":
        argv.append("--enforce-eager")
    return Server(f"vllm-{mode}", argv, {"VLLM_CPU_KVCACHE_SPACE": "2"}, timeout=timeout)


def ref_threads(server: Server) -> str:
    info = requests.get(server.url + "/version", timeout=10).json().get("pairaudit", {})
    return str(info.get("threads", "?"))


def vllm_threads(server: Server) -> str:
    """vLLM's compute threads: the OpenMP core ids it binds to (its log says which)."""
    m = re.search(r"core ids=\[([0-9, ]*)\]", server.log_text())
    if not m:
        return "?"
    ids = [i for i in m.group(1).split(",") if i.strip()]
    return f"{len(ids)} (cores {','.join(i.strip() for i in ids)})"


def chat_body(prompt: str, n: int) -> dict:
    return {"model": EMBEDDED_NAME, "messages": [{"role": "user", "content": prompt}], "max_tokens": n,
            "temperature": 0, "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}


def stream_times(url: str, body: dict) -> tuple[float, float, float, int]:
    """(start, first token, end) on the perf_counter clock, and completion tokens, of one streamed chat request.

    Absolute times, so that concurrent streams can be lined up (bench/refserver_gpu.py).
    """
    start = time.perf_counter()
    first, tokens = None, 0
    with requests.post(url + "/v1/chat/completions", json=body, stream=True, timeout=900) as r:
        r.raise_for_status()
        for line in r.iter_lines(decode_unicode=True):
            if not line or not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if first is None and any(c.get("delta", {}).get("content") for c in event.get("choices") or []):
                first = time.perf_counter()
            if event.get("usage") and not event.get("choices"):
                tokens = event["usage"]["completion_tokens"]
    if first is None:
        raise RuntimeError(f"{url}: no content streamed")
    return start, first, time.perf_counter(), tokens


def timed_stream(url: str, body: dict) -> tuple[float, float, int]:
    """(time to first token, end time, completion tokens) of one streamed chat request, from its start."""
    start, first, end, tokens = stream_times(url, body)
    return first - start, end - start, tokens


def decode_rate(url: str, concurrency: int, n: int) -> float:
    """Decode tokens/s summed over concurrent streams (first tokens excluded: that is prefill)."""
    results = [None] * concurrency
    errors = []

    def run(i):
        try:
            results[i] = timed_stream(url, chat_body(PROMPTS[i % len(PROMPTS)], n))
        except Exception as exc:  # reported below, not swallowed
            errors.append(exc)

    timed_stream(url, chat_body("warm up", 4))
    threads = [threading.Thread(target=run, args=(i,)) for i in range(concurrency)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    first_all = max(r[0] for r in results)
    end_all = time.perf_counter() - t0
    decoded = sum(r[2] - 1 for r in results)
    return decoded / (end_all - first_all)


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


# --- the older comparison rows (--extra) --------------------------------------
def generate_decode_rate(path: Path, batch: int, n: int) -> float:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    texts = [tok.apply_chat_template([{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}], tokenize=False,
                                     add_generation_prompt=True) for i in range(batch)]
    enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    kw = dict(do_sample=False, pad_token_id=tok.eos_token_id, eos_token_id=None)
    with torch.inference_mode():
        model.generate(**enc, max_new_tokens=2, min_new_tokens=2, **kw)
        t0 = time.perf_counter()
        model.generate(**enc, max_new_tokens=1, min_new_tokens=1, **kw)
        prefill = time.perf_counter() - t0
        t0 = time.perf_counter()
        model.generate(**enc, max_new_tokens=n, min_new_tokens=n, **kw)
        total = time.perf_counter() - t0
    return batch * (n - 1) / (total - prefill)


def bandwidth_floor(path: Path) -> tuple[float, float]:
    """(copy bandwidth GB/s, tokens/s if every fp32 weight is read once per decode step)."""
    src = torch.ones(1024 * 2**20 // 4)
    dst = torch.empty_like(src)
    dst.copy_(src)
    t0 = time.perf_counter()
    for _ in range(10):
        dst.copy_(src)
    seconds = (time.perf_counter() - t0) / 10
    gbs = src.numel() * 4 / seconds / 1e9  # bytes copied per second
    # the converted checkpoint is fp32 with a tied head: its size is what one decode step streams
    weight_bytes = sum(f.stat().st_size for f in path.glob("*.safetensors"))
    return gbs, gbs * 1e9 / weight_bytes


def ngram_rate(spec: int, n: int) -> tuple[float, int]:
    s = start_ref(0, {"PAIRAUDIT_REF_SPEC_NGRAM": str(spec)})
    try:
        body = chat_body(REPETITIVE, n)
        body["ignore_eos"] = False
        timed_stream(s.url, chat_body("warm up", 4))
        _, end, tokens = timed_stream(s.url, body)
        return tokens / end, tokens
    finally:
        s.stop()


def extra_rows(path: Path, n: int, srv1: float, srv4: float) -> list[tuple[str, ...]]:
    gen1 = generate_decode_rate(path, 1, n)
    gen4 = generate_decode_rate(path, 4, n)
    gbs, floor = bandwidth_floor(path)
    off, off_tokens = ngram_rate(0, 2 * n)
    on, on_tokens = ngram_rate(4, 2 * n)
    return [
        ("ref vs transformers generate, c=1", f"{srv1:.1f}", f"{gen1:.1f}", f"{srv1 / gen1:.2f}x"),
        ("ref vs transformers generate, c=4", f"{srv4:.1f}", f"{gen4:.1f}", f"{srv4 / gen4:.2f}x"),
        ("ref c=1 vs bandwidth floor", f"{srv1:.1f}", f"{floor:.1f} ({gbs:.1f} GB/s)", f"{srv1 / floor:.2f}"),
        ("n-gram K=4 vs off, repetitive", f"{on:.1f} ({on_tokens} tok)", f"{off:.1f} ({off_tokens} tok)",
         f"{on / off:.2f}x"),
    ]


# --- main ----------------------------------------------------------------------
def measure(servers: list[Server], rounds: int, n: int) -> dict[tuple[str, int], list[float]]:
    rates: dict[tuple[str, int], list[float]] = {}
    for r in range(rounds):
        for c in (1, 4):
            for s in servers:  # alternate sides so a burst of outside load hits both
                rate = decode_rate(s.url, c, n)
                rates.setdefault((s.name, c), []).append(rate)
                print(f"  round {r + 1} {s.name:14s} c={c}: {rate:6.1f} tok/s  (load {load_average()})", flush=True)
    return rates


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=128, help="forced tokens per request")
    ap.add_argument("--rounds", type=int, default=2, help="alternating measurement rounds; the median is reported")
    ap.add_argument("--vllm-mode", choices=("compile", "eager", "both"), default="compile",
                    help="vLLM's default torch.compile mode, --enforce-eager, or both")
    ap.add_argument("--vllm-timeout", type=float, default=1200,
                    help="seconds to wait for vLLM to become healthy (its compile mode is slow on a busy machine)")
    ap.add_argument("--ref-threads", default="0",
                    help="comma-separated torch thread counts for the reference server (0: its default)")
    ap.add_argument("--start-trials", type=int, default=5,
                    help="starts of the default reference server timed on their own, before the rates (0: none)")
    ap.add_argument("--extra", action="store_true", help="also the transformers, bandwidth and n-gram rows")
    args = ap.parse_args()
    n = args.tokens
    path, _ = resolve_model(EMBEDDED_NAME)
    print(f"load average before: {load_average()}  (cores {os.cpu_count()}, torch {torch.__version__})")
    # timed first, while nothing else runs: a vLLM engine still exiting would be timed too
    ref_starts = start_times(args.start_trials)
    servers: list[Server] = []
    threads: dict[str, str] = {}
    starts: dict[str, float] = {}
    python = vllm_python()
    try:
        for t in (int(x) for x in args.ref_threads.split(",")):
            s = start_ref(t)
            servers.append(s)
            threads[s.name], starts[s.name] = ref_threads(s), s.start_seconds
        if python is None:
            print("vLLM: not measured -- neither $PAIRAUDIT_VLLM_PYTHON nor "
                  f"{REPO / '.venv-vllm' / 'bin' / 'python'} exists (install it with ./install.sh --vllm)")
        else:
            for mode in ("compile", "eager") if args.vllm_mode == "both" else (args.vllm_mode,):
                try:
                    s = start_vllm(python, mode, path, args.vllm_timeout)
                except RuntimeError as exc:  # the other sides are still worth measuring
                    print(f"vLLM {mode}: not measured -- {exc}")
                    continue
                servers.append(s)
                threads[s.name], starts[s.name] = vllm_threads(s), s.start_seconds
        rates = measure(servers, args.rounds, n)
    finally:
        for s in servers:
            s.stop()
    print(f"load average after: {load_average()}")
    med = {k: statistics.median(v) for k, v in rates.items()}
    refs = [s.name for s in servers if s.name.startswith("ref")]
    vllms = [s.name for s in servers if s.name.startswith("vllm")]
    print(f"\ntokens={n} rounds={args.rounds} (median of rounds)")
    print("| server | compute threads | start s | c=1 tok/s | c=4 tok/s |")
    print("|---|---|---|---|---|")
    for name in refs + vllms:
        print(f"| {name} | {threads[name]} | {starts[name]:.1f} | {med[(name, 1)]:.1f} | {med[(name, 4)]:.1f} |")
    if vllms:
        print("\n| ratio (goal >= 0.9) | c=1 | c=4 |")
        print("|---|---|---|")
        for r in refs:
            for v in vllms:
                print(f"| {r} / {v} | {med[(r, 1)] / med[(v, 1)]:.2f}x | {med[(r, 4)] / med[(v, 4)]:.2f}x |")
    if ref_starts:
        print(f"\nreference server start-up, {len(ref_starts)} starts (goal <= 3 s): median "
              f"{statistics.median(ref_starts):.2f} s, worst {max(ref_starts):.2f} s "
              f"({', '.join(f'{x:.2f}' for x in ref_starts)})")
    if args.extra:
        rows = extra_rows(path, n, med[(refs[0], 1)], med[(refs[0], 4)])
        print("\n| measure | server | reference | ratio |")
        print("|---|---|---|---|")
        for row in rows:
            print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
