"""pairaudit.serving.startlog: a start's seconds read from the server's own log, and where they are recorded.

``tests/data/vllm-0.26-warm-start.log`` is one warm start of vLLM 0.26.0 on an
H100 (the speed bracket's third start of the first audit of real vLLM on a
GPU), as the audit wrote it, with the per-request access lines and the route
list left out.  The audit recorded that start healthy 62.6 s after its launch.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_launch import fake_cfg

from pairaudit.serving import launch, startlog
from pairaudit.serving.armspec import resolve_spec

WARM = Path(__file__).with_name("data") / "vllm-0.26-warm-start.log"
READY_S = 62.616478197000106   # starts.jsonl's ready_s of that start


def test_the_real_warm_start_splits_into_its_steps():
    bd = startlog.read_start(WARM, ready_s=READY_S, tz_offset_s=0)
    assert bd.server == "vllm 0.26.0"
    assert bd.launched_at == "2026-12-06T12:33:43.839+00:00"
    # every step of the start was found, in the order vLLM runs them
    assert list(bd.steps) == list(startlog.STEP_NAMES)
    assert list(bd.steps.values()) == sorted(bd.steps.values())
    seg = bd.segments
    # the API server's imports: launched at :43.839, banner stamped :00
    assert seg["banner"] == pytest.approx(16.161, abs=1e-3)
    # banner :00 -> the engine-core process's first line :18
    assert seg["engine"] == pytest.approx(18.0)
    # the 11 s between the KV cache (:31) and the end of capture (:43) are warm-up, not capture (1 s)
    assert seg["warmup"] == pytest.approx(11.0) and seg["graphs"] == pytest.approx(1.0)
    assert sum(seg.values()) == pytest.approx(READY_S, abs=1e-3)
    assert bd.kv_cache_gib == pytest.approx(23.19) and bd.kv_cache_tokens == 1_080_928
    assert bd.graph_sizes == {"PIECEWISE": 7, "FULL": 5}
    assert bd.compile_s == pytest.approx(3.82) and bd.init_engine_s == pytest.approx(19.24)
    assert startlog.StartBreakdown.from_json(json.loads(json.dumps(bd.to_json()))) == bd


def test_stamps_are_read_in_the_servers_time_zone():
    # the same log stamped two hours ahead of UTC: every step moves by 7,200 s unless the offset is given
    utc = startlog.read_start(WARM, tz_offset_s=0)
    cest = startlog.read_start(WARM, tz_offset_s=7200)
    assert cest.steps["banner"] == pytest.approx(utc.steps["banner"] - 7200)


def test_each_start_of_a_log_is_its_own(tmp_path):
    text = WARM.read_text()
    second = text.replace("12:33:43.839", "12:40:00.000").replace("12-06 12:3", "12-06 12:4")
    log = tmp_path / "server.log"
    log.write_text(text + second)
    both = startlog.read_all(log, tz_offset_s=0)
    assert [b.launched_at for b in both] == ["2026-12-06T12:33:43.839+00:00", "2026-12-06T12:40:00.000+00:00"]
    # the second start, read from its launch line's offset, is measured from its own launch
    offset = len(text.encode())
    bd = startlog.read_start(log, offset, tz_offset_s=0)
    assert bd.launched_at == "2026-12-06T12:40:00.000+00:00"
    # its engine line is stamped 12:44:18 (the copy moved every stamp from 12:3x to 12:4x): 258 s after 12:40:00
    assert bd.steps["engine"] == pytest.approx(258.0)


def test_a_step_vllm_does_not_print_is_left_out():
    # --enforce-eager: no compile, no capture; their time falls into the next step found
    lines = [x for x in WARM.read_text().splitlines()
             if "Graph capturing" not in x and "torch.compile" not in x and "compiled graph" not in x]
    bd = startlog.parse_start(lines, ready_s=READY_S, tz_offset_s=0)
    assert "graphs" not in bd.steps and "compiled" not in bd.steps
    assert bd.segments["kv_cache"] == pytest.approx(7.0)   # weights read :24 -> KV cache :31
    assert sum(bd.segments.values()) == pytest.approx(READY_S, abs=1e-3)


def test_a_launched_server_records_its_breakdown_in_the_starts_log(tmp_path):
    # the fake server prints no vLLM steps: the breakdown holds the healthy time alone
    spec = resolve_spec("control", fake_cfg())
    rec = launch.receipt(spec)
    starts = tmp_path / "starts.jsonl"
    with launch.Server(spec, log_path=tmp_path / "s.log", receipt=rec) as srv:
        facts = srv.facts()
        launch.log_start_event(starts, event="ready", phase="answers", spec=spec, receipt=rec,
                               facts={**facts, "why": "the arm's answers phase"})
    ready = json.loads(starts.read_text().splitlines()[0])
    assert ready["breakdown"]["steps"] == {"healthy": facts["ready_s"]}
    assert ready["breakdown"]["launched_at"] is not None
    assert ready["why"] == "the arm's answers phase"
    table = startlog.starts_table([ready])
    assert len(table) == 3 and "| answers | control | the arm's answers phase |" in table[2]


def test_the_reports_section_lists_every_start_of_the_audit(tmp_path):
    bd = startlog.read_start(WARM, ready_s=READY_S, tz_offset_s=0).to_json()
    log = tmp_path / "starts.jsonl"
    lines = [{"event": "ready", "phase": "speed", "arm": "control", "why": "bracket start s3", "ready_s": READY_S,
              "breakdown": bd},
             {"event": "stopped", "phase": "speed", "arm": "control"}]
    log.write_text("".join(json.dumps(x) + "\n" for x in lines))
    md = startlog.starts_markdown(log)
    assert md[0] == "## Server starts" and "1 starts, 63 s to healthy" in md[2]
    row = md[-2].split(" | ")
    # imports, engine process, ..., warm-up, graphs: the cells follow TABLE_HEAD
    head = startlog.TABLE_HEAD
    assert row[head.index("imports")] == "16.2" and row[head.index("warm-up")] == "11.0"
    assert row[head.index("KV GiB")].rstrip(" |") == "23.2"
    assert startlog.starts_markdown(tmp_path / "none.jsonl") == []


def test_vllm_cpu_builds_name_their_steps_in_their_own_words():
    # lines of a start of vLLM 0.32's CPU build on this machine kind (eager: no compile, no graphs)
    lines = [
        "=== pairaudit launch arm=control at 2026-12-06T14:24:23.227+00:00: ['python', '-m', 'vllm...']",
        "(APIServer pid=8831) INFO 12-06 14:24:45 [api_utils.py:347]  ▄▄ ▄█ █     █     █ ▀▄▀ █  version 0.32.0",
        "(EngineCore pid=9731) INFO 12-06 14:25:48 [core.py:133] Initializing a V1 LLM engine (v0.32.0) with config:",
        "(Worker pid=10491) INFO 12-06 14:26:28 [default_loader.py:501] Loading weights took 5.55 seconds",
        "(EngineCore pid=9731) INFO 12-06 14:26:34 [kv_cache_utils.py:2327] CPU KV cache size: 46,592 tokens, "
        "Maximum concurrency for 2,048 tokens per request: 22.75x",
        "(EngineCore pid=9731) INFO 12-06 14:26:53 [core.py:402] init engine (profile, create kv cache, warmup model) "
        "took 18.91 s",
        "(APIServer pid=8831) INFO 12-06 14:27:01 [entry.py:140] Starting vLLM server on http://127.0.0.1:35153",
    ]
    bd = startlog.parse_start(lines, ready_s=159.426, tz_offset_s=0)
    assert bd.server == "vllm 0.32.0" and bd.kv_cache_tokens == 46_592
    assert list(bd.steps) == ["banner", "engine", "weights", "kv_cache", "engine_ready", "api", "healthy"]
    assert bd.segments["engine"] == pytest.approx(63.0) and bd.segments["weights"] == pytest.approx(40.0)
    assert "graphs" not in bd.segments and "warmup" not in bd.segments
