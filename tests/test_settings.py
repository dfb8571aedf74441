"""Each config section resolved once at load into a frozen record; jobs read the record back, nothing again."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path

import pytest
import yaml
from snakemake.utils import validate

from pairaudit import configcheck
from pairaudit.core import defaults
from pairaudit.core.settings import (
    BoundarySettings,
    DatasetSettings,
    GreedySettings,
    GridTieSettings,
    QualitySettings,
    RulesSettings,
    SamplingSettings,
    SandboxSettings,
    ScoringSettings,
    SettingsError,
    SpeedCell,
    SpeedSettings,
)
from pairaudit.datasets import formats
from pairaudit.datasets import stage as dataset_stage
from pairaudit.plans import change
from pairaudit.speed import bracket

REPO = Path(__file__).resolve().parents[1]
RAW = yaml.safe_load(defaults.PATH.read_text())
CONFIGS = ["config/config.yaml", *sorted(str(p.relative_to(REPO)) for p in (REPO / "config/examples").glob("*.yaml"))]


def props(*path: str) -> list[str]:
    node = RAW
    for key in path:
        node = node["properties"][key]
    return list(node["properties"])


def names(cls) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


def validated(path: str) -> dict:
    """A shipped config as the Snakefile holds it: arms derived, schema defaults filled."""
    cfg = yaml.safe_load((REPO / path).read_text())  # an example replaces the workflow's config whole
    change.derive_arms(cfg)
    validate(cfg, str(defaults.PATH))
    return cfg


def test_each_record_has_exactly_its_schema_sections_keys_in_the_schemas_order():
    # the schema is the one place a section's keys and defaults are kept; to_json keeps its key order
    assert names(SpeedSettings) == props("speed")
    assert names(SpeedCell) == list(RAW["properties"]["speed"]["properties"]["cells"]["items"]["properties"])
    assert names(GreedySettings) == props("greedy")
    assert names(BoundarySettings) == props("boundary")
    assert names(RulesSettings) == props("rules")
    assert names(GridTieSettings) == props("rules", "grid_tie")
    assert names(QualitySettings) == props("rules", "quality")
    assert names(SamplingSettings) == props("sampling")
    assert names(ScoringSettings) == props("scoring")
    assert names(SandboxSettings) == props("scoring", "sandbox")


def test_an_empty_section_resolves_to_the_schemas_defaults_and_no_other():
    speed = bracket.resolve({})
    schema = RAW["properties"]["speed"]["properties"]
    assert speed.win_pct == schema["win_pct"]["default"]
    # every key but max_starts (3 under a one-bracket rule, which the default rule is not) is the schema's
    assert speed.to_json() == defaults.section("speed")
    cell_defaults = {k: v["default"] for k, v in schema["cells"]["items"]["properties"].items() if "default" in v}
    assert bracket.resolve({"cells": [{"name": "a", "prompt": "long"}]}).cells[0].to_json() == {
        "name": "a", "prompt": "long", **cell_defaults}
    assert GreedySettings.from_json(defaults.filled(None, "greedy")).to_json() == defaults.section("greedy")
    rules = RulesSettings.from_json(defaults.filled({"quality": {"margin_pct": 27.0}}, "rules"))
    assert rules.quality.margin_pct == 27.0
    assert rules.quality.level == RAW["properties"]["rules"]["properties"]["quality"]["properties"]["level"]["default"]
    assert rules.grid_tie.max_divergent == defaults.filled(None, "rules")["grid_tie"]["max_divergent"]


@pytest.mark.parametrize("path", CONFIGS)
def test_filled_is_what_the_schema_validation_fills(path):
    raw = yaml.safe_load((REPO / path).read_text())
    change.derive_arms(raw)
    full = copy.deepcopy(raw)
    validate(full, str(defaults.PATH))
    for section in ("speed", "greedy", "boundary", "rules", "scoring", "gpus", "calibration", "sampling"):
        got = defaults.filled(raw.get(section), section)
        assert got == full[section] and list(got) == list(full[section]), section


@pytest.mark.parametrize("path", CONFIGS)
def test_a_shipped_configs_records_round_trip_and_give_the_jobs_what_the_config_said(path, tmp_path):
    cfg = validated(path)
    res = configcheck.check_config(copy.deepcopy(cfg), base_dir=REPO, cache_dir=tmp_path / "cache")
    assert not res.problems and res.settings is not None
    s = res.settings
    assert GreedySettings.from_json(s.greedy.to_json()) == s.greedy
    assert s.greedy.to_json() == cfg["greedy"]
    assert RulesSettings.from_json(s.rules.to_json()) == s.rules
    # what the score jobs get and record: scoring.sandbox as validated, key order included
    scoring = ScoringSettings.from_json(cfg["scoring"])
    assert ScoringSettings.from_json(scoring.to_json()) == scoring
    assert json.dumps(scoring.sandbox.to_json()) == json.dumps(cfg["scoring"]["sandbox"])
    assert s.rules.quality.to_json() == cfg["rules"]["quality"]
    assert s.rules.grid_tie.max_divergent == cfg["rules"]["grid_tie"]["max_divergent"]
    # what the answers phase reads and records: the section as validated, key order included
    assert SamplingSettings.from_json(s.sampling.to_json()) == s.sampling
    assert json.dumps(s.sampling.to_json()) == json.dumps(cfg["sampling"])
    if cfg["speed"]["enabled"]:
        assert SpeedSettings.from_json(s.speed.to_json()) == s.speed
        assert s.speed.to_json() == bracket.resolve_config(cfg["speed"])
        # what the stage records as params: the same JSON, key order included
        assert json.dumps(s.speed.to_json()) == json.dumps(bracket.resolve_config(cfg["speed"]))
    else:
        assert s.speed is None
    if cfg["boundary"]["enabled"]:
        assert BoundarySettings.from_json(s.boundary.to_json()) == s.boundary
    else:
        assert s.boundary is None
    assert [d.name for d in s.datasets] == [d["name"] for d in cfg["datasets"]]
    for i, d in enumerate(s.datasets):
        assert DatasetSettings.from_json(json.loads(json.dumps(d.to_json()))) == d
        assert d.where == f"datasets[{i}]" and d.to_json()["entry"] == cfg["datasets"][i]
        if "hf" in cfg["datasets"][i]["source"]:
            assert d.indices is None  # chosen where the file is downloaded
        else:
            assert list(d.indices) == res.documents[d.name]["indices"]


def test_the_sandbox_limits_are_a_record_with_the_schemas_defaults_and_no_other():
    from pairaudit.quality import sandbox, scoring

    empty = scoring.sandbox_settings(None)
    assert empty.to_json() == defaults.section("scoring", "sandbox") == scoring.sandbox_settings({}).to_json()
    assert scoring.sandbox_settings(empty) is empty
    assert scoring.sandbox_settings({"memory_mb": 300}) == dataclasses.replace(empty, memory_mb=300)
    assert empty.limits == empty.to_json()   # the sandbox's keyword arguments, every one set
    with pytest.raises(SettingsError, match=r"scoring\.sandbox\.cpu_s: 1\.5 is not an integer"):
        SandboxSettings.from_json({**empty.to_json(), "cpu_s": 1.5})
    with pytest.raises(SettingsError, match=r"unknown: \['nofile'\]"):
        ScoringSettings.from_json({"sandbox": {**empty.to_json(), "nofile": 64}})
    # the sandbox's own keyword defaults (a library call with no limits) are the schema's
    for fn in (sandbox.run_tests, sandbox.run_calls, sandbox.run_python):
        kw = fn.__kwdefaults__ or {}
        assert {k: kw[k] for k in empty.limits} == empty.limits, fn.__name__


def test_records_are_frozen_all_the_way_down():
    s = bracket.resolve({"expected_clock_cap": {"governor": "performance"}})
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.win_pct = 5.0  # type: ignore[misc]
    with pytest.raises(TypeError):
        s.expected_clock_cap["governor"] = "powersave"  # type: ignore[index]
    with pytest.raises(AttributeError):
        s.guards.append("ttft_s")  # type: ignore[attr-defined]
    d = DatasetSettings(name="a", where="datasets[0]", entry={"name": "a", "select": {"indices": [1, 2]}},
                        indices=[1, 2], source_sha256=None)
    with pytest.raises(TypeError):
        d.entry["select"]["indices"] = [3]  # type: ignore[index]
    assert d.to_json()["entry"] == {"name": "a", "select": {"indices": [1, 2]}} and d.indices == (1, 2)


@pytest.mark.parametrize("edit, words", [
    (lambda j: j.pop("win_pct"), "missing: ['win_pct']"),
    (lambda j: j.update(win_pcnt=2.0), "unknown: ['win_pcnt']"),
    (lambda j: j.update(win_pct="2"), "speed.win_pct: '2' is not a number"),
    (lambda j: j["cells"][1].update(decide="yes"), "speed.cells[1].decide: 'yes' is not true or false"),
    (lambda j: j["cells"][0].pop("prompt"), "speed.cells[0]: fields differ"),
])
def test_a_record_read_back_refuses_a_field_naming_it(edit, words):
    doc = bracket.resolve({}).to_json()
    edit(doc)
    with pytest.raises(SettingsError, match=words.replace("[", r"\[").replace("]", r"\]").replace(".", r"\.")):
        SpeedSettings.from_json(doc)


def test_a_dataset_record_read_back_refuses_a_renamed_or_mistyped_field():
    good = {"name": "a", "where": "datasets[0]", "entry": {"name": "a"}, "indices": [0], "source_sha256": None}
    with pytest.raises(SettingsError, match="unknown: \\['index'\\]"):
        DatasetSettings.from_json({**{k: v for k, v in good.items() if k != "indices"}, "index": [0]})
    with pytest.raises(SettingsError, match="dataset.indices: \\[-1\\] is not a list of item indices"):
        DatasetSettings.from_json({**good, "indices": [-1]})
    with pytest.raises(SettingsError, match="dataset.name: 'b' is not its entry's name 'a'"):
        DatasetSettings.from_json({**good, "name": "b"})


GENERATED = {"name": "arith", "format": "gsm8k", "source": {"generated": {"kind": "arith", "n": 50, "seed": 7}},
             "select": {"count": 8, "seed": 1}, "prompt_template": "brief"}


def resolved(entry: dict, tmp_path: Path) -> tuple[DatasetSettings, dict | None]:
    doc = formats.check_dataset(entry, cache_dir=tmp_path / "cache", base_dir=tmp_path, where="datasets[0]")
    return formats.resolve_entry(entry, doc, where="datasets[0]", base_dir=tmp_path), doc


def test_the_dataset_stage_builds_the_selection_made_at_load_and_selects_nothing(tmp_path, monkeypatch):
    record, doc = resolved(GENERATED, tmp_path)
    assert doc is not None and record.indices == tuple(doc["indices"]) and len(record.indices) == 8

    def no_selection(*a, **k):
        raise AssertionError("selected again")

    monkeypatch.setattr(formats, "select_items", no_selection)
    out = tmp_path / "ds.json"
    built = dataset_stage.dataset_stage(dataset=DatasetSettings.from_json(record.to_json()), out_path=str(out),
                                        cache_dir=str(tmp_path / "cache"), base_dir=str(tmp_path))
    assert built["indices"] == doc["indices"] and [it["index"] for it in built["items"]] == doc["indices"]
    assert built["items"] == doc["items"] and built["select"] == GENERATED["select"]
    assert built["provenance"]["params"] == {"config": GENERATED}


def test_a_local_source_that_lost_rows_since_load_is_refused_naming_the_entry(tmp_path):
    rows = [{"question": f"q{i}", "answer": f"#### {i}"} for i in range(20)]
    src = tmp_path / "rows.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    entry = {"name": "loc", "format": "gsm8k", "source": {"local": "rows.jsonl"},
             "select": {"indices": [3, 19]}, "prompt_template": "brief"}
    record, _ = resolved(entry, tmp_path)
    assert record.indices == (3, 19) and record.source_sha256 == formats.sha256_file(src)
    src.write_text("".join(json.dumps(r) + "\n" for r in rows[:10]))
    with pytest.raises(formats.DatasetError, match=r"datasets\[0\]\.source: 10 rows now"):
        formats.dataset_document(record, cache_dir=tmp_path / "cache", base_dir=tmp_path)


def test_a_hub_entry_is_selected_once_where_it_is_downloaded(tmp_path):
    entry = {"name": "hub", "format": "gsm8k", "select": {"count": 4, "seed": 1}, "prompt_template": "brief",
             "source": {"hf": {"repo": "openai/gsm8k", "revision": "e" * 40, "file": "main/test.parquet"}}}
    record, doc = resolved(entry, tmp_path)  # not in the cache: nothing selected at load
    assert doc is None and record.indices is None and record.source_sha256 is None
