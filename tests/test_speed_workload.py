"""The speed bracket's repeats: the waves of a repeat run back to back, with /metrics only around the repeat.

Driven against tests/fake_server.py in this process, whose handler is wrapped
to record every request in the order it arrived.
"""

from __future__ import annotations

import threading

import fake_server

from pairaudit.serving.client import Endpoint
from pairaudit.speed import bracket


def _recording_server():
    srv = fake_server.make_server(model="m", max_model_len=256)
    seen: list[str] = []
    base = srv.RequestHandlerClass

    class Recording(base):  # type: ignore[misc, valid-type]
        def do_GET(self):
            seen.append("GET " + self.path)
            return super().do_GET()

        def do_POST(self):
            seen.append("POST " + self.path)
            return super().do_POST()

    srv.RequestHandlerClass = Recording
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, seen


def test_waves_of_a_repeat_follow_each_other_with_no_scrape_between():
    srv, seen = _recording_server()
    try:
        ep = Endpoint(f"http://127.0.0.1:{srv.server_address[1]}", model="m", timeout_s=30)
        out_len, waves, repeats = 8, 3, 2
        cells = [{"name": "a-c1", "prompt": "short", "input_len": 4, "concurrency": 1, "decide": True},
                 {"name": "b-c2", "prompt": "short", "input_len": 4, "concurrency": 2, "decide": True}]
        rec = bracket.resolve({"output_len": out_len, "request_timeout_s": 30, "repeats": repeats, "cells": cells,
                               "base_seed": 1})
        prompts = {c["name"]: {(r, w, i): [200, 201, 202, 203] for r in range(repeats) for w in range(waves)
                               for i in range(c["concurrency"])} for c in cells}
        plan = {c["name"]: waves for c in cells}
        result, records = bracket.run_start(ep, model="m", speed=rec, prompts=prompts, start="s1", arm="control",
                                            plan=plan)
    finally:
        srv.shutdown()
    # one block per repeat and cell: scrape(s), every wave's streams with nothing between, scrape(s)
    blocks, cur = [], []
    for req in seen:
        if req == "GET /metrics":
            if cur:
                blocks.append(cur)
                cur = []
        else:
            cur.append(req)
    assert blocks == [["POST /v1/completions"] * (waves * c["concurrency"])
                      for _ in range(repeats) for c in cells]
    # the counters of a repeat are pooled whole: every token and the server's decode seconds of every wave
    for c in cells:
        pooled = result[c["name"]]["pooled"]
        assert len(pooled) == repeats
        for rep in pooled:
            assert rep["waves"] == waves and rep["streams"] == waves * c["concurrency"]
            assert rep["generation_tokens"] == waves * c["concurrency"] * out_len
            assert rep["requests"] == waves * c["concurrency"]
            # the fake server books 1 ms of decode per generated token
            assert abs(rep["decode_s"] - 0.001 * rep["generation_tokens"]) < 1e-9
    assert len(records) == repeats * waves * sum(c["concurrency"] for c in cells)
