"""The reference server's environment switches, parsed without importing torch.

The workflow checks an arm's switches when it loads the config (before any
server starts), so the parsing lives here, apart from the engine.

Every switch has a *rollback value*: the value that restores the plain
reference server (fp32, eager on a CPU, no speculation, no planted fault).
For all but one switch the default is the rollback value, so an arm that sets
nothing is the reference. ``PAIRAUDIT_REF_CUDA_GRAPHS`` is the exception: CUDA
graphs are on by default (eager decode of this model on a GPU is bound by
kernel launches), and 0 rolls back to eager.

``PAIRAUDIT_REF_STEP_DELAY_US`` is a calibration switch, not an acceleration
flag: it plants a known slowdown of every decode step, so a run can check that
the speed gate sees a change of known size (the delay in the candidate) or a
known speedup (the delay in the control).

The numeric switches each change one place of the forward pass, independently
of the others, and deterministically; every one of them except TF32 moves the
logits on a CPU too, so a bisection over switches can be exercised without a
GPU.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from typing import Any, Mapping

PREFIX = "PAIRAUDIT_REF_"
SDPA_BACKENDS = ("auto", "math", "flash", "efficient")
DEVICES = ("cpu", "cuda")
DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class Switch:
    """One environment switch: how it parses, its default and rollback values, what it touches."""

    name: str
    kind: str  # "count" (integer >= 0), "flag" (0 or 1), "number" (float >= 0), "choice" (one of ``choices``)
    default: object
    rollback: object
    allowed: str
    touches: str  # "numerics", "decoding", "speed" or "fault": what a change of it can change
    cpu: bool  # whether it has an effect on a CPU server
    choices: tuple[str, ...] = ()


_ALL = (
    Switch("PAIRAUDIT_REF_LM_HEAD_BF16", "count", 0, 0, "a non-negative integer (0 = off, 1 = on)", "numerics", True),
    Switch("PAIRAUDIT_REF_ATTN_BF16", "flag", 0, 0, "0 (attention in the model dtype) or 1 (in bfloat16)",
           "numerics", True),
    Switch("PAIRAUDIT_REF_MLP_BF16", "flag", 0, 0, "0 (MLP projections in the model dtype) or 1 (in bfloat16)",
           "numerics", True),
    Switch("PAIRAUDIT_REF_RMSNORM_BF16", "flag", 0, 0, "0 (the fused norm, fp32 reduction) or 1 (all in bfloat16)",
           "numerics", True),
    Switch("PAIRAUDIT_REF_SDPA_BACKEND", "choice", "auto", "auto",
           "one of auto, math, flash, efficient (auto = torch's own choice)", "numerics", True, SDPA_BACKENDS),
    Switch("PAIRAUDIT_REF_TF32", "flag", 0, 0, "0 (IEEE fp32 matmuls) or 1 (TF32 matmuls; CUDA only)", "numerics",
           False),
    Switch("PAIRAUDIT_REF_CUDA_GRAPHS", "flag", 1, 0, "1 (decode steps replayed from CUDA graphs) or 0 (eager)",
           "speed", False),
    Switch("PAIRAUDIT_REF_STEP_DELAY_US", "count", 0, 0, "a non-negative integer of microseconds (0 = off)", "speed",
           True),
    Switch("PAIRAUDIT_REF_SPEC_NGRAM", "count", 0, 0, "a non-negative integer K (0 = off)", "decoding", True),
    Switch("PAIRAUDIT_REF_FAULT_TAIL", "count", 0, 0, "a non-negative integer N (0 = off)", "fault", True),
    Switch("PAIRAUDIT_REF_FAULT_NOISE", "number", 0.0, 0.0, "a non-negative number (0 = off)", "fault", True),
)
SWITCHES: dict[str, Switch] = {s.name: s for s in _ALL}
# The switches that change numbers rather than scheduling or speed: what a switch bisection walks.
NUMERIC = tuple(s.name for s in _ALL if s.touches == "numerics")


def parse_switch(name: str, raw: str):
    """The value of one switch, or ValueError naming it, its value and what is allowed."""
    sw = SWITCHES[name]
    text = raw.strip()
    if text == "":
        return sw.default
    if sw.kind == "choice":
        if text not in sw.choices:
            raise ValueError(f"{name}={raw!r}: expected {sw.allowed}")
        return text
    conv = float if sw.kind == "number" else int
    try:
        value = conv(text)
    except ValueError:
        raise ValueError(f"{name}={raw!r}: expected {conv.__name__} ({sw.allowed})") from None
    if value < 0:
        raise ValueError(f"{name}={raw!r}: must be >= 0 ({sw.allowed})")
    if sw.kind == "flag" and value not in (0, 1):
        raise ValueError(f"{name}={raw!r}: must be 0 or 1 ({sw.allowed})")
    return value


def check_env(env: dict) -> list[str]:
    """Problems with the reference-server switches in ``env`` (unknown names, bad values); [] if none."""
    problems = []
    for name, raw in env.items():
        if not name.startswith(PREFIX):
            continue
        if name not in SWITCHES:
            problems.append(f"{name}: not a switch of the reference server (known: {', '.join(SWITCHES)})")
            continue
        try:
            parse_switch(name, str(raw))
        except ValueError as exc:
            problems.append(str(exc))
    return problems


@dataclass(frozen=True)
class Switches:
    """Environment switches that stand in for acceleration flags and planted defects."""

    lm_head_bf16: bool = False
    spec_ngram: int = 0
    fault_tail: int = 0
    fault_noise: float = 0.0
    attn_bf16: bool = False
    mlp_bf16: bool = False
    rmsnorm_bf16: bool = False
    sdpa_backend: str = "auto"
    tf32: bool = False
    cuda_graphs: bool = True
    step_delay_us: int = 0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "Switches":
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        for f in fields(cls):
            value = parse_switch(_env_name(f.name), env.get(_env_name(f.name), ""))
            values[f.name] = bool(value) if f.type in ("bool", bool) else value
        return cls(**values)

    @classmethod
    def rollback(cls) -> "Switches":
        """Every switch at its rollback value: the plain reference server."""
        return cls(**{f.name: _typed(f, SWITCHES[_env_name(f.name)].rollback) for f in fields(cls)})

    def as_env(self) -> dict[str, str]:
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool):
                text = str(int(value))
            elif isinstance(value, float):
                text = repr(value) if value else "0"
            else:
                text = str(value)
            out[_env_name(f.name)] = text
        # the order of the table above (the documented order), whatever the field order
        return {name: out[name] for name in SWITCHES}

    def device_problems(self, device: str | None, dtype: str | None) -> list[str]:
        """Switch values that cannot run on ``device`` with model ``dtype`` (None: not known yet)."""
        problems = []
        if device == "cpu":
            if self.tf32:
                problems.append("PAIRAUDIT_REF_TF32=1: TF32 is a mode of CUDA matmuls; a CPU server has none "
                                "(allowed on --device cpu: 0)")
            if self.sdpa_backend == "efficient":
                problems.append("PAIRAUDIT_REF_SDPA_BACKEND=efficient: the memory-efficient kernel is CUDA only "
                                "(allowed on --device cpu: auto, math, flash)")
        if device == "cuda" and self.sdpa_backend == "flash" and dtype == "float32" and not self.attn_bf16:
            problems.append("PAIRAUDIT_REF_SDPA_BACKEND=flash: flash attention has no float32 kernel on CUDA "
                            "(allowed with --dtype float32: auto, math, efficient; or set PAIRAUDIT_REF_ATTN_BF16=1, "
                            "or --dtype bfloat16/float16)")
        return problems


_FIELD_TO_ENV = {"lm_head_bf16": "LM_HEAD_BF16", "spec_ngram": "SPEC_NGRAM", "fault_tail": "FAULT_TAIL",
                 "fault_noise": "FAULT_NOISE", "attn_bf16": "ATTN_BF16", "mlp_bf16": "MLP_BF16",
                 "rmsnorm_bf16": "RMSNORM_BF16", "sdpa_backend": "SDPA_BACKEND", "tf32": "TF32",
                 "cuda_graphs": "CUDA_GRAPHS", "step_delay_us": "STEP_DELAY_US"}


def _env_name(field_name: str) -> str:
    return PREFIX + _FIELD_TO_ENV[field_name]


def _typed(f, value):
    return bool(value) if f.type in ("bool", bool) else value


def command_option(argv: list[str], option: str) -> str | None:
    """The value of ``--option V`` or ``--option=V`` in a command line, else None."""
    for i, arg in enumerate(argv):
        if arg == option and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(option + "="):
            return arg.split("=", 1)[1]
    return None


def check_arm(env: dict, argv: list[str]) -> list[str]:
    """``check_env`` plus the switches' fit to the ``--device`` / ``--dtype`` an arm's command names.

    A device of ``auto`` (or none given: auto is the default) is only known at
    start, where the server makes the same check and exits with it.
    """
    problems = check_env(env)
    if problems:
        return problems
    device = command_option(argv, "--device")
    dtype = command_option(argv, "--dtype") or "float32"
    if device is not None and device not in (*DEVICES, "auto"):
        return [f"--device {device}: expected one of cpu, cuda, auto"]
    if dtype not in DTYPES:
        return [f"--dtype {dtype}: expected one of {', '.join(DTYPES)}"]
    sw = Switches.from_env({k: str(v) for k, v in env.items() if k in SWITCHES})
    return sw.device_problems(device if device in DEVICES else None, dtype)
