"""``pairaudit verdict`` re-derives a decision from what it consumed (pairaudit.promotion.verify).

On a copy of the tiny audit's results (conftest.tiny_audit, never edited in place): the decision
verifies at both levels; a decision whose gates and word are rewritten together and re-sealed with
the project's own content hash -- which the decision's own consistency check accepts -- is refused,
naming the gate; a speed decision rewritten with it is refused by its own recorded starts; and a
chain re-sealed from the answers up is refused only by ``--deep``, which assembles the answers
again from their journal.
"""

import json
import shutil
from pathlib import Path

import pytest

from pairaudit.cli import main
from pairaudit.cli.codes import EXIT, REFUSED
from pairaudit.cli.verdict import load
from pairaudit.core import artifacts
from pairaudit.core.artifacts import CONTENT_KEY, content_sha256_doc, content_sha256_table, read_json, sha256_file
from pairaudit.promotion import decision as decision_mod

pytestmark = pytest.mark.workflow

# the verdict word that passes each gate family (its registered rule's vocabulary, gates/common.py)
PASSING = {"quality": "PASS", "grid_tie": "PASS", "determinism": "PASS", "boundary": "PASS", "speed": "WIN",
           "servers": "PASS", "preflight": "PASS"}


@pytest.fixture
def copy(tiny_audit, tmp_path):
    """A copy of the tiny audit's project results: results/tiny under a fresh directory."""
    project, config = tiny_audit
    dst = tmp_path / "project"
    shutil.copytree(project / "results", dst / "results")
    return dst / "results" / config["audit"]


def reseal_json(path: Path, doc: dict) -> None:
    """Write ``doc`` sealed by hand with the project's own content hash function (as a forger would)."""
    body = {k: v for k, v in doc.items() if k != CONTENT_KEY}
    body[CONTENT_KEY] = content_sha256_doc(json.loads(json.dumps(body)))
    path.write_text(json.dumps(body, indent=1))


def reseal_jsonl(path: Path, header: dict, records: list[dict]) -> None:
    head = {k: v for k, v in header.items() if k not in ("kind", CONTENT_KEY)}
    head[CONTENT_KEY] = content_sha256_table(head, records)
    lines = [json.dumps({"kind": "header", **head})] + [json.dumps({"kind": "record", **r}) for r in records]
    path.write_text("\n".join(lines) + "\n")


def rehash_consumers(project: Path, changed: set[Path]) -> None:
    """Re-seal every artifact that consumed a changed file with its new hash, up to the decision (a full forgery)."""
    results = project / "results"
    while changed:
        now: set[Path] = set()
        for p in artifacts.artifact_paths(results / "tiny"):
            if p.suffix == ".jsonl":
                header, records = artifacts.read_jsonl(p)
                doc = header
            else:
                doc = read_json(p)
            consumed = (doc.get("provenance") or {}).get("consumed") or {}
            hit = [k for k in consumed if (project / k).resolve() in {c.resolve() for c in changed}]
            if not hit:
                continue
            for k in hit:
                consumed[k] = sha256_file(project / k)
            if p.suffix == ".jsonl":
                reseal_jsonl(p, doc, records)
            else:
                reseal_json(p, doc)
            now.add(p)
        changed = now


def forge_passing(doc: dict, names, *, arms_differ: bool = True) -> dict:
    """``doc`` with the gates ``names`` rewritten to pass, and every outcome, the gate verdict and the decision
    re-derived from the rewritten gates exactly as promotion-v1 would (so the word check is satisfied)."""
    forged = json.loads(json.dumps(doc))
    if arms_differ:   # the tiny audit's arms are one server: "no change under audit" would make any word INCONCLUSIVE
        forged["identical_arms"] = False
    for n in names:
        forged["gates"][n]["verdict"] = PASSING[n.split(":")[0]]
        forged["gates"][n]["informational"] = False
    derived = decision_mod.rederive(forged)
    for n, g in forged["gates"].items():
        if g is not None:
            g["outcome"] = derived["gates"][n]["outcome"]
    forged["decision"], forged["gate_verdict"] = derived["verdict"], derived["gate_verdict"]
    forged["deciding_gates"] = [n for n, g in derived["gates"].items() if g["outcome"] == derived["verdict"]]
    forged["not_evaluated"] = derived["not_evaluated"]
    return forged


def test_the_tiny_audit_verifies_at_both_levels(copy, capsys):
    doc = read_json(copy / "promotion" / "decision.json")
    code = main(["verdict", str(copy)])
    out = capsys.readouterr().out
    assert code == EXIT[doc["decision"]], out
    assert "verified (chain)" in out and "gate(s) and the decision re-derived" in out
    # every consumed artifact but the shared, append-only control archive was hash-checked
    n = len([k for k in doc["provenance"]["consumed"] if not k.endswith("control-archive.jsonl")])
    assert f"verified (chain): {n} consumed artifact(s)" in out
    assert main(["verdict", str(copy), "--deep"]) == code
    out = capsys.readouterr().out
    assert "verified (deep)" in out and "artifact(s) recomputed from the primary records" in out


def test_rewritten_and_resealed_gates_and_decision_are_refused_naming_the_gate(copy, capsys):
    """The attack: every gate short of PROMOTE rewritten to pass, the word PROMOTE, re-sealed with the project's
    own content hash. The decision's own consistency check is fooled; re-deriving from what it consumed is not."""
    path = copy / "promotion" / "decision.json"
    doc = read_json(path)
    short = [n for n, g in doc["gates"].items() if g is not None and g["outcome"] != "PROMOTE"]
    assert "speed" in doc["gates"] and doc["gates"]["speed"]["verdict"] != "WIN"
    forged = forge_passing(doc, [n for n in short if n.split(":")[0] in PASSING] + ["speed"])
    assert forged["decision"] == "PROMOTE", forged["reasons"]
    reseal_json(path, forged)
    load(path)   # its hash and its own word check hold: only the evidence can refuse it
    summary = copy / "summary.md"
    assert main(["verdict", str(copy), "--summary", str(summary)]) == REFUSED
    err = capsys.readouterr().err
    first = next(n for n in forged["gates"] if forged["gates"][n] != doc["gates"][n])
    assert f"gate {first} does not follow from" in err, err
    assert "no decision" in summary.read_text()


def test_only_the_speed_gate_rewritten_is_refused_naming_speed(copy, capsys):
    path = copy / "promotion" / "decision.json"
    doc = read_json(path)
    stated = doc["gates"]["speed"]["verdict"]
    reseal_json(path, forge_passing(doc, ["speed"], arms_differ=False))
    assert main(["verdict", str(copy)]) == REFUSED
    err = capsys.readouterr().err
    assert "gate speed does not follow from" in err and "speed/decision.json" in err, err
    assert "verdict WIN" in err and f"verdict {stated}" in err


def test_a_rewritten_speed_decision_is_refused_by_its_recorded_starts(copy, capsys):
    """The speed decision itself rewritten to WIN and re-sealed, its new hash carried into a re-sealed decision."""
    sp = copy / "speed" / "decision.json"
    sdoc = read_json(sp)
    if sdoc.get("not_run"):
        pytest.skip(f"the tiny audit's bracket was not measured: {sdoc['not_run']}")
    sdoc["gate"]["verdict"] = "WIN"
    reseal_json(sp, sdoc)
    path = copy / "promotion" / "decision.json"
    doc = forge_passing(read_json(path), ["speed"], arms_differ=False)
    key = next(k for k in doc["provenance"]["consumed"] if k.endswith("speed/decision.json"))
    doc["provenance"]["consumed"][key] = sha256_file(sp)
    reseal_json(path, doc)
    assert main(["verdict", str(copy)]) == REFUSED
    err = capsys.readouterr().err
    assert f"{sp}: gate speed states verdict 'WIN', but its recorded evidence under" in err, err


def test_a_consumed_artifact_changed_after_the_decision_is_refused_by_name(copy, capsys):
    paired = sorted((copy / "paired").glob("*.json"))[0]
    doc = read_json(paired)
    doc["bootstrap"] = None
    reseal_json(paired, doc)
    assert main(["verdict", str(copy)]) == REFUSED
    err = capsys.readouterr().err
    assert f"consumed results/tiny/paired/{paired.name} of sha256" in err and "changed after the decision" in err


def test_a_chain_resealed_from_the_answers_up_is_refused_by_deep_only(copy, capsys):
    """One answer's text rewritten in the sampled artifact, and every consumer above it re-sealed with the new
    hashes: the chain holds (its gates did not move), but the answers no longer come from their journal."""
    project = copy.parent.parent
    sampled = sorted((copy / "sampled").rglob("candidate.jsonl"))[0]
    header, records = artifacts.read_jsonl(sampled)
    records[0]["text"] = str(records[0].get("text")) + " (rewritten)"
    reseal_jsonl(sampled, header, records)
    rehash_consumers(project, {sampled})
    doc = read_json(copy / "promotion" / "decision.json")
    assert main(["verdict", str(copy)]) == EXIT[doc["decision"]]
    capsys.readouterr()
    assert main(["verdict", str(copy), "--deep"]) == REFUSED
    err = capsys.readouterr().err
    assert f"{sampled}: does not follow from the journal" in err, err


def test_a_decision_without_its_provenance_is_refused(copy, capsys):
    path = copy / "promotion" / "decision.json"
    doc = read_json(path)
    doc.pop("provenance")
    reseal_json(path, doc)
    assert main(["verdict", str(copy)]) == REFUSED
    assert "records no consumed artifacts" in capsys.readouterr().err
