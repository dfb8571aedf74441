"""A decision re-derived from a chain built on disk (tests/decision_chain.py): no server, no workflow.

The same code that decided re-derives every gate exactly (so a difference is a refusal, never a
wording note), under the registered default speed rule as under the selectable one; what each
refusal names. The real audit's chain: tests/test_verify.py.
"""

import json

import pytest
from decision_chain import speed_doc, write_chain

from pairaudit import gates
from pairaudit.core import artifacts
from pairaudit.core.artifacts import CONTENT_KEY, content_sha256_doc, read_json, sha256_file
from pairaudit.promotion import decision as decision_mod
from pairaudit.promotion import verify


def reseal(path, doc):
    body = {k: v for k, v in doc.items() if k != CONTENT_KEY}
    body[CONTENT_KEY] = content_sha256_doc(json.loads(json.dumps(body)))
    path.write_text(json.dumps(body, indent=1))


@pytest.mark.parametrize("rule", [gates.rules_of("speed")[0], "win2-v1"])
def test_the_same_code_re_derives_every_gate_exactly(tmp_path, rule):
    root = tmp_path / "results" / "a"
    doc = write_chain(root, speed=speed_doc(rule=rule))
    path = root / "promotion" / "decision.json"
    v = verify.verify(path, artifacts.read_json(path))
    # nothing differs, not even a word (a note that only says other code made it: the tree is edited meanwhile)
    assert [n for n in v.notes if not n.startswith("made by code")] == []
    assert "speed" in v.gates and any(s.startswith("speed (") for s in v.stage_gates)
    assert len(v.consumed) == len(doc["provenance"]["consumed"])
    assert read_json(root / "speed" / "decision.json")["gate"]["rule"] == rule


def test_a_resealed_gate_and_word_are_refused_naming_the_gate(tmp_path):
    root = tmp_path / "results" / "a"
    doc = write_chain(root)
    path = root / "promotion" / "decision.json"
    assert doc["decision"] == "PROMOTE"
    forged = json.loads(json.dumps(doc))
    forged["gates"]["boundary"]["reasons"] = ["all 3 candidate cases correct with natural EOS (rewritten)"]
    reseal(path, forged)
    with pytest.raises(verify.VerificationError, match="gate boundary does not follow from .*boundary/gate.json"
                                                       " at reasons") as e:
        verify.verify(path, artifacts.read_json(path))
    assert e.value.gate == "boundary"
    # a gate left out (with the word it kept) is named too
    forged = json.loads(json.dumps(doc))
    forged["gates"].pop("determinism:mbpp")
    forged["deciding_gates"].remove("determinism:mbpp")
    reseal(path, forged)
    decision_mod.check_decision_word(forged)      # its own word check cannot see a gate that is not there
    with pytest.raises(verify.VerificationError, match="gate determinism:mbpp follows from .* but the decision "
                                                       "leaves it out"):
        verify.verify(path, artifacts.read_json(path))


def reseal_upstream(root, artifact, doc):
    """An input rewritten with a valid self-hash, and the decision resealed to consume it as it now is: only the
    verification's re-derivation can catch the edit. Returns the decision's path."""
    reseal(artifact, doc)
    path = root / "promotion" / "decision.json"
    d = read_json(path)
    d["provenance"]["consumed"][str(artifact)] = sha256_file(artifact)
    reseal(path, d)
    return path


def test_a_rewritten_boundary_gate_is_refused_by_its_own_cases(tmp_path):
    root = tmp_path / "results" / "a"
    write_chain(root)
    bp = root / "boundary" / "gate.json"
    b = read_json(bp)
    b["cases"][1]["candidate"]["correct"] = False      # a case the candidate failed ...
    path = reseal_upstream(root, bp, b)                # ... under a gate that still says PASS
    with pytest.raises(verify.VerificationError, match=f"{bp}: gate boundary states verdict 'PASS', but its "
                                                       "recorded evidence under boundary-v1 gives 'FAIL'"):
        verify.verify(path, artifacts.read_json(path))


def test_a_measured_speed_gate_without_its_starts_is_refused(tmp_path):
    root = tmp_path / "results" / "a"
    write_chain(root)
    sp = root / "speed" / "decision.json"
    s = read_json(sp)
    del s["pooled"]
    path = reseal_upstream(root, sp, s)
    with pytest.raises(verify.VerificationError, match="records no pooled to re-derive it from"):
        verify.verify(path, artifacts.read_json(path))
