"""The one ``\\boxed{}`` parser: a math dataset's reference answer and a model's math answer are read alike."""

from __future__ import annotations

import re


def last_boxed(text: str) -> tuple[str, str] | None:
    """Content of the last ``\\boxed{...}`` / ``\\fbox{...}`` (balanced braces), and which command.

    Also accepts the brace-less ``\\boxed 5`` form. An unbalanced last box
    (answer cut off) counts as absent rather than guessing its end.
    """
    best = None
    for found in re.finditer(r"\\(boxed|fbox)\b", text):
        best = found
    if best is None:
        return None
    cmd, pos = best.group(1), best.end()
    rest = text[pos:]
    stripped = rest.lstrip()
    if stripped.startswith("{"):
        start = pos + (len(rest) - len(stripped)) + 1
        depth = 1
        i = start
        while i < len(text):
            c = text[i]
            if c == "\\":
                i += 2  # an escaped brace \{ or \} never opens or closes the box
                continue
            if c == "{":
                depth += 1
            elif c == "}":
                depth -= 1
                if depth == 0:
                    return text[start:i], cmd
            i += 1
        return None
    if rest[:1] == " ":
        m = re.match(r"\s+([^\s$]+)", rest)
        if m:
            return m.group(1), cmd
    return None
