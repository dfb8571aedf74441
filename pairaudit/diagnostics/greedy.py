"""First divergences between the arms' greedy runs, and grid-tie-v1's inputs from the runs themselves.

The greedy runs are made in each arm's answers phase (``pairaudit.answers.greedy``):
token-id prompts rendered by each server's own template, temperature 0,
top-20 per generated position as served. When the candidate's greedy output
differs from the control's, enough is kept to decide whether the flip is a
one-step tie on the BF16 logit grid (rules.grid_tie_v1) and not a state or
verifier bug: both compared ids, each arm's top-20 at the first differing
position and each arm's prefix length there.

Where the top lists come from (``TOPS_SOURCE``): at the first divergence k
both arms have generated the same k tokens after the same prompt, so each
arm's own top-20 at position k of its greedy run is exactly its
distribution on the shared prefix, from the decode that produced the flip.
No forced-prefix request is needed; the prefix length each arm counted is its
served ``usage.prompt_tokens`` + k.

Records (plain JSON dicts): ``divergence_records`` writes
``contracts.DivergenceRecord``; ``greedy_tops`` one ``contracts.GreedyTop``
per arm and divergent item.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from pairaudit.core.contracts import DivergenceRecord, GreedyRecord, GreedyTop

# what the divergence artifact says of its top lists: each arm's own greedy run at the first divergence
TOPS_SOURCE = "greedy"


# -------------------------------------------------------------- divergence

def first_divergence(a_ids: Sequence[int], b_ids: Sequence[int]) -> int | None:
    """First position whose token ids differ; None when the sequences are equal.

    Compared on ids, never text: two ids can decode to the same string. When
    one output is a strict prefix of the other, they diverge where the
    shorter ends (one arm stopped, the other did not).
    """
    for k, (a, b) in enumerate(zip(a_ids, b_ids)):
        if a != b:
            return k
    if len(a_ids) != len(b_ids):
        return min(len(a_ids), len(b_ids))
    return None


def prefix_equal(a_ids: Sequence[int], b_ids: Sequence[int], k: int) -> bool:
    """Both outputs really share their first k ids."""
    return len(a_ids) >= k and len(b_ids) >= k and list(a_ids[:k]) == list(b_ids[:k])


def _at(seq: Sequence, k: int | None):
    return seq[k] if k is not None and 0 <= k < len(seq) else None


def divergence_records(control_greedy: Sequence[GreedyRecord],
                       candidate_greedy: Sequence[GreedyRecord]) -> list[DivergenceRecord]:
    """Pair the two arms' greedy records by item index and locate each first divergence."""
    ctrl = {r["index"]: r for r in control_greedy}
    cand = {r["index"]: r for r in candidate_greedy}
    if len(ctrl) != len(control_greedy) or len(cand) != len(candidate_greedy):
        raise ValueError("duplicate item index in greedy records")
    if set(ctrl) != set(cand):
        raise ValueError(f"greedy arms cover different items: control-only {sorted(set(ctrl) - set(cand), key=repr)}, "
                         f"candidate-only {sorted(set(cand) - set(ctrl), key=repr)}")
    out: list[DivergenceRecord] = []
    for idx in ctrl:  # the control's order: items stay in the order they were run
        a, b = ctrl[idx], cand[idx]
        errs = [f"{arm}: {r['error']}" for arm, r in (("control", a), ("candidate", b)) if r.get("error")]
        a_ids, b_ids = list(a.get("token_ids") or []), list(b.get("token_ids") or [])
        k = None if errs else first_divergence(a_ids, b_ids)
        cut = [(arm, r) for arm, r, ids in (("control", a, a_ids), ("candidate", b, b_ids))
               if r.get("clamped") and k is not None and len(ids) == k]
        if not errs and cut:
            # Equal up to where the server cut an arm short: what it would
            # have generated next is unknown, so neither "diverged" nor "equal".
            errs = [f"clamped: {arm}: {(r.get('clamp') or {}).get('reason')}" for arm, r in cut]
        known = not errs  # no output, no comparison: an unknown, never "no divergence"
        out.append({
            "index": idx, "control_len": len(a_ids), "candidate_len": len(b_ids),
            "clamped": [arm for arm, r in (("control", a), ("candidate", b)) if r.get("clamped")],
            "error": "; ".join(errs) or None,
            "diverged": (k is not None) if known else None,
            "first_divergence": k if known else None,
            "control_token_id": _at(a_ids, k) if known else None,
            "candidate_token_id": _at(b_ids, k) if known else None,
            "shared_prefix": a_ids[:k] if known and k is not None else None,
            "prefix_equal": known and prefix_equal(a_ids, b_ids, k if k is not None else len(a_ids)),
            "control_greedy_top": _at(a.get("top20") or [], k) if known else None,
            "candidate_greedy_top": _at(b.get("top20") or [], k) if known else None,
        })
    return out


def comparison_counts(items: Sequence[Any], divergences: Sequence[DivergenceRecord]) -> dict:
    """How many greedy items were selected, compared, diverged, or could not be compared.

    items: the greedy selection's indices (the divergence artifact's
    ``items``); divergences: ``divergence_records`` for them. An item is
    compared when both arms' outputs exist and were compared on token ids
    (``diverged`` True or False); ``diverged`` None (a failed run, or two
    different prompt renderings) is not a comparison. grid-tie-v1 needs these
    counts: zero divergences over zero comparisons is not evidence.
    """
    known = {str(i) for i in items}
    stray = [d.get("index") for d in divergences if str(d.get("index")) not in known]
    if stray:
        raise ValueError(f"divergence records for items outside the selection: {stray}")
    return {"selected": len(items),
            "compared": sum(1 for d in divergences if d.get("diverged") is not None),
            "diverged": sum(1 for d in divergences if d.get("diverged") is True),
            "unresolved": sum(1 for d in divergences if d.get("diverged") is None)}


# --------------------------------------------------------- grid-tie inputs

def greedy_tops(divergences: Sequence[DivergenceRecord], records: Mapping[Any, GreedyRecord], arm: str) \
        -> list[GreedyTop]:
    """One arm's top-20 at each divergent item's first divergence, from the arm's own greedy run.

    ``records``: the arm's greedy records by item index. A top list that the
    run does not have (its output ends at the divergence, a failed run) is
    None with the reason: the rule then STOPs on the missing evidence.
    """
    out: list[GreedyTop] = []
    for d in divergences:
        if not d.get("diverged"):
            continue
        k = d["first_divergence"]
        r: Mapping[str, Any] = records.get(d["index"]) or {}
        top = d["control_greedy_top"] if arm == "control" else d["candidate_greedy_top"]
        ids = list(r.get("token_ids") or [])
        served = (r.get("usage") or {}).get("prompt_tokens")
        prompt_tokens = served if isinstance(served, int) and not isinstance(served, bool) else None
        error: str | None = r.get("error")
        if error is None and (k is None or top is None):
            error = f"the {arm}'s greedy output has {len(ids)} tokens: no top-20 at position {k}"
        if error is None and prompt_tokens is None:
            error = f"the {arm}'s greedy run reports no usage.prompt_tokens ({served!r})"
        ok = error is None and k is not None and prompt_tokens is not None
        out.append({"index": d["index"], "first_divergence": k, "source": TOPS_SOURCE,
                    "top20": top if ok else None,
                    "token_id": ids[k] if ok and k is not None and k < len(ids) else None,
                    "prompt_tokens": prompt_tokens,
                    # the shared prefix's token count as the server counted it: its prompt + the k shared tokens
                    "prefix_len": prompt_tokens + k if ok and prompt_tokens is not None and k is not None else None,
                    "salt": r.get("salt"), "error": error})
    return out


def _by_index(tops: Mapping | Sequence[Mapping] | None) -> dict:
    if tops is None:
        return {}
    if isinstance(tops, Mapping):
        return {str(k): v for k, v in tops.items()}
    return {str(p["index"]): p for p in tops}


def grid_tie_inputs(divergences: Sequence[DivergenceRecord], control_tops, candidate_tops) -> list[dict]:
    """The exact per-item input records of ``rules.grid_tie_v1``, one per divergent item.

    Compared ids come from the greedy outputs, the top lists and prefix
    lengths from ``greedy_tops`` of each arm. A divergent item whose top list
    is missing is still listed, with None evidence, so the rule STOPs on it
    instead of the divergence quietly vanishing.
    """
    ctrl, cand = _by_index(control_tops), _by_index(candidate_tops)
    out = []
    for d in divergences:
        if not d.get("diverged"):
            continue
        c, k = ctrl.get(str(d["index"])) or {}, cand.get(str(d["index"])) or {}
        out.append({
            "index": d["index"],
            "control_token_id": d["control_token_id"],
            "candidate_token_id": d["candidate_token_id"],
            "candidate_top": k.get("top20") if not k.get("error") else None,
            "control_top": c.get("top20") if not c.get("error") else None,
            "control_prefix_len": c.get("prefix_len") if not c.get("error") else None,
            "candidate_prefix_len": k.get("prefix_len") if not k.get("error") else None,
        })
    return out
