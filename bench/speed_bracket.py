"""Run the speed bracket (s1 control, s2 candidate, s3 control) on the embedded default, and print it.

Reads config/config.yaml (arms and the ``speed:`` section, schema defaults
filled in by pairaudit.speed.bracket), writes its artifacts to a scratch directory
(or ``--out``), appends its control starts to the configured control archive
(``--archive`` moves it; the archive is the point: day-to-day spread), then
prints per cell and repeat the primary metric of s1/s2/s3, the candidate's
ratio to the bracketing control mean, the in-window control/control spread
beside the 2 % bar, the archive's spread, the rule's verdict and reasons
(win2-v2 by default: the window's noise and the rule's error rates at it),
and the wall time.

Usage: .venv/bin/python bench/speed_bracket.py [--config config/config.yaml] [--out DIR] [--archive PATH]
Run it on a quiet machine: the numbers are the machine's, not the code's.
"""

from __future__ import annotations

import argparse
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
    args = ap.parse_args(argv)
    cfg = yaml.safe_load(Path(args.config).read_text())
    problems = change.derive_arms(cfg)  # a config in the change form: its arms, as the workflow derives them
    if problems:
        raise SystemExit("\n".join(problems))
    scfg = speed.resolve_config(cfg.get("speed"))
    out = Path(args.out or tempfile.mkdtemp(prefix="speed-bracket-"))
    out.mkdir(parents=True, exist_ok=True)
    archive = Path(args.archive) if args.archive else REPO / scfg["archive"]
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
    doc = speed_stage.speed_stage(launch_paths=lp, preflight_paths=pp, spec_paths=sp, speed_cfg=cfg.get("speed"),
                            audit="bench-speed-bracket", out_path=str(out / "decision.json"),
                            streams_path=str(out / "streams.jsonl"), archive_path=str(archive),
                            server_logs={s: str(out / f"server-{s}.log") for s in ("s1", "s2", "s3")})
    wall = time.monotonic() - t0
    prim = scfg["primary"]
    print(f"speed bracket on {doc['hosts']}: {wall:.0f} s wall; primary {prim}; bar {scfg['win_pct']} %")
    print(f"clock check: {doc['clock_check']['verdict']} (mismatch {doc['clock_check']['mismatch']}); "
          f"load {[s['clock']['loadavg'] for s in doc['starts']]}")
    for c in scfg["cells"]:
        name = c["name"]
        w = doc["win2"][name]
        print(f"\n{name} ({'decides' if c['decide'] else 'reported'}): {w['verdict']}")
        print("  repeat        s1        s2        s3   s2/ctrl   |s1-s3|/ctrl")
        for r, (a, k, b) in enumerate(doc["series"][name][prim]):
            ctrl = (a + b) / 2 if a is not None and b is not None else None
            ratio = k / ctrl if ctrl and k is not None else None
            spread = abs(a - b) / ctrl if ctrl else None
            print(f"  {r:6d} {_f(a, '{:9.3f}')} {_f(k, '{:9.3f}')} {_f(b, '{:9.3f}')} {_f(ratio, '{:9.4f}')} "
                  f"{_f(None if spread is None else 100 * spread, '{:10.2f}')} %")
        p = w.get("primary") or {}
        sp = doc["spread"][name]
        print(f"  gain {_f(p.get('point_gain_pct'), '{:+.2f}')} %, 95 % paired-t "
              f"[{_f((p.get('t_interval') or {}).get('lo'), '{:.4g}')}, "
              f"{_f((p.get('t_interval') or {}).get('hi'), '{:.4g}')}]; in-window spread max "
              f"{_f(sp['window_max_pct'], '{:.2f}')} % beside the {scfg['win_pct']} % bar; archive spread "
              f"{_f(sp['archive_with_window_pct'], '{:.2f}')} % over {sp['archive_with_window_n']} control starts")
        for m in scfg["guards"] + scfg["reported"]:
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
