"""`pairaudit size --speed`: the starts (and minutes) a win2-v5 bracket needs to decide +-3 %, from a finished
bracket's record or a given start-to-start sd, by the rule's own sizing."""

from __future__ import annotations

import json

import numpy as np

from pairaudit import gates
from pairaudit.cli import main
from pairaudit.core import artifacts

V5 = gates.WIN2_V5


def _size(sd: float, ev_df: int = 0, max_starts: int = 31, cell_sds: tuple[float, ...] = ()) -> int:
    return int(gates.win2_v5_size(sd ** 2, ev_df, pilot=gates.speed.pilot_of(V5["pilot_starts"], max_starts),
                                  max_looks=V5["max_looks"], win_pct=V5["win_pct"], alpha_win=V5["alpha_win"],
                                  alpha_loss=V5["alpha_loss"], alpha_futility=V5["alpha_futility"],
                                  loss_pooled_share=V5["loss_pooled_share"], power=V5["power"],
                                  power_gain_pct=V5["power_gain_pct"],
                                  cell_var=np.array([[v ** 2 for v in cell_sds]]) if cell_sds else None)[0])


def test_from_a_given_sd(capsys):
    assert main(["size", "--speed", "--start-sd", "1.5", "--start-s", "30", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["starts_needed"] == _size(1.5) and out["minutes"] == out["starts_needed"] * 30 / 60
    assert out["fits"] is (out["starts_needed"] <= out["max_starts"])


def test_from_a_finished_bracket_with_its_start_cost_and_evidence(tmp_path, capsys):
    doc = {"params": {"max_starts": 9},
           "gate": {"noise": {"start_sd_used_pct": 2.2, "evidence_df": 12}},
           "starts": [{"started_at": f"2026-12-06T10:00:{10 * k:02d}+00:00",
                       "stopped_at": f"2026-12-06T10:00:{10 * k + 8:02d}+00:00"} for k in range(3)]}
    path = tmp_path / "decision.json"
    artifacts.write_json(path, doc)
    assert main(["size", "--speed", "--decision", str(path)]) == 0
    text = capsys.readouterr().out
    need = _size(2.2, 12, 9)
    assert need > 9
    assert f"about {need} starts, about {need * 8 / 60:.0f} min at 8 s a start" in text
    assert "max_starts 9 is fewer" in text and f"speed.max_starts to {need}" in text


def test_bad_input_is_refused_by_name(tmp_path, capsys):
    assert main(["size", "--speed", "--start-sd", "150"]) == 2
    assert "--start-sd must be in (0, 100)" in capsys.readouterr().err
    bad = tmp_path / "d.json"
    artifacts.write_json(bad, {})
    assert main(["size", "--speed", "--decision", str(bad)]) == 2
    assert "no start-to-start noise recorded" in capsys.readouterr().err
    forged = tmp_path / "f.json"
    forged.write_text(json.dumps({"gate": {"noise": {"start_sd_used_pct": 1.0}}}))
    assert main(["size", "--speed", "--decision", str(forged)]) == 2
    assert "carries no content_sha256" in capsys.readouterr().err


def test_two_deciding_cells_size_for_the_weakest_not_the_pooled_gain(tmp_path, capsys):
    # WIN needs every deciding cell above the bar: two cells at 2.0 % each, pooled to 1.5 %, need more
    # starts than the pooled sd alone says; a non-deciding cell does not count
    cells = {"short": {"decides": True, "primary": {"start_sd_pct": 2.0}},
             "long": {"decides": True, "primary": {"start_sd_pct": 2.0}},
             "info": {"decides": False, "primary": {"start_sd_pct": 9.0}}}
    path = tmp_path / "decision.json"
    artifacts.write_json(path, {"params": {"max_starts": 61},
                                "gate": {"noise": {"start_sd_used_pct": 1.5, "evidence_df": 0}, "cells": cells}})
    assert main(["size", "--speed", "--decision", str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["cell_start_sd_pct"] == [2.0, 2.0]
    assert out["starts_needed"] == _size(1.5, 0, 61, (2.0, 2.0)) > _size(1.5, 0, 61)
