"""The diagnostics phase (greedy runs, divergence probes) end to end on real reference servers (attach mode).

A BF16-head candidate against the fp32 control: divergences are found, both
arms are probed on the shared prefix and grid-tie-v1 classifies every one; a
candidate with per-request logit noise fails the determinism check.
"""

from __future__ import annotations

import numpy as np
import pytest

from pairaudit import gates
from pairaudit.core import artifacts
from pairaudit.core.settings import GreedySettings
from pairaudit.core.jsonlog import read_log
from pairaudit.datasets import formats as datasets
from pairaudit.diagnostics import greedy as g
from pairaudit.diagnostics import stage as diagnostics_stage
from pairaudit.plans import stage as plan_stage
from pairaudit.serving import armspec, launch

pytestmark = pytest.mark.server
MODEL = "SmolLM2-135M-Instruct"
GREEDY = {"items": "all", "concordant": 0, "seed": 0, "max_tokens": 40, "determinism_repeats": 2}


@pytest.fixture(scope="module")
def servers(shared_server):
    return {"control": shared_server(None, 1024),
            "candidate": shared_server({"PAIRAUDIT_REF_LM_HEAD_BF16": "1"}, 1024),
            "noisy": shared_server({"PAIRAUDIT_REF_FAULT_NOISE": "2.0"}, 1024)}


def _inputs(tmp_path, url_by_arm):
    doc = datasets.prepare_dataset({"name": "algebra", "format": "math",
                                    "source": {"generated": {"kind": "algebra", "n": 30, "seed": 11}},
                                    "select": {"count": 4, "seed": 3}, "prompt_template": "default"},
                                   cache_dir=tmp_path / "cache", base_dir=tmp_path)
    dataset_path = tmp_path / "dataset.json"
    artifacts.write_json(dataset_path, doc)
    table = {"indices": doc["indices"], "control_only": [], "candidate_only": []}
    paired_path = tmp_path / "paired.json"
    artifacts.write_json(paired_path, {"schema": "pairaudit.paired/v1", "dataset": "algebra", "table": table})
    spec_paths, launch_paths = {}, {}
    for arm, url in url_by_arm.items():
        # the arm's spec file as the arm_spec rule writes it, and its answers phase's receipt
        spec_paths[arm] = str(tmp_path / f"specs/{arm}.json")
        plan_stage.arm_spec_stage(arm=arm, arm_cfg={"mode": "attach", "url": url, "model": MODEL,
                                                    "max_model_len": 1024}, out_path=spec_paths[arm])
        launch_paths[arm] = str(tmp_path / f"launch-{arm}.json")
        artifacts.write_json(launch_paths[arm], launch.receipt(armspec.read_spec(spec_paths[arm], arm=arm)))
    preflight_path = tmp_path / "preflight.json"
    artifacts.write_json(preflight_path, {"verdict": "PASS"})
    return str(dataset_path), str(paired_path), str(preflight_path), spec_paths, launch_paths


def _run(tmp_path, url_by_arm, *, fresh=True, greedy=GREEDY):
    dataset_path, paired_path, preflight_path, spec_paths, launch_paths = _inputs(tmp_path, url_by_arm)
    greedy_paths = {"algebra": {arm: str(tmp_path / f"greedy-{arm}.jsonl") for arm in spec_paths}}
    out = tmp_path / "divergence.json"
    phase = diagnostics_stage.diagnostics_phase(
        dataset_paths={"algebra": dataset_path}, paired_paths={"algebra": paired_path}, receipt_paths=launch_paths,
        preflight_paths={a: preflight_path for a in spec_paths}, spec_paths=spec_paths, greedy=GreedySettings.from_json(greedy), max_divergent=3,
        chat_template_kwargs={}, journal_dir=str(tmp_path / "journal"), greedy_paths=greedy_paths,
        divergence_paths={"algebra": str(out)}, server_logs={a: str(tmp_path / f"{a}.log") for a in spec_paths},
        starts_log=str(tmp_path / "starts.jsonl"), phase_path=str(tmp_path / "phase.json"))
    doc = artifacts.read_json(out)
    assert doc["schema"] == "pairaudit.divergence/v1"
    # one session per arm turn: control, candidate, and control again only to probe a divergence
    assert [s["arm"] for s in phase["starts"]] == ["control", "candidate", "control"]
    if fresh:
        assert phase["starts"][2]["starts"] == (1 if any(d["diverged"] for d in doc["divergences"]) else 0)
    else:  # everything is in the journals: no server is needed at all
        assert [s["starts"] for s in phase["starts"]] == [0, 0, 0]
    # the phase read each arm's spec file, and says so
    assert set(spec_paths.values()) <= set(phase["provenance"]["consumed"])
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


def test_bf16_candidate_divergences_are_probed_and_classified(servers, tmp_path):
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
    # both arms probed on exactly the shared prefix, each with its own fresh salt
    cp, kp = doc["probes"]["control"], doc["probes"]["candidate"]
    assert [p["index"] for p in cp] == [p["index"] for p in kp] == [d["index"] for d in diverged]
    for d, p, q in zip(diverged, cp, kp):
        for probe in (p, q):
            assert probe["status"] == 200 and probe["error"] is None and len(probe["top20"]) == 20
            assert probe["body"]["prompt"][-len(d["shared_prefix"]):] == d["shared_prefix"] or not d["shared_prefix"]
            assert probe["body"]["max_tokens"] == 1
        assert p["salt"] != q["salt"] and {p["salt"], q["salt"]}.isdisjoint({gc[d["index"]]["salt"],
                                                                               gk[d["index"]]["salt"]})
        # the forced prefix as each server counted it: prompt + shared prefix
        assert p["prompt_tokens"] == q["prompt_tokens"] == len(gc[d["index"]]["prompt_ids"]) + d["first_divergence"]
    salts = {r["salt"] for arm in greedy_paths for r in artifacts.read_jsonl(greedy_paths[arm])[1]}
    salts |= {p["salt"] for arm in doc["probes"] for p in doc["probes"][arm]}
    assert len(salts) == 2 * 4 + 2 * len(diverged)  # a fresh salt for every generation and probe
    # the rule's inputs are the probes' evidence, one per divergent item
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
    # a rerun of the phase asks nothing its journals hold, and starts no server
    journals = {p: len(read_log(p)) for p in (tmp_path / "journal").rglob("*.jsonl")}
    again, _ = _run(tmp_path, {"control": servers["control"].url, "candidate": servers["candidate"].url},
                    fresh=False)
    assert {p: len(read_log(p)) for p in (tmp_path / "journal").rglob("*.jsonl")} == journals
    assert again["divergences"] == doc["divergences"] and again["probes"] == doc["probes"]
    starts = [r for r in read_log(tmp_path / "starts.jsonl") if r["event"] == "ready"]
    assert len(starts) == 2 + 1  # the first run's: control, candidate, control again to probe


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
    assert gates.grid_tie_v1([])["verdict"] == "INCONCLUSIVE"  # no counts: nothing shown compared
