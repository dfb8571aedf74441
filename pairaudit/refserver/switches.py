"""The reference server's environment switches, parsed without importing torch.

The workflow checks an arm's switches when it loads the config (before any
server starts), so the parsing lives here, apart from the engine.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping

# name -> (converter, default, what is allowed)
SWITCHES = {
    "PAIRAUDIT_REF_LM_HEAD_BF16": (int, 0, "a non-negative integer (0 = off, 1 = on)"),
    "PAIRAUDIT_REF_SPEC_NGRAM": (int, 0, "a non-negative integer K (0 = off)"),
    "PAIRAUDIT_REF_FAULT_TAIL": (int, 0, "a non-negative integer N (0 = off)"),
    "PAIRAUDIT_REF_FAULT_NOISE": (float, 0.0, "a non-negative number (0 = off)"),
}
PREFIX = "PAIRAUDIT_REF_"


def parse_switch(name: str, raw: str):
    """The value of one switch, or ValueError naming it, its value and what is allowed."""
    conv, default, allowed = SWITCHES[name]
    if raw.strip() == "":
        return default
    try:
        value = conv(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r}: expected {conv.__name__} ({allowed})") from None
    if value < 0:
        raise ValueError(f"{name}={raw!r}: must be >= 0 ({allowed})")
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

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "Switches":
        env = os.environ if env is None else env

        def get(name):
            return parse_switch(name, env.get(name, ""))

        return cls(
            lm_head_bf16=bool(get("PAIRAUDIT_REF_LM_HEAD_BF16")),
            spec_ngram=get("PAIRAUDIT_REF_SPEC_NGRAM"),
            fault_tail=get("PAIRAUDIT_REF_FAULT_TAIL"),
            fault_noise=get("PAIRAUDIT_REF_FAULT_NOISE"),
        )

    def as_env(self) -> dict[str, str]:
        return {
            "PAIRAUDIT_REF_LM_HEAD_BF16": str(int(self.lm_head_bf16)),
            "PAIRAUDIT_REF_SPEC_NGRAM": str(self.spec_ngram),
            "PAIRAUDIT_REF_FAULT_TAIL": str(self.fault_tail),
            "PAIRAUDIT_REF_FAULT_NOISE": repr(self.fault_noise) if self.fault_noise else "0",
        }
