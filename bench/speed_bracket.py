"""Run the speed bracket (control, candidate, control, ... as the rule grows it) on a config, and print it.

Reads config/config.yaml (arms and the ``speed:`` section, schema defaults
filled in by pairaudit.speed.bracket), writes its artifacts to a scratch directory
(or ``--out``), appends its control starts to the configured control archive
(``--archive`` moves it; the archive is the point: day-to-day spread), then
prints per cell and repeat the primary metric of s1/s2/s3, the candidate's
ratio to the bracketing control mean, the in-window control/control spread
beside the 2 % bar, the archive's spread, the rule's verdict and reasons
(win2-v2 by default: the window's noise and the rule's error rates at it),
and the wall time.

``--aa`` runs the control against itself (an A/A: what the gate must call
NO_WIN); ``--plant-delay-us N`` plants a known slowdown instead of the
config's change: the control is the config's control, the candidate the same
server with the reference server's calibration switch
``PAIRAUDIT_REF_STEP_DELAY_US=N`` (a fixed delay after every engine step);
with ``--plant-in control`` the delay goes to the control instead, a known
speedup. ``--summary FILE`` appends one JSON line per run (verdict, gain,
half-width, noise, starts, wall time).

Usage: .venv/bin/python bench/speed_bracket.py [--config config/config.yaml] [--out DIR] [--archive PATH]
           [--aa | --plant-delay-us N [--plant-in candidate|control]] [--audit NAME] [--summary FILE]
Run it on a quiet machine: the numbers are the machine's, not the code's.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from pairaudit.core import artifacts  # noqa: E402
from pairaudit.plans import change  # noqa: E402
from pairaudit.plans import stage as plans  # noqa: E402
from pairaudit.serving import armspec, launch  # noqa: E402
from pairaudit.speed import bracket as speed  # noqa: E402
from pairaudit.speed import stage as speed_stage  # noqa: E402


def _f(x, fmt="{:.3f}"):
    return "-" if x is None else fmt.format(x)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(REPO / "config" / "config.yaml"))
    ap.add_argument("--out", default=None, help="artifact directory (default: a fresh temp dir)")
    ap.add_argument("--archive", default=None, help="control archive (default: the config's, under the repo)")
    ap.add_argument("--aa", action="store_true", help="the control against itself")
    ap.add_argument("--plant-delay-us", type=int, default=None,
                    help="plant a step delay of N us instead of the config's change")
    ap.add_argument("--plant-in", choices=("candidate", "control"), default="candidate",
                    help="where the planted delay goes: the candidate (a slowdown) or the control (a speedup)")
    ap.add_argument("--audit", default="bench-speed-bracket")
    ap.add_argument("--summary", default=None, help="append one JSON line per run here")
    args = ap.parse_args(argv)
    cfg = yaml.safe_load(Path(args.config).read_text())
    problems = change.derive_arms(cfg)  # a config in the change form: its arms, as the workflow derives them
    if problems:
        raise SystemExit("\n".join(problems))
    if args.aa or args.plant_delay_us is not None:
        base = cfg["arms"]["control"]
        cfg["arms"]["candidate"] = copy.deepcopy(base)
        if args.plant_delay_us is not None:
            # the other arm stays the config's control exactly, so its starts meet the host's evidence
            arm = cfg["arms"][args.plant_in]
            arm["env"] = {**(arm.get("env") or {}), "PAIRAUDIT_REF_STEP_DELAY_US": str(args.plant_delay_us)}
    scfg = speed.resolve(cfg.get("speed"))
    out = Path(args.out or tempfile.mkdtemp(prefix="speed-bracket-"))
    out.mkdir(parents=True, exist_ok=True)
    archive = Path(args.archive) if args.archive else REPO / scfg.archive
    lp, pp, sp = {}, {}, {}
    for arm in ("control", "candidate"):
        # the spec file the arm_spec rule writes, and the receipt of its answers phase
        sp[arm] = str(out / f"spec-{arm}.json")
        plans.arm_spec_stage(arm=arm, arm_cfg=cfg["arms"][arm], out_path=sp[arm])
        spec = armspec.read_spec(sp[arm], arm=arm)
        lp[arm] = str(out / f"launch-{arm}.json")
        artifacts.write_json(lp[arm], launch.receipt(spec))
        # The bench measures speed only; the audit's preflight stage is what proves the API.
        pp[arm] = str(out / f"preflight-{arm}.json")
        artifacts.write_json(pp[arm], {"schema": "pairaudit.preflight/v1", "verdict": "PASS", "bench": True})
    t0 = time.monotonic()
    doc = speed_stage.speed_stage(launch_paths=lp, preflight_paths=pp, spec_paths=sp, speed=scfg,
                            audit=args.audit, out_path=str(out / "decision.json"),
                            streams_path=str(out / "streams.jsonl"), archive_path=str(archive),
                            server_logs={s: str(out / f"server-{s}.log") for s in ("s1", "s2", "s3")})
    wall = time.monotonic() - t0
    if args.summary:
        g = doc["gate"]
        line = {"audit": args.audit, "aa": args.aa, "plant_delay_us": args.plant_delay_us,
                "plant_in": args.plant_in if args.plant_delay_us is not None else None, "wall_s": round(wall, 1),
                "verdict": g["verdict"], "rule": g["rule"], "starts": len(doc.get("starts") or []),
                "looks": doc.get("looks"), "pooled_gain_pct": g.get("pooled_gain_pct"),
                "half_width_pct": g.get("half_width_pct"), "noise": g.get("noise"), "waves_plan": doc.get("waves_plan"),
                "clock_check": (doc.get("clock_check") or {}).get("verdict"),
                "ms_per_round": {c: [r.get("ms_per_round") for r in per["s1"]]
                                 for c, per in (doc.get("pooled") or {}).items()},
                "not_run": doc.get("not_run"), "reasons": g.get("reasons")}
        with open(args.summary, "a") as fh:
            fh.write(json.dumps(line) + "\n")
    sc = scfg.to_json()  # the resolved record's fields, as the decision records them
    prim = sc["primary"]
    if doc.get("not_run"):
        print(f"not measured ({wall:.0f} s): {doc['not_run']}")
        return 1
    print(f"speed bracket on {doc['hosts']}: {wall:.0f} s wall; primary {prim}; bar {sc['win_pct']} %")
    print(f"clock check: {doc['clock_check']['verdict']} (mismatch {doc['clock_check']['mismatch']}); "
          f"load {[s['clock']['loadavg'] for s in doc['starts']]}")
    for c in sc["cells"]:
        name = c["name"]
        w = doc["win2"][name]
        print(f"\n{name} ({'decides' if c['decide'] else 'reported'}): {w['verdict']}")
        n = len(doc["starts"])
        print("  repeat " + "".join(f"{'s' + str(k + 1):>10}" for k in range(n)) + "   cand/ctrl")
        for r, vals in enumerate(doc["series"][name][prim]):
            ok = all(v is not None for v in vals)
            ratio = (sum(vals[1::2]) / len(vals[1::2])) / (sum(vals[0::2]) / len(vals[0::2])) if ok else None
            print(f"  {r:6d} " + "".join(_f(v, "{:10.3f}") for v in vals) + f" {_f(ratio, '{:10.4f}')}")
        p = w.get("primary") or {}
        sp = doc["spread"][name]
        print(f"  gain {_f(p.get('point_gain_pct'), '{:+.2f}')} %; in-window s1-s3 spread max "
              f"{_f(sp['window_max_pct'], '{:.2f}')} % beside the {sc['win_pct']} % bar; archive spread "
              f"{_f(sp['archive_with_window_pct'], '{:.2f}')} % over {sp['archive_with_window_n']} control starts")
        for m in sc["guards"] + sc["reported"]:
            mm = (w.get("guards") or {}).get(m) or (w.get("reported") or {}).get(m)
            if mm and "control" in mm:
                print(f"  {m}: control {[round(x, 4) for x in mm['control']]} candidate "
                      f"{[round(x, 4) for x in mm['candidate']]} ({_f(mm['point_gain_pct'], '{:+.2f}')} %)")
            elif mm:
                print(f"  {m}: {_f(mm.get('point_gain_pct'), '{:+.2f}')} % ({mm.get('guard_verdict') or mm.get('verdict')})")
    gate = doc["gate"]
    print(f"\nspeed gate ({gate['rule']}): {gate['verdict']}; artifacts in {out}")
    for r in gate["reasons"]:
        print(f"  - {r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
