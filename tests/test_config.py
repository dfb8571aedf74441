"""Every shipped config under config/ is one the workflow accepts.

Three kinds of YAML live there:

* ``config/config.yaml``: the embedded default (the Snakefile's configfile);
* overlays, ``config/*.yaml`` other than config.yaml and schema.yaml: used as
  ``--configfile X`` and merged over the default the way Snakemake does it
  (``snakemake.utils.update_config``: mappings recursively, lists whole);
* complete examples, ``config/examples/*.yaml``: used with
  ``--configfile X --replace-workflow-config``, i.e. on their own.

Each resulting config must pass the schema the Snakefile validates against,
every arm must resolve with ``pairaudit.launch.resolve_spec``, and every
dataset entry must pass the ``pairaudit.datasets`` checks that need no
network.  Nothing here downloads anything: hub sources are checked against a
pre-seeded cache and ``requests.get`` is made to fail.
"""

import copy
import hashlib
from pathlib import Path

import pytest
import yaml
from snakemake.utils import update_config, validate
from snakemake_interface_common.exceptions import WorkflowError

from pairaudit import datasets as ds
from pairaudit import suites
from pairaudit.launch import ConfigError, SWITCH_PREFIX, resolve_spec

ROOT = Path(__file__).resolve().parents[1]
CONFIG_DIR = ROOT / "config"
SCHEMA = CONFIG_DIR / "schema.yaml"
DEFAULT = CONFIG_DIR / "config.yaml"
OVERLAYS = sorted(p for p in CONFIG_DIR.glob("*.yaml") if p.name not in ("config.yaml", "schema.yaml"))
EXAMPLES = sorted((CONFIG_DIR / "examples").glob("*.yaml"))
ARMS = ("control", "candidate")

# Rows of the hub files the shipped configs pin (from the provenance cited in
# config/hub-datasets.yaml), so a select count can be checked offline.
HUB_ROWS = {
    ("openai/gsm8k", "main/test-00000-of-00001.parquet"): 1319,
    ("HuggingFaceH4/MATH-500", "test.jsonl"): 500,
    ("google-research-datasets/mbpp", "sanitized/test-00000-of-00001.parquet"): 257,
}
# A byte-identical local copy of the pinned MATH-500 file, when this machine has one.
LOCAL_MATH500 = Path("/work/shared/datasets/math500/test.jsonl")


def load(path: Path) -> dict:
    with open(path, encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def merged(overlay: Path) -> dict:
    cfg = load(DEFAULT)
    update_config(cfg, load(overlay))
    return cfg


def all_configs() -> dict[str, dict]:
    out = {"config.yaml": load(DEFAULT)}
    for p in OVERLAYS:
        out[f"config.yaml + {p.name}"] = merged(p)
    for p in EXAMPLES:
        out[f"examples/{p.name}"] = load(p)
    return out


CONFIGS = all_configs()
NAMES = sorted(CONFIGS)


def schema_validate(cfg: dict) -> None:
    # validate() fills schema defaults in place: never let it touch the originals.
    validate(copy.deepcopy(cfg), str(SCHEMA))


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    import requests

    def refuse(*args, **kwargs):
        raise AssertionError(f"test_config must not touch the network: requests.get{args}")

    monkeypatch.setattr(requests, "get", refuse)


def test_every_config_file_is_covered():
    assert DEFAULT.is_file() and SCHEMA.is_file()
    assert OVERLAYS, "expected at least one overlay (config/hub-datasets.yaml)"
    assert EXAMPLES, "expected example configs under config/examples/"
    assert len(CONFIGS) == 1 + len(OVERLAYS) + len(EXAMPLES)


# ---------------------------------------------------------------- schema

@pytest.mark.parametrize("name", NAMES)
def test_validates_against_schema(name):
    schema_validate(CONFIGS[name])


@pytest.mark.parametrize("overlay", OVERLAYS, ids=lambda p: p.name)
def test_overlay_replaces_only_datasets(overlay):
    raw = load(overlay)
    assert set(raw) == {"datasets"}, f"{overlay.name} must set only `datasets:`"
    cfg, default = merged(overlay), load(DEFAULT)
    assert cfg["datasets"] == raw["datasets"]  # a list is replaced whole, never appended to
    assert {k: v for k, v in cfg.items() if k != "datasets"} == \
           {k: v for k, v in default.items() if k != "datasets"}


# Examples that run offline on this machine keep the embedded default's datasets.
OFFLINE_EXAMPLES = ("vllm-cpu.yaml",)


# The planted-defect examples (fault-*.yaml) run the embedded default's own suites instead.
@pytest.mark.parametrize("example", [p for p in EXAMPLES if not p.name.startswith("fault-")], ids=lambda p: p.name)
def test_example_is_complete_and_shares_the_hub_datasets(example):
    cfg = load(example)
    assert {"audit", "arms", "datasets", "sampling", "scoring", "rules"} <= set(cfg)
    if example.name in OFFLINE_EXAMPLES:
        assert cfg["datasets"] == load(DEFAULT)["datasets"], f"{example.name}: datasets differ from config.yaml"
        return
    hub = load(CONFIG_DIR / "hub-datasets.yaml")["datasets"]
    assert cfg["datasets"] == hub, f"{example.name}: datasets differ from config/hub-datasets.yaml"


@pytest.mark.parametrize("example", [p for p in EXAMPLES if p.name.startswith("fault-")], ids=lambda p: p.name)
def test_a_planted_defect_changes_only_the_candidates_fault_switch(example):
    cfg, default = load(example), load(DEFAULT)
    control, candidate = cfg["arms"]["control"], cfg["arms"]["candidate"]
    faults = {k for k in candidate["env"] if k.startswith(SWITCH_PREFIX + "FAULT_")}
    assert len(faults) == 1 and all(candidate["env"][k] != control["env"].get(k, "0") for k in faults)
    assert {k: v for k, v in candidate["env"].items() if k not in faults} == \
           {k: v for k, v in control["env"].items() if k not in faults}
    assert cfg["audit"] != default["audit"]  # its own body of evidence


def test_merging_an_example_without_replace_would_leak_default_keys():
    """Why the examples say --replace-workflow-config: Snakemake merges mappings."""
    cfg = load(DEFAULT)
    update_config(cfg, load(CONFIG_DIR / "examples" / "vllm-attach.yaml"))
    with pytest.raises(ConfigError, match="unknown key 'command' for mode attach"):
        resolve_spec("control", cfg["arms"]["control"])
    cfg = load(DEFAULT)
    update_config(cfg, load(CONFIG_DIR / "examples" / "vllm-pair.yaml"))
    assert any(k.startswith(SWITCH_PREFIX) for k in cfg["arms"]["candidate"]["env"])


# ---------------------------------------------------------------- arms

@pytest.mark.parametrize("name", NAMES)
def test_arms_resolve(name):
    cfg = CONFIGS[name]
    specs = {arm: resolve_spec(arm, cfg["arms"][arm]) for arm in ARMS}
    for arm, spec in specs.items():
        if spec["mode"] == "launch":
            assert "{port}" in spec["command"], f"{name}: arms.{arm}.command never uses {{port}}"
            # the model is passed by name, or as the directory {model_dir} resolves it to
            assert spec["model"] in spec["command"] or "{model_dir}" in spec["command_identity"]
            assert spec["served_model_name"] in spec["command"] or spec["served_model_name"] == spec["model"]
        else:
            assert spec["url"].startswith(("http://", "https://"))
    # Paired arms serve the same model under the same id and context length.
    for key in ("model", "served_model_name", "max_model_len"):
        assert specs["control"][key] == specs["candidate"][key], f"{name}: arms differ in {key}"


# attach arms carry no env (the servers' owner sets the switches), so only launch configs apply
LAUNCH_NAMES = [n for n in NAMES if CONFIGS[n]["arms"]["candidate"].get("mode", "launch") == "launch"]


@pytest.mark.parametrize("name", LAUNCH_NAMES)
def test_control_sets_every_candidate_switch_explicitly(name):
    arms = CONFIGS[name]["arms"]
    control_env = arms["control"].get("env") or {}
    missing = sorted(set(arms["candidate"].get("env") or {}) - set(control_env))
    assert not missing, f"{name}: the control leaves {missing} to a default"


def test_default_control_rolls_back_every_reference_switch():
    arms = load(DEFAULT)["arms"]
    cand = {k: str(v) for k, v in arms["candidate"]["env"].items() if k.startswith(SWITCH_PREFIX)}
    ctrl = {k: str(v) for k, v in arms["control"]["env"].items() if k.startswith(SWITCH_PREFIX)}
    assert cand, "the embedded candidate should turn on reference-server switches"
    assert set(cand) <= set(ctrl)
    assert any(ctrl[k] != v for k, v in cand.items()), "control and candidate set identical switches"


@pytest.mark.parametrize("name", NAMES)
def test_speculative_flag_matches_the_command(name):
    for arm in ARMS:
        a = CONFIGS[name]["arms"][arm]
        if a.get("mode", "launch") != "launch":
            continue
        cmd = " ".join(str(x) for x in a["command"])
        if "pairaudit.refserver" in cmd:
            has_spec = int(str((a.get("env") or {}).get("PAIRAUDIT_REF_SPEC_NGRAM", "0"))) > 0
        else:
            has_spec = "--speculative-config" in cmd or "--speculative_config" in cmd
        assert bool(a.get("speculative", False)) == has_spec, \
            f"{name}: arms.{arm}.speculative does not match its command/env"


# ---------------------------------------------------------------- datasets

def _check_hf_offline(entry: dict, where: str, tmp_path: Path) -> int | None:
    """Run the loader's own hub checks against a pre-seeded cache (no download)."""
    hf = entry["source"]["hf"]
    target = tmp_path / "hf" / hf["repo"].replace("/", "--") / hf["revision"] / hf["file"]
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(b"placeholder")
    path, prov = ds._hf_file(hf, tmp_path, entry["source"].get("sha256"), where)
    assert path == target and prov["cached"] is True
    assert prov["url"].endswith(f"/datasets/{hf['repo']}/resolve/{hf['revision']}/{hf['file']}")
    return HUB_ROWS.get((hf["repo"], hf["file"]))


@pytest.mark.parametrize("name", NAMES)
def test_dataset_entries_pass_offline_checks(name, tmp_path):
    entries = CONFIGS[name]["datasets"]
    names = [e["name"] for e in entries]
    assert len(set(names)) == len(names), f"{name}: duplicate dataset names"
    for i, entry in enumerate(entries):
        where = f"datasets[{i}]"
        fmt, template, source = entry["format"], entry["prompt_template"], entry["source"]
        assert set(entry) == {"name", "format", "source", "select", "prompt_template"}
        assert ds._NAME_RE.match(entry["name"])
        assert fmt in ds.FORMATS
        assert template in ds.TEMPLATES[fmt], f"{where}: no template {template!r} for {fmt}"
        kinds = [k for k in source if k in ds.SOURCE_KINDS]
        assert len(kinds) == 1 and set(source) <= set(ds.SOURCE_KINDS) | {"sha256"}
        if "sha256" in source:
            assert ds._SHA256_RE.match(source["sha256"])
        if kinds == ["hf"]:
            assert ds._SHA_RE.match(source["hf"]["revision"]), f"{where}: revision is not a 40-hex commit"
            rows = _check_hf_offline(entry, where, tmp_path / f"cache{i}")
            # The select config is well formed and fits the source's known size.
            picked = ds.select_items(list(range(rows or 10**6)), entry["select"], where=f"{where}.select")
            assert len(picked) == len(set(picked))
        else:
            # Generated and package sources need no network: build the whole document.
            if kinds == ["generated"]:
                assert suites.SUITES[source["generated"]["kind"]][0] == fmt
            doc = ds.prepare_dataset(entry, cache_dir=tmp_path / "cache", base_dir=ROOT, where=where)
            assert doc["items"] and all(item["messages"] for item in doc["items"])


@pytest.mark.skipif(not LOCAL_MATH500.is_file(), reason="no local copy of MATH-500 on this machine")
def test_math500_pin_matches_the_local_byte_identical_copy(tmp_path):
    """The pinned digest is that of OpenAI's split; prepare the entry from a seeded cache."""
    data = LOCAL_MATH500.read_bytes()
    for name in NAMES:
        for entry in CONFIGS[name]["datasets"]:
            hf = entry["source"].get("hf") or {}
            if hf.get("repo") != "HuggingFaceH4/MATH-500":
                continue
            assert entry["source"]["sha256"] == hashlib.sha256(data).hexdigest()
            target = tmp_path / name / "hf" / "HuggingFaceH4--MATH-500" / hf["revision"] / hf["file"]
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            doc = ds.prepare_dataset(entry, cache_dir=tmp_path / name, base_dir=ROOT)
            assert doc["source"]["cached"] is True and doc["source"]["rows"] == 500
            assert len(doc["items"]) == entry["select"]["count"]


# ---------------------------------------------------------------- rejected configs

def _hub_cfg() -> dict:
    return merged(CONFIG_DIR / "hub-datasets.yaml")


def _set(cfg: dict, path: tuple, value) -> dict:
    node = cfg
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return cfg


BAD = [
    # (id, path to change, new value, texts the error must contain)
    ("unknown-top-level-key", ("bogus_key",), 1, ["'bogus_key' was unexpected"]),
    ("unknown-arm-key", ("arms", "control", "gpu_count"), 4, ["'gpu_count' was unexpected", "control"]),
    ("unknown-dataset-key", ("datasets", 0, "split"), "test", ["'split' was unexpected", "datasets"]),
    ("unknown-sampling-key", ("sampling", "temprature"), 0.7, ["'temprature' was unexpected", "sampling"]),
    ("bad-format", ("datasets", 0, "format"), "gsm9k", ["'gsm9k' is not one of", "format"]),
    ("bad-mode", ("arms", "candidate", "mode"), "spawn", ["'spawn' is not one of", "mode"]),
    ("revision-branch", ("datasets", 0, "source", "hf", "revision"), "main",
     ["'main' does not match", "revision"]),
    ("revision-39-hex", ("datasets", 1, "source", "hf", "revision"), "6e4ed1a2a79af7d8630a6b768ec859cb5af4d3b",
     ["'6e4ed1a2a79af7d8630a6b768ec859cb5af4d3b' does not match", "revision"]),
    ("revision-uppercase", ("datasets", 2, "source", "hf", "revision"), "4BB6404FDC6CACFDA99D4AC4205087B89D32030C",
     ["'4BB6404FDC6CACFDA99D4AC4205087B89D32030C' does not match", "revision"]),
    ("sha256-short", ("datasets", 0, "source", "sha256"), "ee7b8da9", ["'ee7b8da9' does not match", "sha256"]),
    ("env-boolean", ("arms", "control", "env", "PAIRAUDIT_REF_LM_HEAD_BF16"), True,
     ["True is not of type", "PAIRAUDIT_REF_LM_HEAD_BF16"]),
]


@pytest.mark.parametrize("path,value,texts", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_schema_rejects_and_names_the_key_or_value(path, value, texts):
    cfg = _set(_hub_cfg(), path, value)
    with pytest.raises(WorkflowError) as err:
        schema_validate(cfg)
    msg = str(err.value)
    for text in texts:
        assert text in msg, f"error does not mention {text!r}:\n{msg}"


def test_loader_also_refuses_a_moving_revision(tmp_path):
    entry = copy.deepcopy(_hub_cfg()["datasets"][0])
    entry["source"]["hf"]["revision"] = "main"
    with pytest.raises(ds.DatasetError, match=r"datasets\[0\]\.hf\.revision: 'main' is not a 40-hex commit"):
        ds._hf_file(entry["source"]["hf"], tmp_path, None, "datasets[0]")
