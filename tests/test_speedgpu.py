"""GPU clock facts on known answers from a real H200 (driver 580.159.04, tests/data/h200).

A fake ``nvidia-smi`` (an executable script written per test) answers from
the captured readings: idle, under a bf16 matmul load at the 700 W power
limit, and after it. It resolves field names and their aliases from the
driver's own field list (help-query-gpu.txt), refuses an unknown field with
the driver's own message (bad-field.txt) and honours ``--id``, so the real
subprocess path of ``speedgpu.read_gpus`` runs. Its answers to the query the
stage ran before are checked byte for byte against what the driver printed
(*.legacy.csv), so the fake cannot drift from the real driver unnoticed.
"""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path

import pytest

from pairaudit.gates import SEQUENTIAL_RULES
from pairaudit.speed import bracket as speed
from pairaudit.speed import clock as speedclock
from pairaudit.speed import decision as speeddecision
from pairaudit.speed import gpu as speedgpu

DATA = Path(__file__).parent / "data" / "h200"
UUID0 = "GPU-52ddb521-b2b7-b595-8729-8ba67bd1cb0a"    # the captured H200
UUID1 = "GPU-0badcafe-1111-2222-3333-444444444444"    # a planted second GPU
CPU_NONE = {"governor": None, "scaling_max_freq_khz": None}  # a host without cpufreq: the GPUs alone vouch

FAKE = r'''#!{python}
"""A fake nvidia-smi answering from captured readings (tests/test_speedgpu.py)."""
import csv, io, json, re, sys
from pathlib import Path

here = Path(__file__).parent
state = json.loads((here / "state.json").read_text())
data = Path(state["data"])
with open(here / "calls.log", "a") as log:
    log.write(json.dumps(sys.argv[1:]) + "\n")
help_text = (data / "help-query-gpu.txt").read_text() + "".join(f'\n"{f}"\n' for f in state.get("extra_help", []))
alias = {}  # every spelling the driver accepts -> the name it prints in a header
for m in re.finditer(r'^"([^"]+)"(?: or "([^"]+)")?', help_text, re.M):
    alias[m.group(1)] = m.group(1)
    if m.group(2):
        alias[m.group(2)] = m.group(1)
bad_field = (data / "bad-field.txt").read_text().splitlines()[0]


def table(name):
    rows = list(csv.reader(io.StringIO((data / name).read_text()), skipinitialspace=True))
    head = [re.sub(r" \[[^]]*\]$", "", h.strip()) for h in rows[0]]
    return [dict(zip(head, (v.strip() for v in r))) for r in rows[1:] if r]


def gpu_values(label, overrides):
    g = {"name": "NVIDIA H200"}  # what nvidia-smi called this GPU (not among the captured fields)
    for kind in ("events", "counters", "throttle-names"):
        g.update(table(f"{label}.{kind}.csv")[0])
    g.update(overrides)
    return g


args = sys.argv[1:]
if args == ["--help-query-gpu"]:
    print(help_text)
    sys.exit(0)
opts = dict(a.split("=", 1) for a in args if "=" in a)
assert set(opts) <= {"--query-gpu", "--format", "--id"}, args
gpus = [gpu_values(state["snapshot"], o) for o in state.get("gpus", [{}])]
fields = opts["--query-gpu"].split(",")
for f in fields:
    old_driver = state.get("old_driver") and f.startswith("clocks_event_reasons")
    if f not in alias or old_driver or f in state.get("reject", []):
        print(bad_field.replace("no.such.field", f) + "\n")
        sys.exit(2)
assert "noheader" in opts["--format"], "this fake prints no header"
if "--id" in opts:
    want = opts["--id"].split(",")
    if any(not any(w in (g["index"], g["uuid"]) for g in gpus) for w in want):
        print("No devices were found")
        sys.exit(6)
    gpus = [g for g in gpus if g["index"] in want or g["uuid"] in want]
for g in sorted(gpus, key=lambda g: int(g["index"])):
    print(", ".join(g[alias[f]] for f in fields))
'''


class FakeSmi:
    """The fake's executable and its state: which captured reading it answers with, what is planted."""

    def __init__(self, folder: Path, **state):
        folder.mkdir(parents=True, exist_ok=True)
        self.exe = folder / "nvidia-smi"
        self.exe.write_text(FAKE.replace("{python}", sys.executable))
        self.exe.chmod(self.exe.stat().st_mode | stat.S_IEXEC)
        self.state = {"data": str(DATA), "snapshot": "idle", **state}
        self.set()

    def set(self, **state):
        self.state.update(state)
        (self.exe.parent / "state.json").write_text(json.dumps(self.state))
        return self

    def facts(self, snapshot: str, visible: str | None = None, **state) -> dict:
        self.set(snapshot=snapshot, **state)
        return {**speedclock.clock_facts(visible, exe=str(self.exe)), **CPU_NONE}

    def calls(self) -> list[list[str]]:
        return [json.loads(line) for line in (self.exe.parent / "calls.log").read_text().splitlines()]


@pytest.fixture
def smi(tmp_path):
    return FakeSmi(tmp_path / "smi")


def two_gpus(gpu1: dict | None = None) -> list[dict]:
    """The captured H200 plus a planted second one at a lower power limit."""
    return [{}, {"index": "1", "uuid": UUID1, "power.limit": "500.00", "enforced.power.limit": "500.00",
                 **(gpu1 or {})}]


def bracket_result(control, candidate):
    return {st: {"short-c1": {"pooled": [{"pooled_rate_tps": x, "accepted_per_round": 0.0, "decode_tps": x,
                                          "ms_per_round": 1000.0 / x, "ttft_s": 0.1} for x in xs]}}
            for st, xs in (("s1", control), ("s2", candidate), ("s3", control))}


# The rules that decide one three-start bracket on its own numbers; win2-v4 and win2-v3 grow the bracket first
# (tests/test_rules_win2v3.py), and the clock findings below are the stage's, the same for every rule.
CFGS = {rule: speed.resolve_config({"cells": [{"name": "short-c1", "prompt": "short"}], "repeats": 3, "rule": rule})
        for rule in speeddecision.RULES if rule not in SEQUENTIAL_RULES}
WIN = bracket_result([100.0, 101.0, 99.0], [110.0, 111.5, 109.0])


# ----------------------------------------------------------- the fake is the driver

@pytest.mark.parametrize("label", ["idle", "loaded", "after"])
def test_fake_answers_the_old_query_exactly_as_the_driver_did(smi, label):
    smi.set(snapshot=label)
    q = "clocks.sm,clocks.max.sm,clocks.applications.graphics,clocks_throttle_reasons.active,power.limit"
    rc, out = speedgpu._smi(str(smi.exe), [f"--query-gpu={q}", "--format=csv,noheader,nounits"])
    assert rc == 0 and out + "\n" == (DATA / f"{label}.legacy.csv").read_text()
    rc, out = speedgpu._smi(str(smi.exe), ["--query-gpu=no.such.field", "--format=csv"])
    assert rc == 2 and out == (DATA / "bad-field.txt").read_text().split("\n\n")[0]


# ----------------------------------------------------------- readings

def test_one_reading_of_the_loaded_h200(smi):
    q = smi.facts("loaded")["gpu"]
    assert q["error"] is None and q["driver_version"] == "580.159.04" and q["selected"] is None
    assert q["reason_fields"] == "clocks_event_reasons"
    (g,) = q["gpus"]
    assert g["uuid"] == UUID0 and g["index"] == 0
    assert g["clocks"] == {"clocks.current.sm": 1500, "clocks.max.sm": 1980, "clocks.applications.graphics": 1980}
    assert g["power"] == {"power.limit": 700.0, "enforced.power.limit": 700.0, "power.draw": 689.75}
    assert g["active_mask"] == "0x0000000000000004" and g["active_reasons"] == ["sw_power_cap"]
    assert g["counters_us"] == {"sw_power_cap": 22879977, "sync_boost": 0, "sw_thermal_slowdown": 0,
                                "hw_thermal_slowdown": 0, "hw_power_brake_slowdown": 0}
    # this driver has no query field for locked clocks: recorded, not failed
    assert g["locked_clocks"] is None
    assert q["not_reported"] == {"locked clocks": "this driver lists no query field for locked clocks"}
    assert speedclock.cap_facts(smi.facts("loaded")) == {
        "governor": None, "scaling_max_freq_khz": None, "gpu_count": 1, "gpu0.clocks.max.sm": 1980,
        "gpu0.clocks.applications.graphics": 1980, "gpu0.power.limit": 700.0, "gpu0.enforced.power.limit": 700.0}
    assert speedclock.clock_gaps(smi.facts("idle")) == []


def test_idle_loaded_after_inside_starts_is_ok_and_the_power_cap_is_recorded(smi):
    # s1 runs from idle to the load, s2 from the load to after it, s3 from idle to after
    before = [smi.facts("idle"), smi.facts("loaded"), smi.facts("idle")]
    after = [smi.facts("loaded"), smi.facts("after"), smi.facts("after")]
    clock = speedclock.clock_check(before, after=after)
    assert clock["verdict"] == "OK", clock
    assert clock["slowdowns"] == [] and clock["mismatch"] == [] and clock["within_start"] == []
    assert [(p["start"], p["sw_power_cap_us"], p["sync_boost_us"]) for p in clock["power_cap"]] == [
        ("s1", 22879977, 0), ("s2", 40199986 - 22879977, 0), ("s3", 40199986, 0)]
    assert clock["power_cap"][0]["seen_active"] == ["sw_power_cap"] and clock["power_cap"][0]["power_limit_w"] == 700.0
    assert "locked clocks: this driver lists no query field for locked clocks" in clock["notes"]
    for rule, cfg in CFGS.items():
        gate = speeddecision.decide(WIN, cfg, clock)[2]
        assert gate["verdict"] == "WIN" and gate["clock_check"] == "OK", (rule, gate["reasons"])


@pytest.mark.parametrize("counter", ["hw_thermal_slowdown", "sw_thermal_slowdown", "hw_power_brake_slowdown"])
def test_a_slowdown_counter_that_grew_inside_a_start_is_different_with_its_microseconds(smi, counter):
    before = [smi.facts("idle"), smi.facts("idle"), smi.facts("idle")]
    field = f"clocks_event_reasons_counters.{counter}"
    hot = smi.facts("loaded", gpus=[{field: "1234567"}])
    after = [smi.facts("loaded", gpus=[{}]), hot, smi.facts("loaded")]
    clock = speedclock.clock_check(before, after=after)
    assert clock["verdict"] == "DIFFERENT" and clock["mismatch"] == [] and clock["within_start"] == []
    (sd,) = clock["slowdowns"]
    assert (sd["start"], sd["gpu"], sd["uuid"], sd["reason"], sd["us"], sd["source"]) == (
        "s2", "gpu0", UUID0, counter, 1234567, "counter")
    assert "1234567 us" in sd["detail"]
    for rule, cfg in CFGS.items():
        _, _, gate = speeddecision.decide(WIN, cfg, clock)
        assert gate["verdict"] == "INCONCLUSIVE", rule
        assert any("s2: GPU slowdown inside the start" in r and "1234567 us" in r for r in gate["reasons"]), rule


def test_a_slowdown_on_another_gpu_of_the_host_is_not_this_servers(smi):
    hot = {"clocks_event_reasons_counters.hw_thermal_slowdown": "99"}
    smi.set(gpus=two_gpus())
    before = [smi.facts("idle", v) for v in ("0", "0", "0")]
    after = [smi.facts("loaded", v, gpus=two_gpus(hot)) for v in ("0", "0", "0")]
    assert speedclock.clock_check(before, after=after)["verdict"] == "OK"
    # the same host read whole (the arm does not say): GPU 1's slowdown counts
    smi.set(gpus=two_gpus())
    before = [smi.facts("idle") for _ in range(3)]
    after = [smi.facts("loaded", gpus=two_gpus(hot)) for _ in range(3)]
    clock = speedclock.clock_check(before, after=after)
    assert clock["verdict"] == "DIFFERENT"
    assert {(s["gpu"], s["uuid"], s["us"]) for s in clock["slowdowns"]} == {("gpu1", UUID1, 99)}


def test_a_power_limit_that_differs_across_starts_or_moves_inside_one_is_different(smi):
    low = {"power.limit": "650.00", "enforced.power.limit": "650.00"}
    before = [smi.facts("idle", gpus=[{}]), smi.facts("idle", gpus=[low]), smi.facts("idle", gpus=[{}])]
    after = [smi.facts("loaded", gpus=[{}]), smi.facts("loaded", gpus=[low]), smi.facts("loaded", gpus=[{}])]
    clock = speedclock.clock_check(before, after=after)
    assert clock["verdict"] == "DIFFERENT"
    assert clock["mismatch"] == ["gpu0.enforced.power.limit", "gpu0.power.limit"] and clock["slowdowns"] == []
    for rule, cfg in CFGS.items():
        _, _, gate = speeddecision.decide(WIN, cfg, clock)
        assert gate["verdict"] == "INCONCLUSIVE", rule
    # lowered during s3: a change inside the start, even with a SW power cap that is then expected
    after[2] = smi.facts("loaded", gpus=[low])
    before[1] = smi.facts("idle", gpus=[{}])
    after[1] = smi.facts("loaded", gpus=[{}])
    clock = speedclock.clock_check(before, after=after)
    assert clock["mismatch"] == [] and clock["within_start"] == [{
        "start": "s3", "changed": ["gpu0.enforced.power.limit", "gpu0.power.limit"],
        "before": {"gpu0.enforced.power.limit": 700.0, "gpu0.power.limit": 700.0},
        "after": {"gpu0.enforced.power.limit": 650.0, "gpu0.power.limit": 650.0}}]
    assert clock["verdict"] == "DIFFERENT"


def test_expected_clock_cap(smi):
    before = [smi.facts("idle") for _ in range(3)]
    after = [smi.facts("loaded") for _ in range(3)]
    # numbers as the config spells them: 700 W is "700.00" as printed, MHz as a string too
    ok = speedclock.clock_check(before, {"gpu0.power.limit": 700, "gpu0.clocks.max.sm": "1980", "gpu_count": 1},
                                after=after)
    assert ok["verdict"] == "OK" and ok["off_expected"] == []
    off = speedclock.clock_check(before, {"gpu0.power.limit": 600, "gpu0.clocks.applications.graphics": 1980},
                                 after=after)
    assert off["verdict"] == "DIFFERENT" and off["off_expected"] == ["gpu0.power.limit"]
    for rule, cfg in CFGS.items():
        _, _, gate = speeddecision.decide(WIN, cfg, off)
        assert gate["verdict"] == "INCONCLUSIVE"
        assert any("gpu0.power.limit differs from speed.expected_clock_cap (600)" in r and "700.0" in r
                   for r in gate["reasons"]), rule
    # a GPU the server does not have is off too
    assert speedclock.clock_check(before, {"gpu1.power.limit": 700}, after=after)["off_expected"] == [
        "gpu1.power.limit"]


@pytest.mark.parametrize("bad", [{"gpu0.power_limit": 700}, {"gpu0.clocks.sm": 1980}, {"governer": "performance"},
                                 ["gpu0.power.limit"]])
def test_expected_clock_cap_keys_are_checked_at_config_time(bad):
    with pytest.raises(speed.SpeedConfigError, match="speed.expected_clock_cap") as err:
        speed.resolve_config({"expected_clock_cap": bad})
    assert "mapping" in str(err.value) or "allowed: governor, scaling_max_freq_khz" in str(err.value)
    assert speed.resolve_config({"expected_clock_cap": {"gpu3.enforced.power.limit": 700, "governor": "x"}})


# ----------------------------------------------------------- the arm's GPUs

@pytest.mark.parametrize("visible, uuids", [
    ("1", [UUID1]), ("0", [UUID0]), (UUID1, [UUID1]), ("GPU-0badcafe", [UUID1]), (" 1 , 0", [UUID1, UUID0]),
    (f"0,{UUID1}", [UUID0, UUID1]), ("0,7,1", [UUID0]), (None, [UUID0, UUID1]),
])
def test_cuda_visible_devices_selects_the_servers_gpus_in_its_order(smi, visible, uuids):
    smi.set(gpus=two_gpus())
    q = smi.facts("loaded", visible)["gpu"]
    assert q["error"] is None and [g["uuid"] for g in q["gpus"]] == uuids
    power = {UUID0: 700.0, UUID1: 500.0}
    assert [g["power"]["power.limit"] for g in q["gpus"]] == [power[u] for u in uuids]
    main = [c for c in smi.calls() if any(a.startswith("--query-gpu=index,uuid,driver_version") for a in c)][-1]
    if visible is None:
        assert not any(a.startswith("--id") for a in main)  # the arm does not say: every GPU
    else:
        # only the server's GPUs are read, named by full UUID (nvidia-smi --id takes no prefix)
        assert f"--id={','.join(uuids)}" in main
        assert [s["uuid"] for s in q["selected"]] == uuids
    cap = speedclock.cap_facts({**CPU_NONE, "gpu": q})
    assert cap["gpu_count"] == len(uuids) and cap["gpu0.power.limit"] == power[uuids[0]]


@pytest.mark.parametrize("visible, note", [("", "is empty"), ("7,0", "'7' matches no GPU"),
                                           ("-1", "'-1' matches no GPU"), ("52ddb521", "matches no GPU"),
                                           ("GPU-", "matches more than one GPU")])
def test_cuda_visible_devices_naming_no_gpu(smi, visible, note):
    smi.set(gpus=two_gpus())
    f = smi.facts("idle", visible)
    assert f["gpu"]["gpus"] == [] and f["gpu"]["error"] is None
    assert any(note in n for n in f["gpu"]["notes"]), f["gpu"]["notes"]
    # no cpufreq and no GPU of the server: nothing vouches for its clocks
    assert speedclock.clock_gaps(f) == ["no cpufreq governor or max frequency and no GPU facts "
                                        "(no GPU visible to the server)"]


def test_server_visible_devices_is_the_launched_servers_environment():
    env = {"CUDA_VISIBLE_DEVICES": "2,3", "PATH": "/bin"}
    assert speedgpu.server_visible_devices({"mode": "launch", "env": {"CUDA_VISIBLE_DEVICES": "1"}}, env) == "1"
    assert speedgpu.server_visible_devices({"mode": "launch", "env": {}}, env) == "2,3"   # inherited from the job
    assert speedgpu.server_visible_devices({"mode": "launch", "env": {}}, {}) is None
    assert speedgpu.server_visible_devices({"mode": "attach", "env": {}}, env) is None     # someone else's server


# ----------------------------------------------------------- older drivers, failures

def test_a_driver_without_the_current_names_falls_back_to_the_deprecated_ones(smi):
    smi.set(old_driver=True)
    q = smi.facts("loaded")["gpu"]
    assert q["error"] is None and q["reason_fields"] == "clocks_throttle_reasons"
    assert q["gpus"][0]["active_reasons"] == ["sw_power_cap"] and q["gpus"][0]["counters_us"] is None
    assert set(q["not_reported"]) == {"locked clocks", *(f"clocks_event_reasons_counters.{c}" for c in speedgpu.COUNTERS)}
    assert any("no event-reason counters" in n for n in q["notes"])
    tried = [c[0] for c in smi.calls() if c[0].startswith("--query-gpu=index,uuid,driver")]
    assert "clocks_event_reasons.active" in tried[0] and "clocks_throttle_reasons.active" in tried[-1]
    # the SW power cap under load is still no finding; the counters' absence is said
    before = [smi.facts("idle") for _ in range(3)]
    after = [smi.facts("loaded") for _ in range(3)]
    clock = speedclock.clock_check(before, after=after)
    assert clock["verdict"] == "OK" and clock["power_cap"][0]["sw_power_cap_us"] is None
    assert clock["power_cap"][0]["seen_active"] == ["sw_power_cap"]
    assert any("judged from the active reasons at the two readings only" in n for n in clock["notes"])
    # without counters a slowdown is seen only in the mask: HW thermal slowdown + SW power cap active after
    after[1] = smi.facts("loaded", gpus=[{"clocks_event_reasons.active": "0x0000000000000044"}])
    clock = speedclock.clock_check(before, after=after)
    assert clock["verdict"] == "DIFFERENT"
    assert [(s["start"], s["reason"], s["source"], s["us"]) for s in clock["slowdowns"]] == [
        ("s2", "hw_thermal_slowdown", "active mask", None)]


def test_reasons_without_a_counter_are_judged_from_the_active_mask(smi):
    # HW slowdown (0x8) has no counter on any driver: seen active, it is a slowdown; SW power cap never is
    before = [smi.facts("idle") for _ in range(3)]
    after = [smi.facts("loaded", gpus=[{"clocks_event_reasons.active": m}]) for m in
             ("0x0000000000000004", "0x000000000000000C", "0x0000000000000014")]
    clock = speedclock.clock_check(before, after=after)
    assert [(s["start"], s["reason"], s["source"]) for s in clock["slowdowns"]] == [("s2", "hw_slowdown", "active mask")]
    assert clock["power_cap"][2]["seen_active"] == ["sw_power_cap", "sync_boost"]


def test_a_counter_that_went_down_inside_a_start_is_unverifiable(smi):
    before = [smi.facts("loaded") for _ in range(3)]
    after = [smi.facts("after"), smi.facts("idle"), smi.facts("after")]  # s2: the counters restart at 0
    clock = speedclock.clock_check(before, after=after)
    assert clock["verdict"] == "UNVERIFIABLE" and clock["slowdowns"] == []
    assert [u["start"] for u in clock["unverifiable"]] == ["s2"]
    assert "the sw_power_cap counter went down (22879977 -> 0 us)" in " ".join(clock["unverifiable"][0]["gaps"])


def test_a_field_the_driver_refuses_names_the_field_and_the_driver(smi):
    f = smi.facts("idle", reject=["enforced.power.limit"])
    err = f["gpu"]["error"]
    assert "'enforced.power.limit' is not a valid field to query" in err and "driver 580.159.04" in err
    assert f["gpu"]["driver_version"] == "580.159.04"
    assert speedclock.clock_gaps(f) == [f"gpu: {err}"]
    ok = smi.facts("idle", reject=[])
    # the failed start is unverifiable, not a difference of its (unread) GPU caps
    clock = speedclock.clock_check([ok, f, ok], after=[ok, ok, ok])
    assert clock["verdict"] == "UNVERIFIABLE" and clock["mismatch"] == [] and clock["within_start"] == []
    # a --id the driver does not know (the GPU went away between the two queries)
    smi.set(gpus=two_gpus())
    rc, out = speedgpu._smi(str(smi.exe), ["--query-gpu=index", "--format=csv,noheader", "--id=GPU-0bad"])
    assert rc == 6 and out == "No devices were found"


def test_locked_clocks_are_compared_where_the_driver_has_a_field(tmp_path):
    # a driver that lists a locked-clock field (580 does not): read and compared like any cap
    smi = FakeSmi(tmp_path / "smi-locked", extra_help=["clocks.locked_max.sm"],
                  gpus=[{"clocks.locked_max.sm": "1980"}])
    before = [smi.facts("idle") for _ in range(3)]
    after = [smi.facts("loaded", gpus=[{"clocks.locked_max.sm": v}]) for v in ("1980", "1500", "1980")]
    assert before[0]["gpu"]["gpus"][0]["locked_clocks"] == {"clocks.locked_max.sm": "1980"}
    assert "locked clocks" not in before[0]["gpu"]["not_reported"]
    clock = speedclock.clock_check(before, after=after)
    assert clock["within_start"][0]["start"] == "s2"
    assert clock["within_start"][0]["changed"] == ["gpu0.clocks.locked_max.sm"]
