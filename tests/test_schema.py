"""Every default lives in config/schema.yaml; the library fills a section from it."""

from __future__ import annotations

import yaml

from pairaudit import gates
from pairaudit.core import defaults
from pairaudit.core.settings import SamplingSettings
from pairaudit.quality import scoring
from pairaudit.serving import phase as phases
from pairaudit.speed import bracket as speed

RAW = yaml.safe_load(defaults.PATH.read_text())


def test_defaults_are_read_from_the_schema_and_are_fresh_copies():
    assert defaults.section("speed") == {k: v["default"] for k, v in RAW["properties"]["speed"]["properties"].items()}
    a, b = defaults.section("speed"), defaults.section("speed")
    a["cells"].append({"name": "x"})
    assert len(b["cells"]) == len(speed.DEFAULTS["cells"]) == 4  # a caller's edit cannot leak into the next
    assert defaults.section("scoring", "sandbox") == {"timeout_s": 10, "cpu_s": 10, "memory_mb": 512,
                                                     "fsize_mb": 16, "nproc": 64}
    assert defaults.keys("greedy") == set(defaults.section("greedy"))


def test_no_module_keeps_a_defaults_table_of_its_own():
    # the sandbox limits and the greedy settings come only from the schema
    assert not hasattr(scoring, "DEFAULT_SANDBOX_LIMITS") and not hasattr(phases, "GREEDY_DEFAULTS")
    assert speed.resolve_config({})["output_len"] == RAW["properties"]["speed"]["properties"]["output_len"]["default"]


# Where the schema keeps each gate's parameters and the key that selects its rule (None: no config selects it).
RULE_SECTIONS = {"speed": (("speed",), "rule"), "quality": (("rules", "quality"), "rule"),
                 "grid_tie": (("rules", "grid_tie"), None)}


def _props(path):
    node = RAW
    for key in path:
        node = node["properties"][key]
    return node["properties"]


def test_each_schema_default_is_the_registered_value_it_stands_for():
    pinned = set()
    for decides, (path, _) in RULE_SECTIONS.items():
        props = _props(path)
        for name in gates.rules_of(decides):
            for key, registered in gates.REGISTERED[name].params.items():
                if key in props:
                    assert props[key].get("default") == registered, (
                        f"{'.'.join(path)}.{key}: the schema's default {props[key].get('default')!r} is not "
                        f"{name}'s registered {registered!r}")
                    pinned.add(f"{'.'.join(path)}.{key}")
    # every parameter a config may set for a registered rule was compared, none skipped by a rename
    assert pinned == {"speed.win_pct", "speed.start_noise_pct", "rules.quality.margin_pct", "rules.quality.level",
                      "rules.quality.max_net_loss", "rules.quality.alpha", "rules.grid_tie.max_divergent"}


def test_each_schema_list_of_rule_names_is_the_registry_default_first():
    for decides, (path, key) in RULE_SECTIONS.items():
        if key is None:
            continue
        prop = _props(path)[key]
        assert prop["enum"] == list(gates.rules_of(decides)), f"{'.'.join(path)}.{key}"
        assert prop["default"] == gates.rules_of(decides)[0]
    # no other rule name is listed anywhere in the schema: the registry's families are the only vocabulary
    named = {r for text in [defaults.PATH.read_text()] for r in gates.REGISTERED if f"enum: [{r}" in text}
    assert named == {gates.rules_of("speed")[0], gates.rules_of("quality")[0]}


def test_the_default_rules_registered_values_are_the_schemas_defaults():
    # what a config that sets nothing runs: the default rule of each gate at its own registered values
    for decides, (path, key) in RULE_SECTIONS.items():
        props, default = _props(path), gates.default_rule(decides)
        if key is not None:
            assert props[key]["default"] == default.name
        for param, registered in default.params.items():
            if param in props:
                assert props[param]["default"] == registered, f"{'.'.join(path)}.{param} vs {default.name}"
    assert {p for p in gates.default_rule("speed").params if p in _props(("speed",))} == {"win_pct", "start_noise_pct"}
    assert {p for p in gates.default_rule("quality").params
            if p in _props(("rules", "quality"))} == {"margin_pct", "level", "alpha"}


def test_the_pair_commands_rules_and_defaults_are_the_registrys():
    import argparse

    from pairaudit.cli import pair

    p = argparse.ArgumentParser()
    pair.add_arguments(p)
    acts = {a.dest: a for a in p._actions}
    assert tuple(acts["rule"].choices) == gates.QUALITY_RULES
    assert acts["rule"].default == gates.default_rule("quality").name
    # a parameter the command sets by default is at its registered value: no deviation unless asked for
    assert acts["alpha"].default == gates.QUALITY_V2["alpha"] == gates.QUALITY_V1["alpha"]
    assert acts["max_net_loss"].default == gates.QUALITY_V1["max_net_loss"]
    assert acts["margin"].default is None and acts["level"].default is None   # the rule's own, unless given
    assert f"(registered {gates.QUALITY_V2['margin_pct']:g})" in acts["margin"].help


def test_the_sampling_section_keeps_its_defaults_in_the_schema():
    # the answers phase reads them from the record, never a default of its own
    filled = defaults.filled({"api": "chat", "base_seed": 1, "temperature": 0.7, "top_p": 0.8, "top_k": 20,
                              "min_p": 0.0, "max_tokens": 16, "concurrency": 2}, "sampling")
    assert filled["request_timeout_s"] == 900 and filled["chat_template_kwargs"] == {}
    assert SamplingSettings.from_json(filled).to_json() == filled
