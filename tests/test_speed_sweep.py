"""The shared-control speed bracket of several candidates: its schedule, each candidate's windows and verdicts on
known answers (built to WIN, LOSS, NO_WIN, INCONCLUSIVE, and built not to), one candidate being win2-v4 itself."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from test_launch import fake_cfg
from test_speed import bracket_inputs

from pairaudit import gates
from pairaudit.core import artifacts, contracts, readers
from pairaudit.core.jsonlog import read_log
from pairaudit.gates import server_failure
from pairaudit.gates.speed import arm_factor, sweep_length, sweep_verdicts, sweep_windows
from pairaudit.speed import bracket as speed_bracket
from pairaudit.speed import stage as speed_stage

P, G = "pooled_rate_tps", "decode_tps"
# an earlier window's evidence: 0.8 % start to start, 12 degrees of freedom (an A/A of 13 control starts)
EV = {m: {"pooled": {"var": 0.64, "df": 12, "windows": 3}, "cells": {"c1": {"var": 0.64, "df": 12}}} for m in (P, G)}
CANDS = ["fast", "slow", "same", "noisy"]
ROOT = Path(__file__).resolve().parents[1]


def series(values: list[float], reps: int = 3) -> dict:
    s = [list(values) for _ in range(reps)]
    return {"c1": {P: s, G: s}}


def decide(arms, values, candidate, *, max_starts=9, evidence=EV, **kw):
    return gates.win2_v4(series(values), primary=P, guards=[G], max_starts=max_starts, evidence=evidence,
                         arms=list(arms), candidate=candidate, **kw)


def rounds(candidates, n):
    arms: list[str] = []
    for _ in range(n):
        arms += gates.sweep_round(arms, candidates, candidates)
    return arms


def bracket_values(arms, level, controls, jitter=(0.3, -0.2)):
    """Control starts from ``controls`` in turn; each candidate start at its level, alternately jittered."""
    ctrl, out, seen = iter(controls), [], {}
    for a in arms:
        if a == "control":
            out.append(next(ctrl))
            continue
        k = seen.get(a, 0)
        seen[a] = k + 1
        lv = level[a]
        out.append(lv[k] if isinstance(lv, list) else lv + jitter[k % 2])
    return out


CONTROLS = [100.0, 100.4, 99.7, 100.2, 99.9, 100.3, 99.8, 100.1, 100.0, 99.6, 100.2, 99.9, 100.0, 100.1]


# ------------------------------------------------------------------ schedule

def test_the_first_round_shares_every_control_between_its_neighbours():
    assert gates.sweep_round([], ["a", "b", "c"], []) == ["control", "a", "control", "b", "control", "c", "control"]
    # one candidate: win2-v4's own bracket, C T C, then T C per round
    arms = gates.sweep_round([], ["a"], ["a"])
    arms += gates.sweep_round(arms, ["a"], ["a"])
    assert arms == ["control", "a", "control", "a", "control"]


def test_later_rounds_only_run_the_undecided_candidates_in_bracket_order_up_to_their_budget():
    arms = gates.sweep_round([], ["a", "b", "c"], [])
    # b decided in the first round: it gets no more starts
    nxt = gates.sweep_next(arms, ["a", "b", "c"], ["c", "a"], budget=4)
    assert nxt == ["a", "control", "c", "control"]
    arms += nxt
    assert [sweep_windows(arms, c) for c in "abc"] == [2, 1, 2]
    # the budget is per candidate: at 2 candidate starts, a budget of 2 stops a and c
    assert gates.sweep_next(arms, ["a", "b", "c"], ["a", "c"], budget=2) == []
    assert gates.sweep_next(arms, ["a", "b", "c"], ["a", "b", "c"], budget=2) == ["b", "control"]
    with pytest.raises(ValueError, match="distinct names"):
        gates.sweep_round([], ["a", "a"], [])
    with pytest.raises(ValueError, match="distinct names"):
        gates.sweep_round([], ["control"], [])


def test_each_candidate_is_compared_to_its_neighbouring_controls_and_pools_the_others():
    arms = gates.sweep_round([], ["a", "b", "c"], [])
    arms += gates.sweep_round(arms, ["a", "b", "c"], ["c"])
    arms += gates.sweep_round(arms, ["a", "b", "c"], ["a", "c"])
    # C a C b C c C c C a C c C: a has two separate windows; c a run of two adjacent ones (win2-v4's
    # bracket C c C c C) and one more
    assert arms == ["control", "a", "control", "b", "control", "c", "control", "c", "control", "a", "control", "c",
                    "control"]
    a, c = gates.sweep_layout(arms, "a"), gates.sweep_layout(arms, "c")
    assert a.windows == [(0, 1, 2), (8, 9, 10)] and a.controls == (0, 2, 8, 10) and a.others == (4, 6, 12)
    assert a.factor == pytest.approx(2 * 0.25 * 1.5)  # two windows of 1.5 sigma^2 each, averaged
    assert c.runs == (((4, 6, 8), (5, 7)), ((10, 12), (11,))) and c.others == (0, 2)
    assert c.factor == pytest.approx((2 / 3) ** 2 * arm_factor(5) + (1 / 3) ** 2 * arm_factor(3))
    assert gates.sweep_layout(arms[:9], "c").factor == pytest.approx(arm_factor(5))
    assert gates.sweep_layout(arms, "a", pool_controls=False).others == ()
    with pytest.raises(ValueError, match="alternates control and candidate"):
        gates.sweep_layout(["control", "a", "b", "control"], "a")
    with pytest.raises(ValueError, match="no start"):
        gates.sweep_layout(arms, "z")


# ------------------------------------------------------------------ verdicts

def test_one_candidate_in_a_shared_bracket_is_win2_v4():
    vals = [100.0, 103.1, 100.3, 102.9, 99.8]
    one = decide(["control", "t", "control", "t", "control"], vals, "t")
    ref = gates.win2_v4(series(vals), primary=P, guards=[G], max_starts=9, evidence=EV)
    assert one["verdict"] == ref["verdict"] == "WIN"
    for k in ("pooled_gain_pct", "half_width_pct", "lower_bound_pct", "alpha_per_look", "looks"):
        assert one[k] == pytest.approx(ref[k]), k
    assert one["noise"]["window_df"] == ref["noise"]["window_df"] == 3
    assert one["sweep"]["pooled_control_starts"] == []


def test_three_rounds_decide_each_candidate_as_built():
    arms = rounds(CANDS, 3)
    vals = bracket_values(arms, {"fast": 104.0, "slow": 96.0, "same": 100.0, "noisy": [92.0, 108.0, 97.0]}, CONTROLS)
    got = {c: decide(arms, vals, c) for c in CANDS}
    assert {c: r["verdict"] for c, r in got.items()} == {
        "fast": "WIN", "slow": "LOSS", "same": "NO_WIN", "noisy": "INCONCLUSIVE"}, {c: r["reasons"] for c, r in got.items()}
    # every candidate: three separate windows, the other control starts of the bracket pooled into sigma^2
    for c, r in got.items():
        assert len(r["sweep"]["windows"]) == 3 and r["sweep"]["runs"] == 3
        assert len(r["sweep"]["control_starts"]) == 6 and len(r["sweep"]["pooled_control_starts"]) == 7
        assert r["noise"]["window_df"] == 3 * 1 + 2 + 6
    # the noisy candidate's own starts show its dispersion: the host's evidence is not borrowed, no more starts
    assert got["noisy"]["noise"]["evidence_df"] == 12 and got["noisy"]["noise"]["df_used"] == 11
    assert got["noisy"]["more_starts"] is True   # 3 of its budget of 4
    assert got["fast"]["pooled_gain_pct"] > 3.5 and got["slow"]["pooled_gain_pct"] < -3.5


def test_built_not_to_decide():
    arms = rounds(CANDS, 3)
    # +1.5 %: certain but below the bar; -1.5 %: below the bar the other way; +2.5 % on the first look only
    vals = bracket_values(arms, {"fast": 101.5, "slow": 98.5, "same": 100.0, "noisy": 102.5}, CONTROLS)
    got = {c: decide(arms, vals, c)["verdict"] for c in CANDS}
    assert got["fast"] != "WIN" and got["slow"] != "LOSS"
    first = gates.sweep_round([], CANDS, [])
    r1 = decide(first, vals[:len(first)], "noisy")
    # one window at the first of four looks: O'Brien-Fleming spends almost nothing there
    assert r1["verdict"] == "INCONCLUSIVE" and r1["more_starts"] is True


def test_a_candidate_does_not_depend_on_another_candidates_starts():
    arms = rounds(["a", "b"], 2)
    vals = bracket_values(arms, {"a": 103.5, "b": 100.0}, CONTROLS)
    other = bracket_values(arms, {"a": 103.5, "b": 90.0}, CONTROLS)
    x, y = decide(arms, vals, "a"), decide(arms, other, "a")
    assert x["pooled_gain_pct"] == pytest.approx(y["pooled_gain_pct"])
    assert x["half_width_pct"] == pytest.approx(y["half_width_pct"])


def test_a_slow_shared_control_start_moves_both_of_its_neighbours_alike():
    # why the candidates' decisions are correlated: s3 closes a's window and opens b's
    arms = gates.sweep_round([], ["a", "b"], [])
    base, slow = [100.0, 101.0, 100.0, 101.0, 100.0], [100.0, 101.0, 97.0, 101.0, 100.0]
    shift = {c: decide(arms, slow, c, evidence=None)["log_gain"] - decide(arms, base, c, evidence=None)["log_gain"]
             for c in ("a", "b")}
    assert shift["a"] == pytest.approx(shift["b"]) and shift["a"] > 1.0


def test_a_linear_drift_cancels_in_every_candidates_windows():
    # c's windows: a run of two and a run of one, so a plain mean over all its neighbouring controls would not
    # sit at its candidate starts' mean position; each run's own arm means do
    arms = gates.sweep_round([], ["a", "b", "c"], [])
    arms += gates.sweep_round(arms, ["a", "b", "c"], ["c"])
    arms += gates.sweep_round(arms, ["a", "b", "c"], ["a", "c"])
    flat = bracket_values(arms, {"a": 103.0, "b": 100.0, "c": 98.0}, [100.0] * 20, jitter=(0.0, 0.0))
    drift = [v * math.exp(0.004 * k) for k, v in enumerate(flat)]   # 0.4 % per start, 5 % over the bracket
    for c in "abc":
        assert decide(arms, drift, c)["log_gain"] == pytest.approx(decide(arms, flat, c)["log_gain"], abs=1e-9)


def test_the_budget_is_the_candidates_own():
    arms = rounds(["a", "b"], 3)
    with pytest.raises(ValueError, match="exceed its budget of 2"):
        decide(arms, [100.0] * len(arms), "a", max_starts=5)
    last = decide(arms[:9], [100.0, 104.0, 96.0, 100.0, 100.0, 97.0, 103.0, 100.0, 100.0], "a", max_starts=5,
                  evidence=None)
    assert last["verdict"] == "INCONCLUSIVE" and last["more_starts"] is False


# ------------------------------------------------------------------ simulated rates

@pytest.mark.parametrize("rep_sd, start_sd", [(2.7, 1.0), (3.0, 2.0)])
def test_each_candidate_keeps_its_false_win_and_loss_rates_with_a_shared_control(rep_sd, start_sd):
    rng = np.random.default_rng(7)
    kw = dict(primary="primary", guards=["g"], lower_is_better=(), win_pct=2.0, alpha_win=0.05, alpha_loss=0.05,
              start_noise_pct=3.0, min_df=2, evidence_f_alpha=0.05, spending="obf", loss_pooled_share=0.5)
    cands = ["T1", "T2", "T3"]

    def run(gain):
        sims = gates.simulate_sequences(rng, 1200, cells=2, repeats=3, rep_sd=rep_sd, start_sd=start_sd,
                                        max_starts=sweep_length(3, 9), gain_pct=gain, prompt_sd=5.0,
                                        metrics=["primary", "g"])
        return sweep_verdicts(sims, cands, max_starts=9, **kw)

    null, up = run(0.0), run(5.0)
    for c in cands:
        assert (null.verdicts[c] == "WIN").mean() <= 0.05 and (null.verdicts[c] == "LOSS").mean() <= 0.05, c
        assert (up.verdicts[c] == "WIN").mean() >= 0.5, c
        # a decided candidate stopped getting starts: on a clear +5 % most stop before their budget of 4
        assert (up.windows[c][up.verdicts[c] == "WIN"] < 4).mean() > 0.5, c
    assert null.windows["T1"].max() <= 4 and set(np.unique(null.starts)) <= set(range(7, sweep_length(3, 9) + 1, 2))


def test_one_candidate_simulated_is_the_sequential_win2_v4():
    rng = np.random.default_rng(3)
    kw = dict(primary="primary", guards=["g"], lower_is_better=(), win_pct=2.0, alpha_win=0.05, alpha_loss=0.05,
              start_noise_pct=3.0, min_df=2, evidence_f_alpha=0.05, spending="obf", loss_pooled_share=0.5)
    sims = gates.simulate_sequences(rng, 400, cells=2, repeats=3, rep_sd=2.7, start_sd=1.0, max_starts=9,
                                    gain_pct=2.5, prompt_sd=5.0, metrics=["primary", "g"])
    ref, used = gates.sequential_verdicts(sims, max_starts=9, **kw)
    got = sweep_verdicts(sims, ["T1"], max_starts=9, **kw)
    assert (got.verdicts["T1"] == ref).all() and (got.starts == used).all()
    assert len(set(ref)) >= 3   # the brackets are not all decided alike: the comparison says something


# ------------------------------------------------------------------ the stage

def sweep_run(tmp_path, speed_cfg: dict, candidates: list[str], paths: tuple[dict, dict, dict]) -> dict:
    lp, pp, sp = paths
    return speed_stage.speed_stage(
        launch_paths=lp, preflight_paths=pp, spec_paths=sp, speed=speed_bracket.resolve(speed_cfg), audit="sweep",
        candidates=candidates, out_paths={c: str(tmp_path / f"speed/{c}/decision.json") for c in candidates},
        streams_path=str(tmp_path / "speed/streams.jsonl"), archive_path=str(tmp_path / "archive.jsonl"),
        server_logs={"s1": str(tmp_path / "logs/speed-s1-control.log")},
        starts_log=str(tmp_path / "servers/starts.jsonl"))


def test_a_failing_candidate_is_its_own_evidence_and_the_other_candidates_bracket_goes_on(tmp_path):
    arms = {"control": fake_cfg(), "dies": fake_cfg("concurrent_stream_dies"), "ok": fake_cfg()}
    cfg = {"cells": [{"name": "pair-c2", "prompt": "random", "input_len": 16, "concurrency": 2}], "repeats": 2,
           "waves": 1, "output_len": 8, "accept_unverifiable_clock": True, "max_starts": 3, "repeat_s": None}
    docs = sweep_run(tmp_path, cfg, ["dies", "ok"], bracket_inputs(tmp_path, arms))
    saved = {c: artifacts.check_schema(artifacts.read_json(tmp_path / f"speed/{c}/decision.json"),
                                       contracts.SPEED_DECISION_SCHEMA, c) for c in ("dies", "ok")}
    assert saved == docs
    dies, ok = saved["dies"], saved["ok"]
    # the failing candidate: its failure (confirmed on a fresh start) is its decision's evidence
    assert dies["gate"]["verdict"] == "INCONCLUSIVE" and dies["not_run"].startswith("the candidate server failed")
    assert (dies["failure"]["arm"], dies["failure"]["what"]) == ("candidate", "s2 warm-up")
    assert dies["failure"]["confirmation"]["kind"] in (server_failure.SERVER_ERROR, server_failure.DEAD)
    # its planned closing control was not needed: the next candidate's window opens on s1
    assert [(s["start"], s["arm"]) for s in ok["starts"]] == [("s1", "control"), ("s3", "ok"), ("s4", "control")]
    assert ok["sweep"]["windows"] == [["s1", "s3", "s4"]] and ok["sweep"]["arms"] == ["control", "ok", "control"]
    assert ok["gate"]["sweep"]["control_starts"] == ["s1", "s4"]
    assert [f["start"] for f in ok["sweep"]["failed_starts"]] == ["s2"]
    assert ok["gate"]["rule"] == "win2-v5" and "not_run" not in ok
    assert ok["looks"] == [{"starts": 3, "windows": 1, **{k: ok["looks"][0][k] for k in (
        "verdict", "half_width_pct", "pooled_gain_pct", "more_starts")}}]
    # every start that ran, failed and confirming ones too, is in the starts log, each ended
    events = [(r["phase"], r["arm"], r["event"]) for r in read_log(tmp_path / "servers/starts.jsonl")]
    assert events == [("speed", "control", "ready"), ("speed", "control", "stopped"),
                      ("speed", "dies", "ready"), ("speed", "dies", "stopped"),
                      ("speed-confirm", "dies", "ready"), ("speed-confirm", "dies", "stopped"),
                      ("speed", "ok", "ready"), ("speed", "ok", "stopped"),
                      ("speed", "control", "ready"), ("speed", "control", "stopped")]
    _, streams = artifacts.read_jsonl(tmp_path / "speed/streams.jsonl")
    assert {r["start"] for r in streams} == {"s1", "s3", "s4"}


def test_a_failing_control_server_ends_the_bracket_for_every_undecided_candidate(tmp_path):
    arms = {"control": fake_cfg("concurrent_stream_dies"), "a": fake_cfg(), "b": fake_cfg()}
    cfg = {"cells": [{"name": "pair-c2", "prompt": "random", "input_len": 16, "concurrency": 2}], "repeats": 2,
           "waves": 1, "output_len": 8, "accept_unverifiable_clock": True, "max_starts": 3, "repeat_s": None}
    docs = sweep_run(tmp_path, cfg, ["a", "b"], bracket_inputs(tmp_path, arms))
    for c, doc in docs.items():
        assert doc["not_run"].startswith("the control server failed") and doc["gate"]["verdict"] == "INCONCLUSIVE"
        # a failing control is not confirmed (the servers gate reads it as INCONCLUSIVE whatever it was)
        assert doc["failure"]["arm"] == "control" and "confirmation" not in doc["failure"]
        assert [s["start"] for s in doc["starts"]] == ["s1"] and doc["sweep"]["candidate"] == c
        assert readers.SpeedDecisionDoc.from_json(doc).gate.verdict == "INCONCLUSIVE"
    events = [(r["arm"], r["event"]) for r in read_log(tmp_path / "servers/starts.jsonl")]
    assert events == [("control", "ready"), ("control", "stopped")]   # no candidate started


def test_undecided_candidates_get_another_round_each_against_its_own_neighbours(tmp_path):
    arms = {"control": fake_cfg(), "a": fake_cfg(), "b": fake_cfg()}
    cfg = {"cells": [{"name": "c1", "prompt": "random", "input_len": 16, "concurrency": 1}], "repeats": 2,
           "waves": 1, "output_len": 4, "accept_unverifiable_clock": True, "max_starts": 5, "repeat_s": None}
    docs = sweep_run(tmp_path, cfg, ["a", "b"], bracket_inputs(tmp_path, arms))
    # one degree of freedom after the first round: the 3 % fallback keeps both undecided, and each gets a
    # second window; at its budget (max_starts 5: two candidate starts) neither gets a third
    for c, doc in docs.items():
        assert doc["sweep"]["arms"] == ["control", "a", "control", "b", "control", "a", "control", "b", "control"]
        assert [(lk["starts"], lk["windows"], lk["more_starts"]) for lk in doc["looks"]] == [(5, 1, True), (9, 2, False)]
    assert docs["a"]["gate"]["sweep"]["windows"] == [["s1", "s2", "s3"], ["s5", "s6", "s7"]]
    assert docs["b"]["gate"]["sweep"]["windows"] == [["s3", "s4", "s5"], ["s7", "s8", "s9"]]
    assert docs["a"]["gate"]["sweep"]["pooled_control_starts"] == ["s9"]
    assert docs["a"]["gate"]["sweep"]["variance_factor"] == pytest.approx(0.75)   # two separate windows
    # the decision's spread is its own first window's controls
    assert docs["b"]["spread"]["c1"]["window_pct"] == [
        pytest.approx(100 * abs(x - y) / ((x + y) / 2)) for x, y in zip(
            [r["pooled_rate_tps"] for r in docs["b"]["pooled"]["c1"]["s3"]],
            [r["pooled_rate_tps"] for r in docs["b"]["pooled"]["c1"]["s5"]])]


def test_a_failing_control_preflight_leaves_every_candidate_unmeasured_and_a_candidates_only_its_own(tmp_path):
    arms = {"control": fake_cfg(), "a": fake_cfg(), "b": fake_cfg()}
    cfg = {"cells": [{"name": "c1", "prompt": "random", "input_len": 16, "concurrency": 1}], "repeats": 2,
           "waves": 1, "output_len": 4, "accept_unverifiable_clock": True, "max_starts": 3, "repeat_s": None}
    lp, pp, sp = bracket_inputs(tmp_path, arms)
    artifacts.write_json(pp["a"], {"schema": "pairaudit.preflight/v1", "verdict": "FAIL", "failed_probe": "chat"})
    docs = speed_stage.speed_stage(
        launch_paths=lp, preflight_paths=pp, spec_paths=sp, speed=speed_bracket.resolve(cfg), audit="sweep",
        candidates=["a", "b"], out_paths={c: str(tmp_path / f"{c}.json") for c in "ab"},
        streams_path=str(tmp_path / "streams.jsonl"), archive_path=str(tmp_path / "archive.jsonl"),
        server_logs={"s1": str(tmp_path / "logs/speed-s1-control.log")})
    assert docs["a"]["not_run"] == "the a preflight is FAIL at probe 'chat'"
    # b runs alone: C b C, win2-v4's own bracket
    assert [s["arm"] for s in docs["b"]["starts"]] == ["control", "b", "control"]
    assert docs["b"]["gate"]["sweep"]["pooled_control_starts"] == []
    # with the control's rehearsal failed, nothing is measured for anyone
    artifacts.write_json(pp["control"], {"schema": "pairaudit.preflight/v1", "verdict": "FAIL",
                                         "failed_probe": "models"})
    docs = speed_stage.speed_stage(
        launch_paths=lp, preflight_paths=pp, spec_paths=sp, speed=speed_bracket.resolve(cfg), audit="sweep",
        candidates=["a", "b"], out_paths={c: str(tmp_path / f"{c}.json") for c in "ab"},
        streams_path=str(tmp_path / "streams.jsonl"), archive_path=str(tmp_path / "archive.jsonl"),
        server_logs={"s1": str(tmp_path / "logs/speed-s1-control.log")})
    assert docs["b"]["not_run"].startswith("the control preflight is FAIL") and "starts" not in docs["b"]
    with pytest.raises(ValueError, match="one decision per candidate"):
        speed_stage.speed_stage(
            launch_paths=lp, preflight_paths=pp, spec_paths=sp, speed=speed_bracket.resolve(cfg), audit="sweep",
            candidates=["a", "b"], out_paths={"a": str(tmp_path / "a.json")},
            streams_path=str(tmp_path / "streams.jsonl"), archive_path=str(tmp_path / "archive.jsonl"),
            server_logs={"s1": str(tmp_path / "s1.log")})


def test_the_rule_script_reads_one_input_set_per_arm_and_writes_one_decision_per_candidate(tmp_path):
    """scripts/speed.py as Snakemake runs it: the sweep's keys (spec_<arm>, decision_<candidate>, candidates)."""
    import runpy
    from types import SimpleNamespace

    from snakemake.iocontainers import Namedlist

    arms = {"control": fake_cfg(), "a": fake_cfg(), "b": fake_cfg()}
    lp, pp, sp = bracket_inputs(tmp_path, arms)
    cfg = {"cells": [{"name": "c1", "prompt": "random", "input_len": 16, "concurrency": 1}], "repeats": 2,
           "waves": 1, "output_len": 4, "accept_unverifiable_clock": True, "max_starts": 3, "repeat_s": None}
    inputs = {f"{kind}_{a}": paths[a] for a in arms for kind, paths in (("spec", sp), ("launch", lp),
                                                                          ("preflight", pp))}
    outputs = {"decision_a": str(tmp_path / "a/decision.json"), "decision_b": str(tmp_path / "b/decision.json"),
               "streams": str(tmp_path / "streams.jsonl")}
    params = SimpleNamespace(speed=speed_bracket.resolve(cfg).to_json(), audit="sweep", candidates=["a", "b"],
                             archive=str(tmp_path / "archive.jsonl"), starts_log=str(tmp_path / "starts.jsonl"),
                             server_logs={"s1": str(tmp_path / "logs/speed-s1-control.log")})
    snakemake = SimpleNamespace(input=Namedlist(fromdict=inputs), output=Namedlist(fromdict=outputs), params=params,
                                log=[str(tmp_path / "speed.log")], scriptdir=str(ROOT / "scripts"))
    runpy.run_path(str(ROOT / "scripts/speed.py"), init_globals={"snakemake": snakemake}, run_name="__main__")
    for c in ("a", "b"):
        doc = artifacts.read_json(tmp_path / f"{c}/decision.json")
        assert doc["sweep"]["candidate"] == c and doc["sweep"]["arms"] == ["control", "a", "control", "b", "control"]
    assert (tmp_path / "logs/speed-s2-a.log").stat().st_size > 0   # each start's server log beside the first


@pytest.mark.server
@pytest.mark.timed
def test_two_candidates_share_the_control_starts_on_the_reference_server(tmp_path):
    """C, ngram, C, slow, C on the real reference server: the planted step delay is a LOSS, each candidate is
    compared to its own neighbouring control starts and pools the other one into its variance."""
    from test_speed import _arm

    from pairaudit.speed import archive as speedarchive

    slow = _arm(0)
    # 1 s after every engine step. A window of one degree of freedom is wide: on a loaded CI machine
    # (2 cores, two test workers) the control starts differed enough to give a half-width of 117 % on the
    # log scale, while the step itself slowed to a large part of 200 ms, so a 200 ms delay left the
    # candidate at only 0.3-0.7 of the control's rate and the verdict INCONCLUSIVE. At 1 s the rate falls
    # below a fifth of the control's even with 200 ms steps (a log gain under -160 %).
    slow["env"] = {**slow["env"], "PAIRAUDIT_REF_STEP_DELAY_US": "1000000"}
    arms = {"control": _arm(0), "ngram": _arm(4), "slow": slow}
    n = 16
    cfg = {"cells": [{"name": "rep-c1", "prompt": "repetitive", "input_len": 40, "concurrency": 1}],
           "repeats": 2, "waves": 1, "output_len": n, "accept_unverifiable_clock": True, "max_starts": 3,
           "repeat_s": None}
    docs = sweep_run(tmp_path, cfg, ["ngram", "slow"], bracket_inputs(tmp_path, arms))
    saved = {c: artifacts.check_schema(artifacts.read_json(tmp_path / f"speed/{c}/decision.json"),
                                       contracts.SPEED_DECISION_SCHEMA, c) for c in ("ngram", "slow")}
    assert saved == docs
    order = [("s1", "control"), ("s2", "ngram"), ("s3", "control"), ("s4", "slow"), ("s5", "control")]
    for doc in saved.values():
        assert [(s["start"], s["arm"]) for s in doc["starts"]] == order
        assert doc["sweep"]["arms"] == [a for _, a in order] and doc["gate"]["rule"] == "win2-v5"
    pids = [s["server"]["pid"] for s in saved["slow"]["starts"]]
    assert len(set(pids)) == 5 and all(s["server"]["identity_check"]["ok"] for s in saved["slow"]["starts"])
    # each candidate against its neighbouring controls; the bracket's third control joins its variance
    g_slow, g_ngram = saved["slow"]["gate"], saved["ngram"]["gate"]
    assert g_slow["sweep"]["windows"] == [["s3", "s4", "s5"]] and g_slow["sweep"]["pooled_control_starts"] == ["s1"]
    assert g_ngram["sweep"]["windows"] == [["s1", "s2", "s3"]] and g_ngram["sweep"]["pooled_control_starts"] == ["s5"]
    # the planted delay: far slower than either neighbouring control, and the gate says LOSS
    rate = {st: np.mean([r["pooled_rate_tps"] for r in saved["slow"]["pooled"]["rep-c1"][st]])
            for st in ("s3", "s4", "s5")}
    assert rate["s4"] < 0.7 * min(rate["s3"], rate["s5"])
    assert g_slow["pooled_gain_pct"] < -50 and g_slow["verdict"] in ("LOSS", "INCONCLUSIVE"), g_slow["reasons"]
    # One window has one degree of freedom: its start-to-start noise is the two neighbouring control
    # starts' difference alone, and the LOSS test at 2.5 % takes t(1 df) = 12.7 standard errors, about
    # 15 start-to-start standard deviations. Quiet, that deviation is 1-9 % against a gain near -300 %
    # on the log scale, and the window decides LOSS (asserted below); on a loaded 2-core machine one
    # control start once ran at under half the other's rate (a 146 % half-width), and no rule at the
    # registered rates can decide from that window: INCONCLUSIVE is then the right answer, with the
    # starts that would resolve it in its reasons (max_starts 3 keeps this test short).
    if g_slow["noise"]["start_sd_pct"] <= 10:
        assert g_slow["verdict"] == "LOSS", g_slow["reasons"]
    else:
        # win2-v5 splits alpha_loss only over the metrics that can move (accepted_per_round is 0 without
        # speculation), so it may still decide LOSS from a noisy window; if not, it says why
        assert g_slow["verdict"] == "LOSS" or "too noisy to decide" in g_slow["reasons"][0], g_slow["reasons"]
    assert g_ngram["verdict"] != "LOSS", g_ngram["reasons"]
    # speculation shows in the ngram candidate's start only
    for st, arm in order:
        drafts = [r["drafts"] for r in saved["ngram"]["pooled"]["rep-c1"][st]]
        assert all(d > 0 for d in drafts) if arm == "ngram" else drafts == [0, 0]
    # the verdicts follow from the stored series, the bracket's arms and the evidence
    for c, doc in saved.items():
        again = gates.win2_v5(doc["series"], primary="pooled_rate_tps", guards=["accepted_per_round", "decode_tps"],
                              reported=["ms_per_round", "ttft_s"], lower_is_better=["ms_per_round", "ttft_s"],
                              max_starts=3, evidence=doc["evidence"], arms=doc["sweep"]["arms"], candidate=c)
        assert again["verdict"] == doc["gate"]["verdict"]
        assert doc["looks"][0]["windows"] == 1 and len(doc["looks"]) == 1
    # one streams file for the bracket; the control starts archived once, under one window
    _, recs = artifacts.read_jsonl(tmp_path / "speed/streams.jsonl")
    assert sorted({r["start"] for r in recs}) == ["s1", "s2", "s3", "s4", "s5"]
    lines = speedarchive.read_archive(tmp_path / "archive.jsonl")
    assert sorted(r["start"] for r in lines) == ["s1", "s3", "s5"] and len({r["window"] for r in lines}) == 1
    assert saved["slow"]["window"] == saved["ngram"]["window"] == lines[0]["window"]
