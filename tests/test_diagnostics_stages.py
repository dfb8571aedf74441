"""Greedy runs in each arm's answers phase, then the diagnostics (no server), on real reference servers (attach).

A BF16-head candidate against the fp32 control: divergences are found and
grid-tie-v1 classifies every one from each arm's own greedy top-20 at the
divergence; a candidate with per-request logit noise fails the determinism
check. The diagnostics job starts no server: every greedy run was made on
the arm's answers-phase start.
"""

from __future__ import annotations

import numpy as np
import pytest

from pairaudit import gates
from pairaudit.answers import stage as answers_stage
from pairaudit.core import artifacts, defaults
from pairaudit.core.jsonlog import read_log
from pairaudit.core.settings import GreedySettings, SamplingSettings
from pairaudit.datasets import formats as datasets
from pairaudit.diagnostics import greedy as g
from pairaudit.diagnostics import stage as diagnostics_stage
from pairaudit.plans import stage as plan_stage

pytestmark = pytest.mark.server
MODEL = "SmolLM2-135M-Instruct"
GREEDY = {"items": "all", "concordant": 0, "seed": 0, "max_tokens": 40, "determinism_repeats": 2}
SAMPLING = {"api": "chat", "temperature": 0.7, "top_p": 0.8, "top_k": 20, "min_p": 0.0, "base_seed": 1000,
            "max_tokens": 4, "concurrency": 4, "request_timeout_s": 300}


@pytest.fixture(scope="module")
def servers(shared_server):
    return {"control": shared_server(None, 1024),
            "candidate": shared_server({"PAIRAUDIT_REF_LM_HEAD_BF16": "1"}, 1024),
            "noisy": shared_server({"PAIRAUDIT_REF_FAULT_NOISE": "2.0"}, 1024)}


def _answers(tmp_path, url_by_arm, greedy):
    """Each arm's answers phase (sampled and greedy runs on its one start), as the workflow runs it."""
    doc = datasets.prepare_dataset({"name": "algebra", "format": "math",
                                    "source": {"generated": {"kind": "algebra", "n": 30, "seed": 11}},
                                    "select": {"count": 4, "seed": 3}, "prompt_template": "default"},
                                   cache_dir=tmp_path / "cache", base_dir=tmp_path)
    dataset_path = tmp_path / "dataset.json"
    artifacts.write_json(dataset_path, doc)
    table = {"indices": doc["indices"], "control_only": [], "candidate_only": []}
    paired_path = tmp_path / "paired.json"
    artifacts.write_json(paired_path, {"schema": "pairaudit.paired/v1", "dataset": "algebra", "table": table})
    sampling = SamplingSettings.from_json(defaults.filled(SAMPLING, "sampling"))
    out: dict = {"dataset": str(dataset_path), "paired": str(paired_path), "phases": {}}
    for arm, url in url_by_arm.items():
        r = tmp_path / "results"
        spec, requests = str(r / f"specs/{arm}.json"), str(r / f"requests/algebra/{arm}.json")
        plan_stage.arm_spec_stage(arm=arm, arm_cfg={"mode": "attach", "url": url, "model": MODEL,
                                                    "max_model_len": 1024}, out_path=spec)
        plan_stage.requests_stage(dataset_path=str(dataset_path), spec_path=spec, sampling=sampling.to_json(),
                                  audit="t", out_path=requests)
        for key, rel in (("receipt", f"launch/{arm}.json"), ("preflight", f"preflight/{arm}.json"),
                         ("answers", f"answers/{arm}.json")):
            out.setdefault(key, {})[arm] = str(r / rel)
        out["phases"][arm] = answers_stage.answers_phase(
            arm=arm, spec_path=spec, requests_paths={"algebra": requests}, sampling=sampling, audit="t",
            boundary_plan_path=None, journal_dir=str(r / "journal"), receipt_path=out["receipt"][arm],
            preflight_path=out["preflight"][arm], phase_path=out["answers"][arm], boundary_path=None,
            server_log=str(r / f"logs/answers-{arm}.log"), starts_log=str(tmp_path / "starts.jsonl"),
            greedy_max_tokens=greedy["max_tokens"], determinism_repeats=greedy["determinism_repeats"])
        assert out["phases"][arm]["failure"] is None
    return out


def _run(tmp_path, url_by_arm, *, greedy=GREEDY):
    inputs = _answers(tmp_path, url_by_arm, greedy)
    readies = [r for r in read_log(tmp_path / "starts.jsonl") if r["event"] == "ready"]
    greedy_paths = {"algebra": {arm: str(tmp_path / f"greedy-{arm}.jsonl") for arm in url_by_arm}}
    out = tmp_path / "divergence.json"
    phase = diagnostics_stage.diagnostics_phase(
        dataset_paths={"algebra": inputs["dataset"]}, paired_paths={"algebra": inputs["paired"]},
        receipt_paths=inputs["receipt"], preflight_paths=inputs["preflight"], answers_paths=inputs["answers"],
        greedy=GreedySettings.from_json(greedy), max_divergent=3, chat_template_kwargs={},
        journal_dir=str(tmp_path / "results" / "journal"), greedy_paths=greedy_paths,
        divergence_paths={"algebra": str(out)}, phase_path=str(tmp_path / "phase.json"))
    doc = artifacts.read_json(out)
    assert doc["schema"] == "pairaudit.divergence/v1"
    # one start per arm, the answers phase's; the diagnostics start none
    assert [(r["phase"], r["arm"]) for r in readies] == [("answers", "control"), ("answers", "candidate")]
    assert [r for r in read_log(tmp_path / "starts.jsonl") if r["event"] == "ready"] == readies
    assert phase["starts"] == [] and set(phase["greedy_from"].values()) == set(inputs["answers"].values())
    return doc, greedy_paths["algebra"]


def greedy_of(path):
    header, records = artifacts.read_jsonl(path)
    return header, {r["index"]: r for r in records}


def _on_bf16_grid(top):
    """Every top-20 gap an integer multiple of one power-of-two step (independent of the rule's code)."""
    vals = np.array([v for _, v in top], dtype=np.float64)
    gaps = np.abs(vals[:, None] - vals[None, :])
    pos = gaps[gaps > 1e-5]
    step = 2.0 ** round(float(np.log2(pos.min())))
    return bool(np.all(np.abs(gaps / step - np.round(gaps / step)) < 1e-4))


def test_bf16_candidate_divergences_are_classified_from_the_greedy_tops(servers, tmp_path):
    doc, greedy_paths = _run(tmp_path, {"control": servers["control"].url, "candidate": servers["candidate"].url})
    (_, gc), (_, gk) = greedy_of(greedy_paths["control"]), greedy_of(greedy_paths["candidate"])
    assert all(r["error"] is None for r in [*gc.values(), *gk.values()])
    # both arms got the identical token prompt, rendered by each server's own template
    assert all(gc[i]["prompt_ids"] == gk[i]["prompt_ids"] for i in gc)
    diverged = [d for d in doc["divergences"] if d["diverged"]]
    assert diverged, "a BF16 head flips near-tied argmaxes within 4 x 40 greedy tokens"
    assert all(d["prompt_ids_equal"] for d in doc["divergences"])
    for d in diverged:
        k = d["first_divergence"]
        assert d["prefix_equal"] and d["shared_prefix"] == gc[d["index"]]["token_ids"][:k]
        assert d["control_token_id"] != d["candidate_token_id"]
    # each arm's evidence is its own greedy run's top-20 at the divergence: no request beyond the greedy runs
    assert doc["top_lists"]["source"] == "greedy"
    cp, kp = doc["probes"]["control"], doc["probes"]["candidate"]
    assert [p["index"] for p in cp] == [p["index"] for p in kp] == [d["index"] for d in diverged]
    for d, p, q in zip(diverged, cp, kp):
        k = d["first_divergence"]
        for tops, recs in ((p, gc), (q, gk)):
            rec = recs[d["index"]]
            assert tops["source"] == "greedy" and tops["error"] is None and len(tops["top20"]) == 20
            assert tops["top20"] == rec["top20"][k] and tops["salt"] == rec["salt"]
            # the shared prefix as the server counted it: its served prompt + the k shared tokens
            assert tops["prefix_len"] == rec["usage"]["prompt_tokens"] + k == len(rec["prompt_ids"]) + k
        assert (p["token_id"], q["token_id"]) == (d["control_token_id"], d["candidate_token_id"])
    salts = {r["salt"] for arm in greedy_paths for r in artifacts.read_jsonl(greedy_paths[arm])[1]}
    assert len(salts) == 2 * 4  # a fresh salt for every generation
    # the rule's inputs are those tops, one per divergent item
    inputs = doc["grid_tie_inputs"]
    assert inputs == g.grid_tie_inputs(diverged, cp, kp)
    assert [x["index"] for x in inputs] == [d["index"] for d in diverged]
    assert set(inputs[0]) == {"index", "control_token_id", "candidate_token_id", "candidate_top", "control_top",
                              "control_prefix_len", "candidate_prefix_len"}
    grid = doc["grid_tie"]
    assert grid["verdict"] in ("PASS", "STOP") and grid["rule"] == "grid-tie-v1"
    assert len(grid["probes"]) == len(diverged)
    for probe, x in zip(grid["probes"], inputs):
        c = probe["clauses"]
        assert set(c) == set(gates.PROBE_CLAUSES)
        assert c["finite_values"] and c["equal_prefix_lengths"]
        assert c["candidate_token_is_top"]  # greedy emits its own argmax
        # the BF16 head puts the candidate's top-20 on the binary grid ...
        assert c["grid_step_power_of_two"] and c["all_gaps_on_grid"], probe["reasons"]
        assert probe["step"] is not None and probe["residuals"]
        assert _on_bf16_grid(x["candidate_top"])
        # ... and the fp32 control's is not (the contrast the rule relies on)
        assert not _on_bf16_grid(x["control_top"])
    if len(diverged) > 3:
        assert "at_most_3_divergent" in grid["failed_clauses"]
    assert doc["determinism"]["verdict"] == "PASS"
    # a rerun of the answers phases asks nothing their journals hold (each start's preflight is kept apart)
    def answered():
        return {p: len(read_log(p)) for sub in ("greedy", "sampled")
                for p in (tmp_path / "results" / "journal" / sub).rglob("*.jsonl")}

    journals = answered()
    assert len(journals) == 4
    for arm in ("control", "candidate"):
        again = artifacts.read_json(tmp_path / "results" / f"answers/{arm}.json")["greedy"]["algebra"]
        assert again["open"] == 0 and again["items"] == 4 and again["determinism_repeats"] == 2
    phases = _answers(tmp_path, {"control": servers["control"].url, "candidate": servers["candidate"].url}, GREEDY)
    assert all(p["greedy"]["algebra"]["asked"] == 0 for p in phases["phases"].values())
    assert answered() == journals


def test_noisy_candidate_fails_determinism(servers, tmp_path):
    doc, greedy_paths = _run(tmp_path, {"control": servers["control"].url, "candidate": servers["noisy"].url},
                             greedy={**GREEDY, "determinism_repeats": 3})
    plain, noisy = (greedy_of(greedy_paths[arm])[0]["determinism"] for arm in ("control", "candidate"))
    # the same greedy request three times, a fresh salt each (no cache reuse)
    assert len(set(plain["hashes"])) == 1 and all(r["error"] is None for r in plain["records"])
    assert len({r["salt"] for r in plain["records"]}) == 3
    assert all(r["error"] is None for r in noisy["records"]) and len(set(noisy["hashes"])) > 1
    det = doc["determinism"]
    assert det["verdict"] == "STOP" and det["nondeterministic_arms"] == ["candidate"]
    assert det["arms"]["control"]["deterministic"] is True


def test_identical_arms_find_no_divergence(servers, tmp_path):
    doc, greedy_paths = _run(tmp_path, {"control": servers["control"].url, "candidate": servers["control"].url})
    (_, a), (_, b) = greedy_of(greedy_paths["control"]), greedy_of(greedy_paths["candidate"])
    assert all(r["error"] is None and r["status"] == 200 for r in [*a.values(), *b.values()])
    assert all(len(r["top20"]) == len(r["token_ids"]) and len(r["top20"][0]) == 20 for r in a.values())
    # the same server twice, each generation with its own salt: no shared cache
    assert {r["salt"] for r in a.values()}.isdisjoint({r["salt"] for r in b.values()})
    assert [a[i]["request_sha256"] for i in a] == [b[i]["request_sha256"] for i in a]
    assert [d["diverged"] for d in doc["divergences"]] == [False] * 4
    assert doc["grid_tie_inputs"] == [] and doc["counts"] == {"selected": 4, "compared": 4, "diverged": 0,
                                                                "unresolved": 0}
    assert doc["grid_tie"]["verdict"] == "PASS" and doc["probes"] == {"control": [], "candidate": []}
    # the determinism repeats are of each dataset's first item, the same in both arms
    dets = [greedy_of(greedy_paths[arm])[0]["determinism"]["index"] for arm in ("control", "candidate")]
    assert dets[0] == dets[1] == min(a)
    assert gates.grid_tie_v1([])["verdict"] == "INCONCLUSIVE"  # no counts: nothing shown compared
