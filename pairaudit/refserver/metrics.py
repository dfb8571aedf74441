"""Prometheus text metrics under vLLM's names, so the same scraper reads both."""

from __future__ import annotations

import threading

LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                   20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)

COUNTERS = {
    "vllm:prompt_tokens_total": "Number of prefill tokens processed.",
    "vllm:generation_tokens_total": "Number of generation tokens processed.",
    "vllm:spec_decode_num_drafts_total": "Number of spec decoding drafts.",
    "vllm:spec_decode_num_draft_tokens_total": "Number of draft tokens.",
    "vllm:spec_decode_num_accepted_tokens_total": "Number of accepted tokens.",
    # not a vLLM metric: lets a test see that concurrent requests shared forwards
    "pairaudit:engine_steps_total": "Number of engine steps (one batched forward each).",
    # not vLLM metrics either: whether decode steps really ran from CUDA graphs (0 on a CPU)
    "pairaudit:decode_graph_replays_total": "Number of decode steps replayed from a captured CUDA graph.",
    "pairaudit:decode_graph_captures_total": "Number of decode-step shapes captured in a CUDA graph.",
    # where an engine step's time goes, so a slow batch can be told apart from a slow loop: steps whose
    # every row decodes one token (graphed on a GPU) against steps through the general forward (prefill,
    # drafts), the batched sampler's share (it waits for the step's device work), and the loop's own
    # work between steps (requests in, tokens out)
    "pairaudit:step_rows_total": "Sum over engine steps of the requests each step advanced.",
    "pairaudit:decode_steps_total": "Number of engine steps in which every request decoded exactly one token.",
    "pairaudit:decode_step_seconds_total": "Wall seconds spent in those steps.",
    "pairaudit:forward_step_seconds_total": "Wall seconds spent in steps through the general forward.",
    "pairaudit:sampler_seconds_total": "Wall seconds spent in the batched sampler (includes waiting for the step).",
    "pairaudit:loop_io_seconds_total": "Wall seconds the engine loop spent reading requests and shipping tokens.",
}
HISTOGRAMS = {
    "vllm:time_to_first_token_seconds": "Histogram of time to first token in seconds.",
    "vllm:inter_token_latency_seconds": "Histogram of inter-token latency in seconds (one observation per engine step).",
    "vllm:e2e_request_latency_seconds": "Histogram of e2e request latency in seconds.",
    "vllm:request_prefill_time_seconds": "Histogram of time spent in PREFILL phase for request.",
    "vllm:request_decode_time_seconds": "Histogram of time spent in DECODE phase for request.",
}


class Metrics:
    def __init__(self, model_name: str):
        self.label = f'model_name="{model_name}"'
        self.lock = threading.Lock()
        self.counters = dict.fromkeys(COUNTERS, 0.0)
        self.accepted_per_pos: dict[int, float] = {}
        self.finished: dict[str, float] = {}
        self.hist = {name: [0] * len(LATENCY_BUCKETS) + [0, 0.0] for name in HISTOGRAMS}
        self.running = 0
        self.waiting = 0

    def inc(self, name: str, value: float = 1.0) -> None:
        with self.lock:
            self.counters[name] += value

    def accepted_at(self, position: int) -> None:
        with self.lock:
            self.accepted_per_pos[position] = self.accepted_per_pos.get(position, 0.0) + 1

    def finish(self, reason: str) -> None:
        with self.lock:
            self.finished[reason] = self.finished.get(reason, 0.0) + 1

    def observe(self, name: str, value: float) -> None:
        with self.lock:
            h = self.hist[name]
            for i, le in enumerate(LATENCY_BUCKETS):
                if value <= le:
                    h[i] += 1
            h[-2] += 1
            h[-1] += value

    def set_queue(self, running: int, waiting: int) -> None:
        with self.lock:
            self.running, self.waiting = running, waiting

    def state(self) -> dict:
        """Everything render() shows, as plain data: what the engine process sends the API process."""
        with self.lock:
            return {"counters": dict(self.counters), "accepted_per_pos": dict(self.accepted_per_pos),
                    "finished": dict(self.finished), "hist": {k: list(v) for k, v in self.hist.items()},
                    "running": self.running, "waiting": self.waiting}

    def load(self, state: dict) -> None:
        """Take on a snapshot from state() (the API process renders the engine's numbers)."""
        with self.lock:
            self.counters, self.accepted_per_pos = state["counters"], state["accepted_per_pos"]
            self.finished, self.hist = state["finished"], state["hist"]
            self.running, self.waiting = state["running"], state["waiting"]

    def render(self) -> str:
        lab = self.label
        out = []
        with self.lock:
            for name, value in (("vllm:num_requests_running", self.running), ("vllm:num_requests_waiting", self.waiting)):
                out += [f"# TYPE {name} gauge", f"{name}{{{lab}}} {float(value)}"]
            for name, help_ in COUNTERS.items():
                out += [f"# HELP {name} {help_}", f"# TYPE {name} counter", f"{name}{{{lab}}} {self.counters[name]}"]
            name = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
            out.append(f"# TYPE {name} counter")
            for pos in sorted(self.accepted_per_pos):
                out.append(f'{name}{{{lab},position="{pos}"}} {self.accepted_per_pos[pos]}')
            name = "vllm:request_success_total"
            out.append(f"# TYPE {name} counter")
            for reason in sorted(self.finished):
                out.append(f'{name}{{finished_reason="{reason}",{lab}}} {self.finished[reason]}')
            for name, help_ in HISTOGRAMS.items():
                h = self.hist[name]
                out += [f"# HELP {name} {help_}", f"# TYPE {name} histogram"]
                for le, count in zip(LATENCY_BUCKETS, h):
                    out.append(f'{name}_bucket{{le="{le}",{lab}}} {float(count)}')
                out.append(f'{name}_bucket{{le="+Inf",{lab}}} {float(h[-2])}')
                out += [f"{name}_count{{{lab}}} {float(h[-2])}", f"{name}_sum{{{lab}}} {h[-1]}"]
        return "\n".join(out) + "\n"
