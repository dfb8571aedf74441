"""The change under audit as a first-class object: one server spec, one named set of switches.

A config may state the two arms itself (``arms: {control, candidate}``) or,
in the *change form*, state what they share once and what differs by name::

    server:                       # everything both arms share: the keys of a launch arm
      command: [...]
      env: {...}
      model: ...
      max_model_len: ...
    change:
      name: flashinfer            # [A-Za-z0-9_.+-]+
      description: ...            # optional, one line for the report
      switches:
        - {env: VLLM_USE_FLASHINFER_SAMPLER, rollback: "0", on: "1"}
        - {flag: --attention-backend, rollback: FLASH_ATTN, on: FLASHINFER}
        - {flag: --enforce-eager, rollback: absent, on: present}
        - {env: PAIRAUDIT_REF_SPEC_NGRAM, rollback: "0", on: "4", speculative: true}

The control is the server with every switch at its rollback value, set
explicitly (never left to a default a new build could flip); the candidate
the server with every switch on.  :func:`derive_arms` writes both as
ordinary arm configs into ``config["arms"]`` when the workflow loads, before
the schema and every per-arm check see them, so the rest of the workflow
knows only arms.  Subsets of the switches (:func:`arm_config`) are what the
switch bisection (``pairaudit.bisect``) starts.

A switch is one of:

* ``env: NAME`` -- the variable is set to ``rollback`` in the control and to
  ``on`` in the candidate (a string or a number; quote YAML's booleans);
* ``flag: --name`` -- command-line arguments appended to ``server.command``,
  in the order of the switches: a value gives ``--name VALUE``; the word
  ``absent`` gives nothing (the flag is not passed) and ``present`` the flag
  alone, for boolean flags (``--enforce-eager``).  ``absent`` and
  ``present`` are refused for an env switch: an env switch sets its variable
  in both arms.

``speculative: true`` on a switch marks an arm with that switch on as a
speculative-decoding arm (``arms.<arm>.speculative``: preflight then requires
its draft counters to move); otherwise an arm is speculative when
``server.speculative`` says so.

YAML 1.1 (PyYAML, Snakemake's loader) reads a bare ``on`` key as the boolean
``true``; :func:`derive_arms` reads such a key back as ``on``, so
``{env: X, rollback: "0", on: "1"}`` means what it says.

Checked when the config loads (every problem at once, each naming its key):
the change form needs launch mode (pairaudit sets the switches when it starts
a server); a switch's variable or flag must not also appear in
``server.env`` / ``server.command`` (the change would then be stated twice,
and one of the two would silently win); no two switches set the same
variable or flag; rollback and on differ; ``arms`` and ``server``/``change``
are not given together (a ``--configfile`` merged over a config of the other
form does that: use ``--replace-workflow-config``).  The derived arms then
differ by exactly the change's switches (:func:`arm_differences`).
"""

from __future__ import annotations

import copy
import re
from dataclasses import asdict, dataclass
from typing import Any, Collection, Literal, Mapping, Sequence

ABSENT, PRESENT = "absent", "present"
SWITCH_KINDS: tuple[Literal["env", "flag"], ...] = ("env", "flag")
_NAME_RE = re.compile(r"^[A-Za-z0-9_.+-]+$")
_ENV_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
SWITCH_KEYS = ("env", "flag", "rollback", "on", "speculative")
CHANGE_KEYS = ("name", "description", "switches")
ARMS = ("control", "candidate")



@dataclass(frozen=True)
class Switch:
    """One switch of a change: an environment variable or a command-line flag, with both values."""

    kind: Literal["env", "flag"]
    name: str                      # the variable, or the flag as written (--attention-backend)
    rollback: str                  # the control's value; for a flag also "absent" / "present"
    on: str                        # the candidate's value
    speculative: bool = False      # an arm with this switch on is a speculative-decoding arm

    def value(self, on: bool) -> str:
        return self.on if on else self.rollback

    def tokens(self, on: bool) -> list[str]:
        """A flag switch's command-line arguments in one arm (nothing for an env switch)."""
        if self.kind != "flag":
            return []
        v = self.value(on)
        if v == ABSENT:
            return []
        if v == PRESENT:
            return [self.name]
        return [self.name, v]

    def describe(self, on: bool) -> str:
        """How this switch reads in one arm: ``VAR=1``, ``--flag VALUE``, ``--flag``, ``no --flag``."""
        if self.kind == "env":
            return f"{self.name}={self.value(on)}"
        toks = self.tokens(on)
        return " ".join(toks) if toks else f"no {self.name}"

    def to_json(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Change:
    """A named change: the switches that turn it on (in the order given)."""

    name: str
    switches: tuple[Switch, ...]
    description: str | None = None

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.switches]

    def to_json(self) -> dict:
        return {"name": self.name, "description": self.description,
                "switches": [s.to_json() for s in self.switches]}


# ------------------------------------------------------------------ parsing


class ChangeError(ValueError):
    """A change that cannot become two arms; the message names every problem's key."""

def _scalar(v: Any) -> bool:
    return isinstance(v, (str, int, float)) and not isinstance(v, bool)


def normalize_switch_keys(change_cfg: Any) -> None:
    """Read YAML 1.1's boolean key ``true`` (a bare ``on:``) back as ``on``, in place."""
    switches = change_cfg.get("switches") if isinstance(change_cfg, dict) else None
    for sw in switches if isinstance(switches, list) else []:
        if isinstance(sw, dict) and True in sw and "on" not in sw:
            sw["on"] = sw.pop(True)


def _flag_in_command(flag: str, command: Sequence[Any]) -> int | None:
    for i, a in enumerate(command):
        if isinstance(a, str) and (a == flag or a.startswith(flag + "=")):
            return i
    return None


def parse_change(change_cfg: Any, server: Mapping[str, Any] | None = None, *,
                 where: str = "change") -> tuple[Change | None, list[str]]:
    """The change, or None and the problems (each naming its key, the value and what is allowed).

    With ``server``, a switch whose variable or flag the server also sets is a problem.
    """
    problems: list[str] = []
    if not isinstance(change_cfg, dict):
        return None, [f"{where}: must be a mapping with name and switches, got {type(change_cfg).__name__}"]
    normalize_switch_keys(change_cfg)
    for k in change_cfg:
        if k not in CHANGE_KEYS:
            problems.append(f"{where}: unknown key {k!r} (allowed: {', '.join(CHANGE_KEYS)})")
    name = change_cfg.get("name")
    if not isinstance(name, str) or not _NAME_RE.match(name):
        problems.append(f"{where}.name: {name!r} (allowed: a name of letters, digits and _ . + -)")
    desc = change_cfg.get("description")
    if desc is not None and not isinstance(desc, str):
        problems.append(f"{where}.description: {desc!r} (allowed: a string)")
    raw = change_cfg.get("switches")
    if not isinstance(raw, list) or not raw:
        problems.append(f"{where}.switches: {raw!r} (allowed: a non-empty list of switches, each "
                        f"{{env: NAME, rollback: V, on: V}} or {{flag: --NAME, rollback: V, on: V}})")
        return None, problems
    server = server if isinstance(server, Mapping) else {}
    env_cfg, command_cfg = server.get("env"), server.get("command")
    server_env: Mapping[str, Any] = env_cfg if isinstance(env_cfg, Mapping) else {}
    command: list[Any] = command_cfg if isinstance(command_cfg, list) else []
    seen: dict[tuple[str, str], int] = {}
    switches: list[Switch] = []
    for i, sw in enumerate(raw):
        w = f"{where}.switches[{i}]"
        if not isinstance(sw, dict):
            problems.append(f"{w}: {sw!r} (allowed: a mapping {{env|flag, rollback, on}})")
            continue
        bad = [k for k in sw if k not in SWITCH_KEYS]
        if bad:
            problems.append(f"{w}: unknown key {bad[0]!r} (allowed: {', '.join(SWITCH_KEYS)})")
            continue
        kinds = [k for k in SWITCH_KINDS if k in sw]
        if len(kinds) != 1:
            problems.append(f"{w}: give exactly one of env, flag (got {', '.join(kinds) or 'neither'})")
            continue
        kind = kinds[0]
        target = sw[kind]
        if kind == "env" and not (isinstance(target, str) and _ENV_RE.match(target)):
            problems.append(f"{w}.env: {target!r} (allowed: an environment variable name, [A-Za-z_][A-Za-z0-9_]*)")
            continue
        if kind == "flag" and not (isinstance(target, str) and re.match(r"^--?[A-Za-z0-9]", target)
                                   and " " not in target and "=" not in target):
            problems.append(f"{w}.flag: {target!r} (allowed: a command-line flag such as --attention-backend, "
                            "without a value)")
            continue
        values = {}
        for key in ("rollback", "on"):
            v = sw.get(key)
            if key not in sw:
                problems.append(f"{w}.{key}: missing (allowed: a string or number"
                                + (", or absent / present" if kind == "flag" else "") + ")")
            elif not _scalar(v):
                problems.append(f"{w}.{key}: {v!r} (allowed: a string or number; quote YAML's booleans, "
                                "e.g. \"1\" or \"true\")")
            elif kind == "env" and str(v) in (ABSENT, PRESENT):
                problems.append(f"{w}.{key}: {v!r} is for flag switches (allowed for env {target}: its explicit "
                                "value; an env switch is set in both arms, never left to the server's default)")
            else:
                values[key] = str(v)
        spec = sw.get("speculative", False)
        if not isinstance(spec, bool):
            problems.append(f"{w}.speculative: {spec!r} (allowed: true, false)")
            continue
        if len(values) != 2:
            continue
        if values["rollback"] == values["on"]:
            problems.append(f"{w}: rollback and on are both {values['on']!r} (allowed: two different values: a "
                            "switch that changes nothing is not part of the change)")
            continue
        if (kind, target) in seen:
            problems.append(f"{w}.{kind}: {target} is already switched by {where}.switches[{seen[kind, target]}] "
                            "(allowed: each variable or flag once)")
            continue
        if kind == "env" and target in server_env:
            problems.append(f"{w}.env: {target} is also set in server.env (allowed: a variable server.env does "
                            f"not set: the change sets it in both arms; remove it from server.env)")
            continue
        if kind == "flag" and _flag_in_command(target, command) is not None:
            problems.append(f"{w}.flag: {target} is also in server.command "
                            f"(server.command[{_flag_in_command(target, command)}]; allowed: a flag server.command "
                            "does not pass: the change passes it in both arms; remove it from server.command)")
            continue
        seen[kind, target] = i
        switches.append(Switch(kind=kind, name=target, rollback=values["rollback"], on=values["on"],
                               speculative=spec))
    if problems or not isinstance(name, str):   # a name that is no string is already a problem
        return None, problems
    return Change(name=name, switches=tuple(switches), description=desc), []


# ------------------------------------------------------------------ arms

def arm_config(server: Mapping[str, Any], change: Change, on: Collection[str]) -> dict:
    """The arm config of ``server`` with the switches named in ``on`` on and every other at rollback.

    Env switches are added to ``server.env`` (after the server's own
    variables), flag switches appended to ``server.command`` in the order of
    the change; ``speculative`` is always set explicitly.  The keys keep the
    server's order (``env`` right after ``command`` when the server has none),
    so a config rewritten into the change form derives arms equal to the
    ones it used to state.
    """
    unknown = set(on) - set(change.names)
    if unknown:
        raise ValueError(f"no switch named {sorted(unknown)} in change {change.name!r} (switches: {change.names})")
    env = {**(server.get("env") or {})}
    command = list(server.get("command") or [])
    for s in change.switches:
        if s.kind == "env":
            env[s.name] = s.value(s.name in on)
        else:
            command += s.tokens(s.name in on)
    speculative = bool(server.get("speculative", False)) or any(s.speculative and s.name in on
                                                                 for s in change.switches)
    arm: dict = {}
    for key, value in server.items():
        if key == "command":
            arm["command"] = command
            if "env" not in server and env:
                arm["env"] = env
        elif key == "env":
            arm["env"] = env
        elif key == "speculative":
            arm["speculative"] = speculative
        else:
            arm[key] = copy.deepcopy(value)
    if "command" not in arm:
        arm["command"] = command
    if "env" not in arm and env:
        arm["env"] = env
    arm.setdefault("speculative", speculative)
    return arm


def arms_for(server: Mapping[str, Any], change: Change) -> dict[str, dict]:
    """The two arms: the control with every switch at rollback, the candidate with every switch on."""
    return {"control": arm_config(server, change, ()), "candidate": arm_config(server, change, change.names)}


def arm_differences(control: Mapping[str, Any], candidate: Mapping[str, Any]) -> dict:
    """What differs between two arm configs: ``{"env": [names], "command": bool, "other": [keys]}``."""
    ce, ke = control.get("env") or {}, candidate.get("env") or {}
    return {"env": sorted(k for k in set(ce) | set(ke) if str(ce.get(k)) != str(ke.get(k)) or (k in ce) != (k in ke)),
            "command": list(control.get("command") or []) != list(candidate.get("command") or []),
            "other": sorted(k for k in (set(control) | set(candidate)) - {"env", "command"}
                            if control.get(k) != candidate.get(k))}


def _check_derived(change: Change, arms: Mapping[str, dict]) -> list[str]:
    """The derived arms differ by exactly the change's switches (a guard on :func:`arm_config`)."""
    diff = arm_differences(arms["control"], arms["candidate"])
    want_env = sorted(s.name for s in change.switches if s.kind == "env")
    problems = []
    if diff["env"] != want_env:
        problems.append(f"change: the derived arms' env differs in {diff['env']}, the change switches {want_env}")
    if diff["command"] != any(s.kind == "flag" for s in change.switches):
        problems.append("change: the derived arms' commands differ although no flag switch does (or the reverse)")
    extra = [k for k in diff["other"] if not (k == "speculative" and any(s.speculative for s in change.switches))]
    if extra:
        problems.append(f"change: the derived arms also differ in {extra}")
    return problems


def derive_arms(config: dict) -> list[str]:
    """Write ``config["arms"]`` from ``server`` + ``change`` (in place); the problems, [] when fine.

    A config in the two-arm form (``arms``, no ``server``/``change``) is left
    as it is; a config with neither is the schema's and the load check's to
    report.
    """
    if is_sweep(config):
        return _derive_sweep(config)
    has = [k for k in ("arms", "server", "change") if k in config]
    if "arms" in config and ("server" in config or "change" in config):
        return [f"{' and '.join(has)}: both forms at once (allowed: either arms (control and candidate) or server + "
                "change, which derives them); a --configfile in one form merged over a config in the other does "
                "this: pass --replace-workflow-config"]
    if "server" not in config and "change" not in config:
        return []
    if "server" not in config or "change" not in config:
        missing = "server" if "server" not in config else "change"
        return [f"{missing}: missing (allowed: server and change together; the change form needs both)"]
    server = config["server"]
    problems: list[str] = []
    if not isinstance(server, dict):
        return [f"server: must be a mapping of the keys of a launch arm, got {type(server).__name__}"]
    if server.get("mode", "launch") != "launch":
        problems.append(f"server.mode: {server.get('mode')!r} (allowed: launch: in the change form pairaudit starts "
                        "each arm's server and sets the change's switches; to audit running servers use arms: with "
                        "mode attach)")
    change, change_problems = parse_change(config["change"], server)
    problems += change_problems
    if problems or change is None:   # no change comes back without a problem
        return problems
    arms = arms_for(server, change)
    problems = _check_derived(change, arms)
    if not problems:
        config["arms"] = arms
    return problems


# ------------------------------------------------------------------ sweeps

SWEEP_KEY = "candidates"
CONTROL = "control"
# A candidate's name is an arm name: a path component and a Snakemake wildcard value (no leading dot or dash).
_CANDIDATE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")


def is_sweep(config: Mapping[str, Any]) -> bool:
    """Does the config name several candidates against one control (``server`` + ``candidates``)?"""
    return SWEEP_KEY in config


def _switch_key(s: Switch) -> tuple[str, str]:
    return s.kind, s.name


def _sweep_switches(changes: Sequence[Change]) -> tuple[list[Switch], list[str]]:
    """Every switch any candidate turns, once, in first-seen order: what the control sets at rollback.

    Two candidates may turn the same variable or flag to different values (two quantizations of one
    flag), but the shared control can hold only one rollback value for it.
    """
    union: dict[tuple[str, str], tuple[Switch, str]] = {}
    problems = []
    for i, ch in enumerate(changes):
        for j, s in enumerate(ch.switches):
            seen = union.get(_switch_key(s))
            if seen is None:
                union[_switch_key(s)] = (s, f"candidates[{i}].switches[{j}]")
            elif seen[0].rollback != s.rollback:
                problems.append(f"candidates[{i}].switches[{j}].rollback: {s.name} rolls back to {s.rollback!r}, "
                                f"{seen[1]} to {seen[0].rollback!r} (allowed: one rollback value per variable or "
                                "flag: every candidate is compared to the same control)")
    return [s for s, _ in union.values()], problems


def candidate_arm(server: Mapping[str, Any], union: Sequence[Switch], change: Change) -> dict:
    """One candidate's arm: its own switches on, every other candidate's at rollback (as in the control)."""
    own = {_switch_key(s): s for s in change.switches}
    merged = Change(name=change.name, switches=tuple(own.get(_switch_key(s), s) for s in union),
                    description=change.description)
    return arm_config(server, merged, change.names)


def _stated_rollbacks(server: Any, cfg: Any, where: str) -> tuple[Any, list[str]]:
    """``server`` without the variables ``cfg`` switches whose rollback value server.env already states; the
    problems where it states another value.

    In a sweep, server.env may state a switch's variable at its rollback value: the control is then the
    same server whichever candidates are listed, so adding or removing a candidate changes no control
    work (a variable only a switch sets is added to the control with the switch, changing it).
    """
    env = server.get("env") if isinstance(server, dict) else None
    switches = cfg.get("switches") if isinstance(cfg, dict) else None
    if not isinstance(env, dict) or not isinstance(switches, list):
        return server, []
    normalize_switch_keys(cfg)
    stated, problems = set(), []
    for j, sw in enumerate(switches):
        var = sw.get("env") if isinstance(sw, dict) else None
        if not isinstance(var, str) or var not in env or "rollback" not in sw:
            continue
        if str(env[var]) != str(sw["rollback"]):
            problems.append(f"{where}.switches[{j}].rollback: {sw['rollback']!r}, but server.env sets {var} to "
                            f"{env[var]!r} (allowed: in a sweep server.env may state a switch's variable only at "
                            "its rollback value: the control's)")
        stated.add(var)
    if not stated:
        return server, problems
    return {**server, "env": {k: v for k, v in env.items() if k not in stated}}, problems


def parse_sweep(server: Any, raw: Any) -> tuple[list[Change], list[str]]:
    """The candidates of a sweep, or the problems: each candidate as the change section, names unique and
    safe as paths, none named like the control, none empty, no two with the same switches and values."""
    if not isinstance(raw, list) or not raw:
        return [], [f"{SWEEP_KEY}: {raw!r} (allowed: a non-empty list of changes, each with name and switches)"]
    changes: list[Change] = []
    problems: list[str] = []
    names: dict[str, int] = {}
    same: dict[frozenset, int] = {}
    for i, cfg in enumerate(raw):
        where = f"{SWEEP_KEY}[{i}]"
        own_server, stated = _stated_rollbacks(server, cfg, where)
        problems += stated
        ch, ps = parse_change(cfg, own_server, where=where)
        problems += ps
        name = cfg.get("name") if isinstance(cfg, dict) else None
        if isinstance(name, str):
            if name == CONTROL:
                problems.append(f"{where}.name: {name!r} is the control's arm name (allowed: any other name)")
            elif not _CANDIDATE_RE.match(name):
                problems.append(f"{where}.name: {name!r} is no safe arm name (allowed: letters, digits and _ . + -, "
                                "starting with a letter or digit)")
            elif name in names:
                problems.append(f"{where}.name: {name!r} is already the name of {SWEEP_KEY}[{names[name]}] "
                                "(allowed: a name no other candidate has)")
            else:
                names[name] = i
        if ch is None:
            continue
        key = frozenset((s.kind, s.name, s.rollback, s.on) for s in ch.switches)
        if key in same:
            problems.append(f"{where}: {ch.name!r} has the same switches and values as {SWEEP_KEY}[{same[key]}] "
                            f"{changes[same[key]].name!r} (allowed: candidates that differ from each other)")
            continue
        same.setdefault(key, len(changes))
        changes.append(ch)
    return changes, problems


def sweep_arms(server: Mapping[str, Any], changes: Sequence[Change]) -> tuple[dict[str, dict], list[str]]:
    """control (every candidate's switches at rollback) + one arm per candidate, named by it; the problems."""
    union, problems = _sweep_switches(changes)
    if problems:
        return {}, problems
    control_change = Change(name=CONTROL, switches=tuple(union))
    arms = {CONTROL: arm_config(server, control_change, ())}
    for ch in changes:
        arms[ch.name] = candidate_arm(server, union, ch)
        problems += [p.replace("change:", f"{SWEEP_KEY} {ch.name}:", 1)
                     for p in _check_derived(ch, {"control": arms[CONTROL], "candidate": arms[ch.name]})]
    return arms, problems


def candidate_names(config: Mapping[str, Any]) -> list[str]:
    """The sweep's candidates in config order; ``["candidate"]`` for a two-arm config."""
    if not is_sweep(config):
        return ["candidate"]
    return [c["name"] for c in config[SWEEP_KEY]]


def candidate_config(config: Mapping[str, Any], name: str) -> dict:
    """The two-arm config the sweep's candidate ``name`` would have on its own: ``change`` its change,
    ``server`` the sweep's with every other candidate's switches at rollback (as the shared control sets
    them), ``arms`` the shared control and its arm as the candidate (what its decision and bisection read)."""
    if not is_sweep(config):
        return dict(config)
    raw = next((c for c in config[SWEEP_KEY] if c.get("name") == name), None)
    if raw is None:
        raise KeyError(f"no candidate {name!r} in this sweep (candidates: {candidate_names(config)})")
    out = {k: v for k, v in config.items() if k not in (SWEEP_KEY, "arms")}
    out["change"] = copy.deepcopy(raw)
    changes, problems = parse_sweep(config.get("server"), copy.deepcopy(config[SWEEP_KEY]))
    if problems:
        raise ChangeError("\n".join(problems))
    union, _ = _sweep_switches(changes)
    own = {_switch_key(s) for c in changes if c.name == name for s in c.switches}
    others = Change(name=CONTROL, switches=tuple(s for s in union if _switch_key(s) not in own))
    base, _ = _stated_rollbacks(config["server"], copy.deepcopy(raw), SWEEP_KEY)
    out["server"] = arm_config(base, others, ()) if others.switches else copy.deepcopy(base)
    arms = config.get("arms") or {}
    if CONTROL in arms and name in arms:
        out["arms"] = {"control": copy.deepcopy(arms[CONTROL]), "candidate": copy.deepcopy(arms[name])}
    return out


def _derive_sweep(config: dict) -> list[str]:
    """``config["arms"]`` from ``server`` + ``candidates`` (in place); the problems, [] when fine."""
    both = [k for k in ("arms", "change") if k in config]
    if both:
        return [f"{' and '.join(both)} and {SWEEP_KEY}: two forms at once (allowed: {SWEEP_KEY} with server only; "
                "a --configfile in one form merged over a config in another does this: pass "
                "--replace-workflow-config)"]
    server = config.get("server")
    if not isinstance(server, dict):
        return [f"server: {'missing' if server is None else type(server).__name__} (allowed: a mapping of the keys "
                f"of a launch arm: {SWEEP_KEY} derive every arm from it)"]
    problems: list[str] = []
    if server.get("mode", "launch") != "launch":
        problems.append(f"server.mode: {server.get('mode')!r} (allowed: launch: pairaudit starts each arm's server "
                        "and sets its candidate's switches)")
    changes, sweep_problems = parse_sweep(server, config[SWEEP_KEY])
    problems += sweep_problems
    if problems:
        return problems
    arms, problems = sweep_arms(server, changes)
    if not problems:
        config["arms"] = arms
    return problems


def from_config(config: Mapping[str, Any]) -> Change | None:
    """The config's change (already checked at load), or None in the two-arm form."""
    if not isinstance(config.get("change"), dict):
        return None
    change, problems = parse_change(copy.deepcopy(config["change"]), config.get("server"))
    if problems:
        raise ChangeError("\n".join(problems))
    return change


# ------------------------------------------------------------ the record

def _flag_shown(switch: Switch, value: str, command: Sequence[str]) -> bool:
    """Does a launched command pass the flag switch as ``value`` (absent, present, or its value)?"""
    i = _flag_in_command(switch.name, command)
    if value == ABSENT:
        return i is None
    if i is None:
        return False
    if value == PRESENT:
        return command[i] == switch.name
    return command[i] == f"{switch.name}={value}" or (command[i] == switch.name and i + 1 < len(command)
                                                       and command[i + 1] == value)


def receipt_problems(change: Change, launch: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Where the launch receipts do not show the change's switches as the change states them."""
    problems = []
    for arm in ARMS:
        rec = launch.get(arm) or {}
        on = arm == "candidate"
        env = rec.get("env") or {}
        command = [str(a) for a in (rec.get("command_identity") or rec.get("command") or [])]
        for s in change.switches:
            want = s.value(on)
            if s.kind == "env":
                got = env.get(s.name)
                if got is None or str(got) != want:
                    problems.append(f"the {arm}'s launch receipt has {s.name}={got!r}, the change sets {want!r}")
            elif "{" not in want:  # a placeholder value is resolved in the receipt: not compared
                if not _flag_shown(s, want, command):
                    problems.append(f"the {arm}'s launch receipt does not show {s.describe(on)!r} in its command")
    return problems


def decision_record(config: Mapping[str, Any] | None, launch: Mapping[str, Mapping[str, Any]]) -> dict | None:
    """decision.json's ``change``: the change's name and switches, and whether the receipts show them."""
    change = from_config(config or {})
    if change is None:
        return None
    problems = receipt_problems(change, launch)
    return {**change.to_json(), "control": "every switch at its rollback value",
            "candidate": "every switch on", "receipts_agree": not problems, "receipt_problems": problems}
