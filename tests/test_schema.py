"""Every default lives in config/schema.yaml; the library fills a section from it."""

from __future__ import annotations

import yaml

from pairaudit.core import defaults
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
