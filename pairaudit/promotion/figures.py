"""The report's figures (matplotlib, Agg): paired outcomes, greedy divergence, speed, control archive.

A stage without an artifact gets a "not run" figure (``plot_not_run``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping, Sequence

from pairaudit.core.artifacts import ArtifactError
from pairaudit.core.contracts import ARMS, arm_role
from pairaudit.core.readers import ArchivedStart, DivergenceDoc, Paired, ScoresHeader, SpeedDecisionDoc, as_record

OUTCOME_COLORS = {"both correct": "#4c9a5b", "control only": "#d9822b",
                  "candidate only": "#3b75af", "neither": "#b0b0b0"}


def paired_counts(table: Mapping[str, Any]) -> dict[str, int]:
    """The four paired outcomes of one table; they sum to n."""
    return {"both correct": table["both_correct"], "control only": len(table["control_only"]),
            "candidate only": len(table["candidate_only"]), "neither": table["neither_correct"]}


def item_outcomes(table: Mapping[str, Any], correct: Mapping[str, Mapping[int, bool]]) -> dict[int, str]:
    """Index -> paired outcome, from each arm's per-item scores; checked against the paired table.

    correct: arm -> {index: correct}. A score file that disagrees with the
    table's control-only / candidate-only sets or counts is an error: the
    figure must show the evidence the decision used.
    """
    out: dict[int, str] = {}
    for i in table["indices"]:
        c, k = bool(correct["control"].get(i)), bool(correct["candidate"].get(i))
        out[i] = ("both correct" if c and k else "control only" if c else "candidate only" if k else "neither")
    got = {o: sorted(i for i, v in out.items() if v == o) for o in OUTCOME_COLORS}
    if (got["control only"] != sorted(table["control_only"]) or got["candidate only"] != sorted(table["candidate_only"])
            or len(got["both correct"]) != table["both_correct"] or len(got["neither"]) != table["neither_correct"]):
        raise ArtifactError("per-item scores disagree with the paired table (control-only "
                            f"{got['control only']} vs {table['control_only']}, candidate-only {got['candidate only']} "
                            f"vs {table['candidate_only']})")
    return out


def plot_paired(paired: Mapping[str, Paired | Mapping[str, Any]], out_png: str | os.PathLike,
                items: Mapping[str, Mapping[int, str]] | None = None) -> None:
    """Stacked bars of paired outcomes per dataset, and with ``items`` one coloured cell per item; PNG.

    Uses a bare Figure on the Agg canvas instead of pyplot, so no global
    backend or figure state is touched (Snakemake jobs and tests share a process).
    """
    names = sorted(paired)
    docs = {ds: _paired(ds, paired[ds]) for ds in names}
    items = items or {}
    per_item = bool(items) and all(ds in items for ds in names)
    fig = _figure(max(4.0, 1.6 * len(names) + 2.0) + (6.0 if per_item else 0.0), max(4.0, 0.5 * len(names) + 2.5))
    ax = fig.add_subplot(1, 2, 1) if per_item else fig.add_subplot(1, 1, 1)
    bottoms = [0] * len(names)
    counts = [paired_counts(docs[ds].table.raw) for ds in names]
    for outcome, color in OUTCOME_COLORS.items():
        vals = [c[outcome] for c in counts]
        bars = ax.bar(range(len(names)), vals, bottom=bottoms, color=color, label=outcome)
        for b, v, y0 in zip(bars, vals, bottoms):
            if v:
                ax.text(b.get_x() + b.get_width() / 2, y0 + v / 2, str(v), ha="center", va="center", fontsize=8)
        bottoms = [b + v for b, v in zip(bottoms, vals)]
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels([f"{ds}\n({docs[ds].quality.verdict})" for ds in names])
    ax.set_ylabel("items")
    ax.yaxis.get_major_locator().set_params(integer=True)
    ax.set_title("Paired outcomes per dataset (control vs candidate)")
    if per_item:
        ax2 = fig.add_subplot(1, 2, 2)
        width = max(len(items[ds]) for ds in names) or 1
        for row, ds in enumerate(names):
            for col, idx in enumerate(sorted(items[ds])):
                outcome = items[ds][idx]
                ax2.add_patch(_rect((col, row), OUTCOME_COLORS[outcome]))
                if outcome in ("control only", "candidate only") or len(items[ds]) <= 20:
                    ax2.text(col + 0.5, row + 0.5, str(idx), ha="center", va="center", fontsize=6)
        ax2.set_xlim(0, max(width, 10))  # a few items stay squares, not wide bars
        ax2.set_xticks([])
        ax2.set_ylim(len(names), 0)
        ax2.set_yticks([r + 0.5 for r in range(len(names))])
        ax2.set_yticklabels(names)
        ax2.set_xlabel("items in index order (discordant ones and small sets labelled with their index)")
        ax2.set_title("Per item")
        ax2.legend(handles=[_rect((0, 0), c, label=o) for o, c in OUTCOME_COLORS.items()],
                   loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    else:
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    _save(fig, out_png)


def _paired(ds: str, doc: Paired | Mapping[str, Any]) -> Paired:
    out = as_record(Paired, doc, where=f"paired {ds}")
    assert out is not None
    return out


def _speed(doc: SpeedDecisionDoc | Mapping[str, Any]) -> SpeedDecisionDoc:
    out = as_record(SpeedDecisionDoc, doc, where="speed decision")
    assert out is not None
    return out


def _rect(xy, color, label=None):
    from matplotlib.patches import Rectangle

    return Rectangle(xy, 1, 1, facecolor=color, edgecolor="white", label=label)


def load_item_outcomes(paired: Mapping[str, Paired | Mapping[str, Any]],
                       score_paths: Sequence[str | os.PathLike]) -> dict[str, dict[int, str]]:
    """dataset -> index -> outcome from the score files the paired stage consumed (checked by hash)."""
    from pairaudit.core.artifacts import check_consumed, read_jsonl

    correct: dict[str, dict[str, dict[int, bool]]] = {}
    for p in score_paths:
        header_doc, records = read_jsonl(p)
        header = ScoresHeader.from_json(header_doc, where=p)
        ds, arm = header.dataset, arm_role(header.arm)   # a sweep's candidate arm is named by its change
        if ds not in paired or arm not in ARMS:
            raise ArtifactError(f"{p}: scores for {ds}/{arm}, which has no paired result")
        check_consumed(_paired(ds, paired[ds]).raw, [p], where=f"paired {ds}")
        # a score record without a verdict is no correct answer (scoring.score_records writes it for each item)
        correct.setdefault(ds, {})[arm] = {r["index"]: bool(r.get("correct")) for r in records}
    return {ds: item_outcomes(_paired(ds, paired[ds]).table.raw, arms) for ds, arms in correct.items()
            if set(arms) == set(ARMS)}


# ------------------------------------------------------------- later figures

def _figure(width: float, height: float):
    # A bare Figure on the Agg canvas: no pyplot global state (see plot_paired).
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(fig)
    return fig


def _save(fig, out_png: str | os.PathLike) -> None:
    fig.tight_layout()
    Path(out_png).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png, format="png")


def plot_not_run(out_png: str | os.PathLike, title: str, why: str) -> None:
    """A figure slot whose stage did not run: says so instead of drawing an empty axis."""
    fig = _figure(6.0, 2.0)
    fig.text(0.5, 0.62, f"{title}: not run", ha="center", va="center", fontsize=13, weight="bold")
    fig.text(0.5, 0.32, why, ha="center", va="center", fontsize=9, wrap=True)
    Path(out_png).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png, format="png")


def _top2_margin(top: Sequence[Sequence[float]] | None) -> float | None:
    vals = sorted((float(v) for _, v in top or []), reverse=True)
    return vals[0] - vals[1] if len(vals) >= 2 else None


def divergence_points(docs: Mapping[str, DivergenceDoc | Mapping[str, Any]]) -> list[dict]:
    """One row per diverged greedy item: where it diverged and how close the top-2 were.

    Margins are top-1 minus top-2 log-probability of each arm's top-20 on the
    shared prefix (the arm's own, at the divergent position of its greedy run); ``step``
    is the grid step grid-tie-v1 found for that probe (None when it found
    none), so ``margin / step`` <= 1 reads as a one-step tie.
    """
    rows = []
    for ds in sorted(docs):
        doc = as_record(DivergenceDoc, docs[ds], where=f"divergence {ds}")
        assert doc is not None
        # each arm's top-20 at the divergence is the evidence as served (kept under "probes"), passed on whole
        top20 = {arm: {p["index"]: p["top20"] for p in doc.probes[arm]} if arm in doc.probes else {}
                 for arm in ARMS}
        gt = doc.grid_tie
        gt_probes = {} if gt is None else {p.index: p for p in gt.probes}
        for d in doc.divergences:
            if not d.diverged:
                continue
            i = d.index
            g = gt_probes[i] if i in gt_probes else None
            rows.append({
                "dataset": ds, "index": i, "position": d.first_divergence,
                "control_len": d.control_len, "candidate_len": d.candidate_len,
                "control_token_id": d.control_token_id, "candidate_token_id": d.candidate_token_id,
                "control_margin": _top2_margin(top20["control"][i] if i in top20["control"] else None),
                "candidate_margin": _top2_margin(top20["candidate"][i] if i in top20["candidate"] else None),
                "step": None if g is None else g.step, "gap_in_steps": None if g is None else g.gap_in_steps,
                "verdict": (g.verdict if g is not None else None) or (None if gt is None else gt.verdict),
            })
    return rows


def plot_divergence(docs: Mapping[str, DivergenceDoc | Mapping[str, Any]], out_png: str | os.PathLike) -> list[dict]:
    """Left: first-divergence position per item against its output length. Right: top-2 margins in BF16 steps."""
    rows = divergence_points(docs)
    greedy_n = {ds: len(doc.divergences) for ds in docs
                for doc in [as_record(DivergenceDoc, docs[ds], where=f"divergence {ds}")] if doc is not None}
    if not rows:
        plot_not_run(out_png, "Greedy divergence",
                     "no greedy item diverged (" + ", ".join(f"{ds}: 0/{n}" for ds, n in sorted(greedy_n.items()))
                     + " greedy items differ)")
        return rows
    fig = _figure(10.0, 4.0)
    ax1, ax2 = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    names = sorted(docs)
    for j, ds in enumerate(names):
        mine = [r for r in rows if r["dataset"] == ds]
        if not mine:
            continue
        ax1.scatter([r["position"] for r in mine], [max(r["control_len"] or 0, r["candidate_len"] or 0) for r in mine],
                    label=f"{ds} ({len(mine)}/{greedy_n[ds]} diverged)", color=f"C{j}")
        for r in mine:
            ax1.annotate(str(r["index"]), (r["position"], max(r["control_len"] or 0, r["candidate_len"] or 0)),
                         fontsize=7, xytext=(3, 3), textcoords="offset points")
    lim = max([max(r["control_len"] or 0, r["candidate_len"] or 0) for r in rows] + [1])
    ax1.plot([0, lim], [0, lim], color="#999", lw=0.8, ls=":")
    ax1.set_xlabel("first differing token (position in the output)")
    ax1.set_ylabel("output length (longer arm)")
    ax1.set_title("Where greedy outputs diverge")
    ax1.legend(fontsize=7)
    xs = list(range(len(rows)))
    for arm, marker, color in (("control", "s", "#d9822b"), ("candidate", "o", "#3b75af")):
        ys = [(r[f"{arm}_margin"] / r["step"]) if r["step"] and r[f"{arm}_margin"] is not None else float("nan")
              for r in rows]
        ax2.scatter(xs, ys, marker=marker, color=color, label=f"{arm} top-1 − top-2", zorder=3)
    ax2.axhline(1.0, color="#c0392b", ls="--", lw=1, label="one BF16 step")
    no_step = [x for x, r in zip(xs, rows) if not r["step"]]
    for x in no_step:
        ax2.annotate("no grid step", (x, 0), fontsize=7, rotation=90, va="bottom", ha="center", color="#c0392b")
    ax2.set_xticks(xs)
    ax2.set_xticklabels([f"{r['dataset']}\n#{r['index']}\n{r['verdict']}" for r in rows], fontsize=7)
    ax2.set_ylabel("margin / grid step")
    ax2.set_ylim(bottom=-0.1)
    ax2.set_title("Top-2 margin at the divergent position")
    ax2.legend(fontsize=7)
    _save(fig, out_png)
    return rows


def plot_speed(doc: SpeedDecisionDoc | Mapping[str, Any], out_png: str | os.PathLike) -> None:
    """Per cell: every start of every repeat for the primary metric, and the win bar above the control mean."""
    speed = _speed(doc)
    primary = speed.primary
    series = speed.series or {}
    bar = speed.bar
    if bar is None:
        plot_not_run(out_png, "Speed bracket", f"the speed decision was not measured: {speed.not_run}")
        return
    win_pct = float(bar.win_pct)
    lower = primary in bar.lower_is_better
    if primary is None:
        plot_not_run(out_png, "Speed bracket", "the speed decision names no primary metric")
        return
    cells = [c for c in series if primary in series[c]]
    if not cells:
        plot_not_run(out_png, "Speed bracket", f"the speed decision carries no series for its primary metric {primary!r}")
        return
    fig = _figure(max(5.0, 3.6 * len(cells)), 4.0)
    verdicts = {} if speed.gate is None else speed.gate.cells
    for j, cell in enumerate(cells):
        ax = fig.add_subplot(1, len(cells), j + 1)
        reps = series[cell][primary]
        for r, starts in enumerate(reps):
            vals = [float("nan") if v is None else float(v) for v in starts]
            n = len(vals)
            xs = [r - 0.3 + 0.6 * k / max(1, n - 1) for k in range(n)]   # the starts in run order within a repeat
            # in a sweep's shared bracket the other candidates' starts sit between the control's
            roles = speed.start_roles(n)
            pick = {role: [k for k in range(n) if roles[k] == role] for role in ("control", "candidate", "other")}
            cx, cv = [xs[k] for k in pick["control"]], [vals[k] for k in pick["control"]]
            ctrl = sum(cv) / len(cv)
            ax.plot(cx, cv, color="#999", lw=0.8, zorder=1)
            ax.scatter(cx, cv, marker="s", color="#d9822b", label="control starts" if r == 0 else None, zorder=3)
            ax.scatter([xs[k] for k in pick["candidate"]], [vals[k] for k in pick["candidate"]], marker="o",
                       color="#3b75af", s=50, label="candidate starts" if r == 0 else None, zorder=3)
            if pick["other"]:
                ax.scatter([xs[k] for k in pick["other"]], [vals[k] for k in pick["other"]], marker="x",
                           color="#bbb", label="other candidates' starts" if r == 0 else None, zorder=2)
            edge = ctrl * (1 - win_pct / 100) if lower else ctrl * (1 + win_pct / 100)
            ax.fill_between([r - 0.35, r + 0.35], [ctrl] * 2, [edge] * 2, color="#c0392b", alpha=0.15,
                            label=f"{win_pct:g} % bar over control mean" if r == 0 else None)
            ax.hlines(ctrl, r - 0.35, r + 0.35, color="#555", lw=1, label="control mean" if r == 0 else None)
        w = (speed.win2 or {}).get(cell)
        gain = None if w is None else w.primary.get("point_gain_pct")
        ax.set_title(f"{cell}: {verdicts.get(cell) or (None if w is None else w.verdict) or '?'}"
                     + (f" (gain {gain:+.2f} %)" if isinstance(gain, (int, float)) else ""), fontsize=9)
        ax.set_xticks(range(len(reps)))
        ax.set_xticklabels([f"repeat {r + 1}" for r in range(len(reps))])
        ax.set_xlim(-0.5, len(reps) - 0.5)
        ax.set_ylabel(f"{primary} ({'lower' if lower else 'higher'} is better)")
        if j == 0:
            ax.legend(fontsize=7)
    _save(fig, out_png)


def archive_rows(speed_doc: SpeedDecisionDoc | Mapping[str, Any],
                 archive: Sequence[Mapping[str, Any]]) -> dict[str, list[dict]]:
    """cell -> archived control starts comparable with this audit's: same cell, same config hash, a value."""
    speed = _speed(speed_doc)
    primary = speed.primary
    spread = speed.spread or {}
    starts = [ArchivedStart.from_json(a, where=f"control archive line {n + 1}") for n, a in enumerate(archive)]
    out = {}
    for cell in speed.series or {}:
        want = spread[cell].config_hash if cell in spread else None
        out[cell] = [dict(a.raw) for a in starts if a.cell == cell
                     and (want is None or a.config_hash == want)
                     and primary in a.metrics and isinstance(a.metrics[primary], (int, float))]
    return out


def plot_control_archive(speed_doc: SpeedDecisionDoc | Mapping[str, Any], archive: Sequence[Mapping[str, Any]],
                         out_png: str | os.PathLike) -> None:
    """Every archived control start's primary metric per cell, this audit's starts marked."""
    speed = _speed(speed_doc)
    primary = speed.primary
    audit = speed.audit
    cells = list(speed.series or {})
    by_cell = archive_rows(speed, archive)
    if not any(by_cell.values()):
        plot_not_run(out_png, "Control archive", "no archived control start carries the primary metric yet")
        return
    fig = _figure(max(5.0, 3.6 * len(cells)), 4.0)
    spread = speed.spread or {}
    for j, cell in enumerate(cells):
        ax = fig.add_subplot(1, len(cells), j + 1)
        rows = by_cell[cell]
        xs = list(range(len(rows)))
        ys = [a["metrics"][primary] for a in rows]
        mine = [a["audit"] == audit for a in rows]
        ax.scatter([x for x, m in zip(xs, mine) if not m], [y for y, m in zip(ys, mine) if not m],
                   color="#999", label="earlier control starts")
        ax.scatter([x for x, m in zip(xs, mine) if m], [y for y, m in zip(ys, mine) if m],
                   color="#d9822b", marker="s", label=f"this audit ({audit})")
        sp = spread[cell] if cell in spread else None
        arch = None if sp is None else sp.archive_pct
        win = (None if sp is None else sp.win_pct) or speed.win_pct
        ax.set_title(f"{cell}: archive spread "
                     + (f"{arch:.2f} %" if isinstance(arch, (int, float)) else "n/a (< 2 starts)")
                     + (f" vs {win:g} % bar" if isinstance(win, (int, float)) else ""), fontsize=9)
        ax.set_xlabel("archived control start (in append order)")
        ax.set_ylabel(f"{primary} (mean over repeats)")
        if j == 0:
            ax.legend(fontsize=7)
    _save(fig, out_png)
