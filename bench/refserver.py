"""Benchmark the reference server against transformers ``generate`` in one run.

Prints, all measured now on this machine:
  * server decode tokens/s at concurrency 1 and 4 vs ``generate`` at batch 1 and 4 (ratio; goal >= 1);
  * the batch-1 rate as a fraction of the memory-bandwidth floor (fp32 weights streamed once per step,
    bandwidth measured by a large tensor copy);
  * n-gram speculation ON vs OFF on a repetitive prompt (ratio; goal > 1).

Usage: .venv/bin/python bench/refserver.py [--tokens 64]
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import requests
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pairaudit.modelstore import EMBEDDED_NAME, resolve_model  # noqa: E402

PROMPTS = ["Write a short story about a robot.", "Explain why the sky is blue.", "List some fruits.",
           "Describe a busy city street."]
REPETITIVE = ("Copy this list exactly, ten times:\n" + "alpha beta gamma delta epsilon\n" * 3)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, env: dict):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pairaudit.refserver", "--port", str(self.port), "--max-model-len", "2048"],
            env={**os.environ, **env}, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True)
        for _ in range(600):
            try:
                if requests.get(self.url + "/health", timeout=1).ok:
                    return
            except requests.RequestException:
                time.sleep(0.2)
        raise RuntimeError("server did not start")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        os.killpg(self.proc.pid, signal.SIGTERM)
        self.proc.wait(30)


def chat_body(prompt: str, n: int) -> dict:
    return {"model": EMBEDDED_NAME, "messages": [{"role": "user", "content": prompt}], "max_tokens": n,
            "temperature": 0, "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}


def timed_stream(url: str, body: dict) -> tuple[float, float, int]:
    """(time to first token, end time, completion tokens) of one streamed request."""
    start = time.perf_counter()
    first, tokens = None, 0
    with requests.post(url + "/v1/chat/completions", json=body, stream=True, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines(decode_unicode=True):
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            if first is None and '"content": ""' not in line:
                first = time.perf_counter()
            if '"usage"' in line and '"choices": []' in line:
                import json

                tokens = json.loads(line[6:])["usage"]["completion_tokens"]
    return first - start, time.perf_counter() - start, tokens


def server_decode_rate(url: str, concurrency: int, n: int) -> float:
    """Decode tokens/s summed over concurrent streams (first token excluded: that is prefill)."""
    results = [None] * concurrency

    def run(i):
        results[i] = timed_stream(url, chat_body(PROMPTS[i % len(PROMPTS)], n))

    timed_stream(url, chat_body("warm up", 4))
    threads = [threading.Thread(target=run, args=(i,)) for i in range(concurrency)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    first_all = max(r[0] for r in results)
    end_all = time.perf_counter() - t0
    decoded = sum(r[2] - 1 for r in results)
    return decoded / (end_all - first_all)


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


def ngram_rate(spec: int, n: int) -> tuple[float, float]:
    env = {"PAIRAUDIT_REF_SPEC_NGRAM": str(spec)}
    with Server(env) as s:
        body = chat_body(REPETITIVE, n)
        body["ignore_eos"] = False
        timed_stream(s.url, chat_body("warm up", 4))
        first, end, tokens = timed_stream(s.url, body)
        return tokens / end, tokens


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=64)
    args = ap.parse_args()
    n = args.tokens
    path, _ = resolve_model(EMBEDDED_NAME)
    rows = []
    with Server({"PAIRAUDIT_REF_SPEC_NGRAM": "0"}) as s:
        srv1 = server_decode_rate(s.url, 1, n)
        srv4 = server_decode_rate(s.url, 4, n)
    gen1 = generate_decode_rate(path, 1, n)
    gen4 = generate_decode_rate(path, 4, n)
    gbs, floor = bandwidth_floor(path)
    off, off_tokens = ngram_rate(0, 2 * n)
    on, on_tokens = ngram_rate(4, 2 * n)
    rows.append(("decode tok/s, concurrency 1", f"{srv1:.1f}", f"generate {gen1:.1f}", f"{srv1 / gen1:.2f}x"))
    rows.append(("decode tok/s, concurrency 4", f"{srv4:.1f}", f"generate {gen4:.1f}", f"{srv4 / gen4:.2f}x"))
    rows.append(("batch-1 vs bandwidth floor", f"{srv1:.1f}", f"floor {floor:.1f} ({gbs:.1f} GB/s)",
                 f"{srv1 / floor:.2f}"))
    rows.append(("n-gram K=4 vs off, repetitive", f"{on:.1f} ({on_tokens} tok)", f"off {off:.1f} ({off_tokens} tok)",
                 f"{on / off:.2f}x"))
    print(f"\nthreads={torch.get_num_threads()} tokens={n}")
    print("| measure | server | reference | ratio |")
    print("|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(r) + " |")


if __name__ == "__main__":
    main()
