"""Promotion stage: read every artifact, decide, write the decision, the reports, the figures, a manifest.

The decision is :mod:`pairaudit.promotion.decision`, the Markdown/HTML/RST
:mod:`pairaudit.promotion.render`, the figures :mod:`pairaudit.promotion.figures`, the ledger
:mod:`pairaudit.promotion.ledger`; this module only reads and writes.

manifest.json (``manifest``)::

    {"schema": "pairaudit.manifest/v1", "artifacts": [{"path", "sha256", "bytes"}, ...]}  # sorted by path

Every input is read through its record in :mod:`pairaudit.core.readers`
(``Paired``, ``LaunchReceipt``, ``Preflight``, ``ScoresHeader``, the later
stages' ``LATER_RECORDS``, the control archive's ``ArchivedStart``), whose ``from_json`` checks the schema id and the fields
and names the file and field it refuses; the promotion reads no other phase's
dict. Later-stage artifacts read by ``promotion_stage(later=...)``::

    later = {"divergence": [path, ...], "boundary": path, "speed": path}   # any key may be absent
    divergence: {"schema": "pairaudit.divergence/v1", "dataset": str, "items": [index, ...],
                 "divergences": [greedy.divergence_records], "grid_tie": <grid_tie_v1>,
                 "determinism": <determinism_v1> | None, ...}
                (items + divergences give the selected/compared counts, greedy.comparison_counts)
    boundary:   {"schema": "pairaudit.boundary_gate/v1", "gate": <boundary_v1>, ...}
    speed:      {"schema": "pairaudit.speed_decision/v1", "gate": <win2_v1>, ...}
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence, TypeVar

from pairaudit import gates
from pairaudit.core.artifacts import (
    ArtifactError,
    _atomic_write,
    provenance,
    read_json,
    read_jsonl,
    sha256_file,
    write_json,
)
from pairaudit.core.contracts import ARMS, MANIFEST_SCHEMA, SERVER_START_SCHEMA, arm_role, audit_path
from pairaudit.core.jsonlog import read_log
from pairaudit.core.readers import (
    AnswersPhase,
    BoundaryGateDoc,
    DivergenceDoc,
    LaunchReceipt,
    Paired,
    Preflight,
    Record,
    SpeedDecisionDoc,
)
from pairaudit.diagnostics import greedy
from pairaudit.plans.change import decision_record as change_record
from pairaudit.promotion import calibration as calib
from pairaudit.promotion.decision import boundary_evidence, decide, speed_evidence
from pairaudit.promotion.figures import (
    load_item_outcomes,
    plot_control_archive,
    plot_divergence,
    plot_not_run,
    plot_paired,
    plot_speed,
)
from pairaudit.promotion.ledger import append_ledger, earlier_decisions, ledger_entry
from pairaudit.promotion.render import (
    boundary_markdown,
    calibration_markdown,
    code_judging_markdown,
    ledger_markdown,
    markdown_html,
    render_markdown,
    speed_markdown,
    summary_rst,
    time_markdown,
)
from pairaudit.quality.split import judged_counts
from pairaudit.serving import startlog
from pairaudit.timeplan import actual as timeactual

# Each later stage's artifact, read through its record (its schema id, its fields).
LATER_RECORDS: dict[str, type[Record]] = {
    "divergence": DivergenceDoc,
    "boundary": BoundaryGateDoc,
    "speed": SpeedDecisionDoc,
    "answers": AnswersPhase,
}

R = TypeVar("R", bound=Record)


def manifest(paths: Sequence[str | os.PathLike]) -> dict:
    """sha256 and size of every artifact, sorted by path (duplicates listed once)."""
    arts = [{"path": p, "sha256": sha256_file(p), "bytes": os.path.getsize(p)}
            for p in sorted({str(p) for p in paths})]
    return {"schema": MANIFEST_SCHEMA, "artifacts": arts}


def _load_keyed(paths: Sequence[str | os.PathLike], record: type[R], key: str) -> dict[str, R]:
    """Read artifacts through their record, key them by a field; a duplicate key is an error.

    Keyed by ``arm``, an artifact is keyed by the arm's role: a sweep's candidate arm, named by its
    change, is this decision's candidate (``contracts.arm_role``).
    """
    out: dict[str, R] = {}
    for p in paths:
        doc = record.read(p)
        k = getattr(doc, key)
        if not k:
            raise ArtifactError(f"{p}: no {key!r}")
        if key == "arm":
            k = arm_role(k)
        if k in out:
            raise ArtifactError(f"{p}: a second artifact for {key} {k!r}")
        out[k] = doc
    return out


@dataclass
class LaterDocs:
    """The later stages' records as read (a stage that did not run, or a bracket not measured: None)."""
    divergence: dict[str, DivergenceDoc] | None = None
    boundary: BoundaryGateDoc | None = None
    speed: SpeedDecisionDoc | None = None          # a measured bracket only: one not measured has nothing to draw
    answers: dict[str, AnswersPhase] | None = None


def _load_later(later: Mapping[str, Any] | None) -> tuple[dict, list[str], LaterDocs]:
    """Later-stage artifacts -> decide() keywords, the paths read, and the records themselves."""
    later = dict(later or {})
    unknown = set(later) - set(LATER_RECORDS)
    if unknown:
        raise ValueError(f"unknown later stages {sorted(unknown)} (known: {sorted(LATER_RECORDS)})")
    kw: dict[str, Any] = {}
    paths: list[str] = []
    docs = LaterDocs()
    if later.get("divergence"):
        divs: dict[str, DivergenceDoc] = _load_keyed(later["divergence"], DivergenceDoc, "dataset")
        docs.divergence = divs
        kw["divergence"] = {ds: None if d.grid_tie is None else d.grid_tie.as_dict() for ds, d in divs.items()}
        # The artifact's own items and divergence records say what was compared.
        kw["divergence_counts"] = {ds: greedy.comparison_counts(d.raw["items"], d.raw["divergences"])
                                   for ds, d in divs.items() if d.items is not None}
        # Determinism is evaluated per dataset inside the divergence stage.
        kw["determinism"] = {ds: None if d.determinism is None else d.determinism.as_dict() for ds, d in divs.items()}
        paths += [str(p) for p in later["divergence"]]
    bracket_failure = None
    if later.get("boundary"):
        boundary = BoundaryGateDoc.read(later["boundary"])
        kw["boundary"] = None if boundary.gate is None else boundary.gate.as_dict()
        docs.boundary = boundary
        paths.append(str(later["boundary"]))
    if later.get("speed"):
        speed = SpeedDecisionDoc.read(later["speed"])
        kw["speed"] = None if speed.gate is None else speed.gate.as_dict()
        bracket_failure = speed.failure
        if not speed.not_run:  # a bracket not measured: its gate says why; there is nothing to draw
            docs.speed = speed
        paths.append(str(later["speed"]))
    if later.get("answers"):
        # each arm's answers phase: a server that failed under the audit is evidence (gates/server_failure.py);
        # so is one that failed under the speed bracket, where its answers phase did not
        answers: dict[str, AnswersPhase] = _load_keyed(later["answers"], AnswersPhase, "arm")
        docs.answers = answers
        per_arm = {arm: answers[arm].failure if arm in answers else None for arm in ARMS}
        failed_arm = arm_role(bracket_failure["arm"]) if bracket_failure else None
        if bracket_failure and failed_arm and per_arm.get(failed_arm) is None:
            per_arm[failed_arm] = bracket_failure
        kw["servers"] = gates.rule("server-failure-v1", "servers").apply(per_arm)
        paths += [str(p) for p in later["answers"]]
    return kw, paths, docs


def _every_input(paths: Sequence[str | os.PathLike], later: Mapping[str, Any] | None) -> list[str]:
    """``paths`` and every later stage's path(s): a stage gives one path or a list of them."""
    out = [str(p) for p in paths]
    for given in (later or {}).values():
        out += [str(given)] if isinstance(given, (str, os.PathLike)) else [str(p) for p in given or ()]
    return out


def promotion_stage(paired_paths: Sequence[str | os.PathLike], launch_paths: Sequence[str | os.PathLike],
                    preflight_paths: Sequence[str | os.PathLike], out_decision: str | os.PathLike,
                    out_report: str | os.PathLike, out_manifest: str | os.PathLike,
                    out_plot: str | os.PathLike, *, later: Mapping[str, Any] | None = None,
                    out_html: str | os.PathLike | None = None, out_summary: str | os.PathLike | None = None,
                    out_divergence_plot: str | os.PathLike | None = None,
                    out_boundary: str | os.PathLike | None = None,
                    out_speed_plot: str | os.PathLike | None = None,
                    out_archive_plot: str | os.PathLike | None = None,
                    score_paths: Sequence[str | os.PathLike] = (),
                    ledger_path: str | os.PathLike | None = None, audit: str | None = None,
                    config: Any = None, calibration: bool = False,
                    calibrations_path: str | os.PathLike | None = None,
                    out_calibration: str | os.PathLike | None = None) -> None:
    """Read every input, decide, and write decision.json, the reports, the figures and the manifest.

    The manifest is written after every other output and lists every input
    plus those outputs (it cannot hash itself). The ledger line is appended
    last, once the decision is complete; the earlier ledger lines for the
    same candidate spec are listed in the report. A stage that did not run
    (no artifact in ``later``) gets a figure and a section saying so.

    ``calibrations_path`` (results/calibrations.jsonl) is read as the ledger
    is, at decision time: the latest calibration of the same control spec on
    the same host is cited as ``calibration_ref``. ``calibration`` (an A/A
    run, pairaudit/promotion/calibration.py) also writes its summary to
    ``out_calibration``, shows it in the reports, and appends it to the log
    after the ledger line.
    """
    if calibration and not out_calibration:
        raise ValueError("a calibration decision needs out_calibration for its summary")
    # Every input's self-hash first (read_json / read_jsonl refuse an edited file by name): an edit
    # anywhere is named as an edit, before any input is read as its record and refused for a field.
    for p in _every_input([*paired_paths, *launch_paths, *preflight_paths, *score_paths], later):
        (read_jsonl if str(p).endswith(".jsonl") else read_json)(p)
    paired = _load_keyed(paired_paths, Paired, "dataset")
    launch = _load_keyed(launch_paths, LaunchReceipt, "arm")
    preflight = _load_keyed(preflight_paths, Preflight, "arm")
    later_kw, later_paths, later_docs = _load_later(later)
    archive: list[dict] = []
    speed = later_docs.speed
    archive_path = None if speed is None or speed.archive is None else speed.archive.path
    if archive_path and Path(archive_path).exists():
        archive = read_log(archive_path)
        later_paths.append(str(archive_path))  # hashed as read now: other audits keep appending to it
    items = load_item_outcomes(paired, score_paths) if score_paths else None
    judged = judged_counts(score_paths) if score_paths else {}
    inputs = [str(p) for p in (*paired_paths, *launch_paths, *preflight_paths, *score_paths)] + later_paths

    decision = decide(paired, launch, preflight, calibration=calibration, **later_kw)
    # The change form's name and switches (None for a config that states two arms), checked
    # against what the launch receipts show; a disagreement is a note, never a gate.
    decision["change"] = change_record(config, {arm: rec.raw for arm, rec in launch.items()})
    if decision["change"] and not decision["change"]["receipts_agree"]:
        decision["notes"].append(f"the config's change {decision['change']['name']!r} does not match the launch "
                                 "receipts: " + "; ".join(decision["change"]["receipt_problems"]))
    decision["evidence"] = {"boundary_cases": boundary_evidence(later_docs.boundary),
                            "speed": speed_evidence(speed)}
    decision["provenance"] = provenance(inputs, params={"rule": "promotion-v1", "calibration": calibration,
                                                        "datasets": sorted(paired), "arms": list(ARMS)})
    ref = calib.lookup(calibrations_path, launch["control"])
    decision["calibration_ref"] = None if ref is None else ref.to_json()
    summary = None
    if calibration:
        summary = calib.summarize(decision, audit=audit,
                                  of_audit=calib.calibrated_audit(config),
                                  speed_doc=speed, divergence_docs=later_docs.divergence)
    spec = launch["candidate"].spec_sha256
    earlier = earlier_decisions(read_log(ledger_path), spec) if ledger_path else []

    outputs = [str(out_decision), str(out_report), str(out_plot)]
    plot_paired(paired, out_plot, items)
    if out_divergence_plot:
        if later_docs.divergence:
            plot_divergence(later_docs.divergence, out_divergence_plot)
        else:
            plot_not_run(out_divergence_plot, "Greedy divergence", "the divergence stage produced no artifact")
        outputs.append(str(out_divergence_plot))
    if out_speed_plot:
        if speed:
            plot_speed(speed, out_speed_plot)
        else:
            plot_not_run(out_speed_plot, "Speed bracket", "no speed/decision.json: the speed gate is not evaluated")
        outputs.append(str(out_speed_plot))
    if out_archive_plot:
        if speed:
            plot_control_archive(speed, archive, out_archive_plot)
        else:
            plot_not_run(out_archive_plot, "Control archive", "the speed stage has not run, so no control start "
                                                              "was archived for this audit")
        outputs.append(str(out_archive_plot))
    write_json(out_decision, decision)
    if summary is not None and out_calibration is not None:
        write_json(out_calibration, summary)
        outputs.append(str(out_calibration))
    md = render_markdown(decision, paired, launch, preflight, calibration_summary=summary)
    # this run's plan against what its phases took (a calibration is the module's own run: no plan of its own)
    took = timeactual.for_audit(audit) if audit and not calibration else None
    # Every start of this audit so far, with why it was fresh and where its seconds went: read at report
    # time, not an input (each phase appends to the log as it starts a server).
    starts = startlog.starts_markdown(audit_path(SERVER_START_SCHEMA, audit)) if audit else []
    md += "\n" + "\n".join(calibration_markdown(summary) + ([""] if summary else [])
                           + code_judging_markdown(judged)
                           + boundary_markdown(later_docs.boundary) + [""] + speed_markdown(speed) + [""]
                           + time_markdown(took) + [""] + starts
                           + ledger_markdown(earlier, spec)) + "\n"
    _atomic_write(Path(out_report), md)
    title = f"pairaudit decision ({audit or 'audit'}): {decision['decision']}"
    if out_html:
        _atomic_write(Path(out_html), markdown_html(md, title=title, verdict=decision["decision"]))
        outputs.append(str(out_html))
    if out_boundary:
        _atomic_write(Path(out_boundary), markdown_html("\n".join(boundary_markdown(later_docs.boundary)),
                                                        title="Boundary cases"))
        outputs.append(str(out_boundary))
    if out_summary:
        _atomic_write(Path(out_summary), summary_rst(decision, earlier, summary))
        outputs.append(str(out_summary))
    write_json(out_manifest, manifest([*inputs, *outputs]))
    if ledger_path:
        append_ledger(ledger_path, ledger_entry(decision, launch, audit=audit, config=config,
                                                decision_path=str(out_decision),
                                                timing=None if took is None else took.to_json()))
    if summary is not None and calibrations_path and out_calibration is not None:
        calib.append(calibrations_path, calib.CalibrationEntry(
            time=decision["provenance"]["created_at"], audit=audit, of_audit=summary["of_audit"],
            control_spec_sha256=summary["control_spec_sha256"], host=summary["host"],
            host_sha256=summary["host_sha256"], decision=summary["decision"], headline=summary["headline"],
            flagged=summary["flagged"], summary_path=str(out_calibration), summary_sha256=sha256_file(out_calibration),
            decision_path=str(out_decision), decision_sha256=sha256_file(out_decision)))
