"""pairaudit.interop.vllm_bench: the speed bracket's starts as vllm bench serve results, on known answers."""

import datetime as dt
import json
import re
import subprocess
from pathlib import Path

import pytest

from pairaudit.core import artifacts
from pairaudit.interop import vllm_bench
from pairaudit.speed.metrics import bench_serve_table

T0 = dt.datetime(2026, 12, 1, 12, 0, 0, tzinfo=dt.timezone.utc)
CELLS = [{"name": "short-c1", "prompt": "short", "input_len": 32, "concurrency": 1, "decide": True,
          "prompt_tokens": 10},
         {"name": "random-c2", "prompt": "random", "input_len": 16, "concurrency": 2, "decide": False,
          "prompt_tokens": 16}]
ROLES = (("s1", "control_before", "control"), ("s2", "candidate", "candidate"), ("s3", "control_after", "control"))


def stream(start, arm, cell, repeat, k, *, at, ttft, e2el, out=4, prompt=10, error=None):
    gaps = [(e2el - ttft) / (out - 1)] * (out - 1) if error is None else []
    return {"start": start, "arm": arm, "cell": cell, "repeat": repeat, "wave": 0, "stream": k, "seed": 42 + k,
            "cache_salt": f"s{start}{cell}{repeat}{k}", "prompt_tokens": prompt, "status": 200 if error is None else 500,
            "started_at": (T0 + dt.timedelta(seconds=at)).isoformat(timespec="milliseconds"),
            "error": error, "finish_reason": "length" if error is None else None,
            "output_tokens": out if error is None else None, "ttft_s": ttft if error is None else None,
            "tpot_s": (e2el - ttft) / (out - 1) if error is None else None, "e2el_s": e2el if error is None else None,
            "itl_s": gaps, "chunks": out if error is None else 0, "text": f"text {start} {cell} {repeat} {k}",
            "wave_started_at": None}


def bracket(tmp_path, *, failed_stream=False, roles=ROLES, candidates=None):
    """A speed decision and its streams; ``candidates`` ({name: how many starts its decision holds}) makes it
    a sweep's bracket, one decision per candidate, with ``roles`` naming each start's arm."""
    recs, bench, pooled, durations = [], {}, {}, {"short-c1": 1.2, "random-c2": 2.0}
    for start, _, arm in roles:
        base = 100 * (int(start[1:]) - 1)
        # short-c1: two requests one second apart (one per repeat), TTFT 0.1 / 0.3, E2EL 0.4 / 0.6, 4 tokens
        recs.append(stream(start, arm, "short-c1", 0, 0, at=base, ttft=0.1, e2el=0.4))
        recs.append(stream(start, arm, "short-c1", 1, 0, at=base + 1.0, ttft=0.3, e2el=0.6))
        for r in range(2):
            for k in range(2):
                err = "http 500: boom" if failed_stream and start == "s2" and r == 1 and k == 1 else None
                recs.append(stream(start, arm, "random-c2", r, k, at=base + 10 + r, ttft=0.2 + 0.1 * k, e2el=0.8,
                                   prompt=16, error=err))
        for c in CELLS:
            mine = [x for x in recs if x["start"] == start and x["cell"] == c["name"]]
            bench.setdefault(c["name"], {})[start] = bench_serve_table(mine, durations[c["name"]])
            spec = {"accepted": 3.0, "drafts": 2.0, "draft_tokens": 4.0} if arm != "control" else \
                {"accepted": 0.0, "drafts": 0.0, "draft_tokens": 0.0}
            pooled.setdefault(c["name"], {})[start] = [dict(spec), dict(spec)]
    starts = [{"start": s, "role": role, "arm": arm,
               "started_at": (T0 + dt.timedelta(seconds=100 * k)).isoformat(),
               "stopped_at": (T0 + dt.timedelta(seconds=100 * k + 50)).isoformat()}
              for k, (s, role, arm) in enumerate(roles)]
    root = tmp_path / "results" / "demo"

    def decision(dpath, spath, n, sweep=None):
        keep = {st for st, _, _ in roles[:n]}
        artifacts.write_json(dpath, {"schema": "pairaudit.speed_decision/v1", "audit": "demo", "starts": starts[:n],
                                     "cells": CELLS, "pooled": {c: {st: v for st, v in by.items() if st in keep}
                                                                for c, by in pooled.items()},
                                     "bench_serve": {c: {st: v for st, v in by.items() if st in keep}
                                                     for c, by in bench.items()},
                                     "params": {"output_len": 4, "repeats": 2, "waves": 1},
                                     "gate": {"rule": "win2-v2", "verdict": "NO_WIN", "reasons": []},
                                     "streams": str(spath), **({"sweep": sweep} if sweep else {})})

    header = {"schema": "pairaudit.speed_streams/v1", "audit": "demo", "provenance": {}}
    if candidates:
        spath = root / "speed" / "bracket-0123456789" / "streams.jsonl"
        artifacts.write_jsonl(spath, header, recs)
        for c, n in candidates.items():
            decision(root / "candidates" / c / "speed" / "decision.json", spath, n, sweep={"candidate": c})
    else:
        spath = root / "speed" / "streams.jsonl"
        artifacts.write_jsonl(spath, header, recs)
        decision(root / "speed" / "decision.json", spath, len(roles))
    for arm in {a for _, _, a in roles}:
        artifacts.write_json(root / "launch" / f"{arm}.json", {"schema": "pairaudit.launch/v1", "arm": arm,
                                                                "mode": "launch", "spec_sha256": "0" * 64,
                                                                "model": "SmolLM2-135M-Instruct",
                                                                "served_model_name": "smol"})
    return root


def test_known_answers_of_one_start_and_cell(tmp_path):
    root = bracket(tmp_path)
    ex = vllm_bench.export_audit(root)
    assert ex.skipped == [] and sorted(ex.written) == ["s1", "s2", "s3"]
    path = Path(ex.written["s1"]["short-c1"])
    assert path == root / "exports" / "vllm-bench" / "s1-control" / "short-c1.json"
    r = json.loads(path.read_text())
    assert r["date"] == "20261201-120050" and r["backend"] == "openai" and r["model_id"] == "smol"
    assert r["tokenizer_id"] == "SmolLM2-135M-Instruct" and r["max_concurrency"] == 1 and r["num_prompts"] == 2
    assert (r["completed"], r["failed"], r["total_input_tokens"], r["total_output_tokens"]) == (2, 0, 20, 8)
    assert r["duration"] == 1.2
    assert r["request_throughput"] == pytest.approx(2 / 1.2)
    assert r["output_throughput"] == pytest.approx(8 / 1.2)
    assert r["total_token_throughput"] == pytest.approx(28 / 1.2)
    assert (r["mean_ttft_ms"], r["median_ttft_ms"], r["std_ttft_ms"]) == pytest.approx((200, 200, 100))
    assert (r["p50_ttft_ms"], r["p90_ttft_ms"], r["p99_ttft_ms"]) == pytest.approx((200, 280, 298))
    assert (r["mean_tpot_ms"], r["std_tpot_ms"]) == pytest.approx((100, 0))
    assert r["mean_itl_ms"] == pytest.approx(100) and r["p99_e2el_ms"] == pytest.approx(598)
    assert r["mean_e2el_ms"] == pytest.approx(500)
    # one request per second, four tokens each: four tokens in the busiest second, one request at a time
    assert (r["max_output_tokens_per_s"], r["max_concurrent_requests"]) == (4.0, 1)
    assert r["ttfts"] == [0.1, 0.3] and r["output_lens"] == [4, 4] and r["input_lens"] == [10, 10]
    assert r["itls"][0] == pytest.approx([0.1, 0.1, 0.1]) and r["latencies"] == [0.4, 0.6]
    assert r["generated_texts"] == ["text s1 short-c1 0 0", "text s1 short-c1 1 0"] and r["errors"] == ["", ""]
    assert r["start_times"][1] - r["start_times"][0] == pytest.approx(1.0)
    assert "spec_decode_acceptance_rate" not in r       # the control drafted nothing
    assert r["pairaudit"]["start"] == "s1" and r["pairaudit"]["role"] == "control_before"
    assert r["pairaudit"]["generated_texts_recorded"] is True
    # the candidate's drafts: 6 accepted of 8 drafted tokens in 4 drafts
    c = json.loads(Path(ex.written["s2"]["random-c2"]).read_text())
    assert c["spec_decode_acceptance_rate"] == pytest.approx(75.0)
    assert c["spec_decode_acceptance_length"] == pytest.approx(2.5)
    assert (c["spec_decode_num_drafts"], c["spec_decode_draft_tokens"], c["spec_decode_accepted_tokens"]) == (4, 8, 6)
    assert c["max_concurrency"] == 2 and c["max_concurrent_requests"] == 2


def test_every_start_of_a_sequential_bracket_is_written_with_its_own_role(tmp_path):
    from pairaudit.speed.metrics import start_roles

    root = bracket(tmp_path, roles=tuple(start_roles(5)))
    ex = vllm_bench.export_audit(root)
    assert ex.skipped == [] and sorted(ex.written) == ["s1", "s2", "s3", "s4", "s5"]
    r = json.loads(Path(ex.written["s4"]["short-c1"]).read_text())
    assert (r["pairaudit"]["start"], r["pairaudit"]["role"], r["pairaudit"]["arm"]) == ("s4", "candidate_2", "candidate")
    assert Path(ex.written["s5"]["random-c2"]) == root / "exports/vllm-bench/s5-control/random-c2.json"


def test_a_sweeps_bracket_writes_each_start_once_under_the_bracket(tmp_path):
    roles = (("s1", "control", "control"), ("s2", "candidate", "fast"), ("s3", "control", "control"),
             ("s4", "candidate", "slow"), ("s5", "control", "control"))
    # fast was decided on its first window (its decision holds s1-s3), slow's holds the whole bracket
    root = bracket(tmp_path, roles=roles, candidates={"fast": 3, "slow": 5})
    assert vllm_bench.has_speed(root)
    ex = vllm_bench.export_audit(root)
    assert ex.skipped == []
    assert sorted(ex.written) == [f"bracket-0123456789/s{k}" for k in range(1, 6)]
    out = root / "exports" / "vllm-bench" / "bracket-0123456789"
    assert sorted(p.name for p in out.iterdir()) == ["s1-control", "s2-fast", "s3-control", "s4-slow", "s5-control"]
    r = json.loads((out / "s4-slow" / "random-c2.json").read_text())
    assert (r["pairaudit"]["role"], r["pairaudit"]["arm"]) == ("candidate", "slow")
    assert r["spec_decode_num_drafts"] == 4 and r["model_id"] == "smol"
    # s1-s3 come from the first decision that holds them (fast's), s4-s5 from slow's
    consumed = {st: next(iter(json.loads((out / f"{st}-{a}" / "short-c1.json").read_text())["pairaudit"]["consumed"]))
                for st, _, a in roles}
    assert {st: Path(p).parent.parent.name for st, p in consumed.items()} == {
        "s1": "fast", "s2": "fast", "s3": "fast", "s4": "slow", "s5": "slow"}


def test_a_failed_request_keeps_vllms_defaults(tmp_path):
    root = bracket(tmp_path, failed_stream=True)
    ex = vllm_bench.export_audit(root)
    r = json.loads(Path(ex.written["s2"]["random-c2"]).read_text())
    assert (r["completed"], r["failed"], r["num_prompts"]) == (3, 1, 4)
    assert r["output_lens"][3] == 0 and r["ttfts"][3] == 0.0 and r["itls"][3] == [] and r["latencies"][3] == 0.0
    assert r["errors"][3] == "http 500: boom" and r["generated_texts"][3] == ""
    assert r["total_output_tokens"] == 12 and r["total_input_tokens"] == 48   # successful requests only


def test_streams_that_disagree_with_the_decision_are_refused(tmp_path):
    root = bracket(tmp_path)
    spath = root / "speed" / "streams.jsonl"
    header, recs = artifacts.read_jsonl(spath)
    recs[0]["output_tokens"] = 5
    artifacts.write_jsonl(spath, header, recs)          # a valid artifact, but not the bracket decided on
    with pytest.raises(vllm_bench.VllmBenchExportError, match="start s1 cell short-c1: streams.jsonl gives "
                                                              "total_output_tokens 9, decision.json recorded 8"):
        vllm_bench.export_audit(root)


def test_an_edited_streams_file_is_refused_by_its_hash(tmp_path):
    root = bracket(tmp_path)
    spath = root / "speed" / "streams.jsonl"
    spath.write_text(spath.read_text().replace('"ttft_s": 0.1', '"ttft_s": 0.05', 1))
    with pytest.raises(artifacts.ArtifactError, match="does not match the content_sha256"):
        vllm_bench.export_audit(root)


def test_a_bracket_not_run_exports_nothing_and_says_why(tmp_path):
    root = tmp_path / "results" / "demo"
    artifacts.write_json(root / "speed" / "decision.json", {"schema": "pairaudit.speed_decision/v1", "audit": "demo",
                                                            "not_run": "the candidate preflight is FAIL",
                                                            "gate": {"rule": "win2-v4", "verdict": "INCONCLUSIVE",
                                                                     "reasons": ["not run"]}})
    artifacts.write_jsonl(root / "speed" / "streams.jsonl", {"schema": "pairaudit.speed_streams/v1"}, [])
    ex = vllm_bench.export_audit(root)
    assert ex.written == {} and ex.skipped == ["the bracket was not run: the candidate preflight is FAIL"]


# ------------------------------------------------------------------ against vLLM's own source

def serve_py_keys_problems(source: str, result: dict) -> list[str]:
    """Keys of ``result`` that vLLM's serve.py does not write (by literal or by its f-string forms)."""
    problems = []
    for key in result:
        if key == "pairaudit":
            continue
        m = re.fullmatch(r"(mean|median|std)_(ttft|tpot|itl|e2el)_ms", key)
        if m:
            if f'result[f"{m.group(1)}_{{metric_attribute_name}}_ms"]' not in source:
                problems.append(key)
            continue
        if re.fullmatch(r"p[0-9.]+_(ttft|tpot|itl|e2el)_ms", key):
            if 'result[f"p{p_word}_{metric_attribute_name}_ms"]' not in source:
                problems.append(key)
            continue
        if f'"{key}"' not in source:
            problems.append(key)
    return problems


def _check_against(serve_py: Path, tmp_path: Path) -> None:
    ex = vllm_bench.export_audit(bracket(tmp_path))
    source = serve_py.read_text()
    for cells in ex.written.values():
        for p in cells.values():
            assert serve_py_keys_problems(source, json.loads(Path(p).read_text())) == [], p


@pytest.mark.vllm
def test_keys_match_the_installed_vllm(tmp_path):
    from vllm_fixture import vllm_python_or_skip

    py = vllm_python_or_skip()
    origin = subprocess.run([py, "-c", "import importlib.util as u; print(u.find_spec('vllm.benchmarks.serve').origin)"],
                            capture_output=True, text=True, check=True).stdout.strip()
    _check_against(Path(origin), tmp_path)


def test_the_key_check_catches_a_key_vllm_does_not_write():
    src = 'result["duration"] = 1\nresult[f"mean_{metric_attribute_name}_ms"] = 2\n'
    assert serve_py_keys_problems(src, {"duration": 1, "mean_ttft_ms": 2, "throughput_tps": 3,
                                        "p99_ttft_ms": 4}) == ["throughput_tps", "p99_ttft_ms"]
