"""What the code formats share: reading the code out of a reply (the program the sandbox then runs)."""

from __future__ import annotations

import re

_FENCE = re.compile(r"```([A-Za-z0-9_+-]*)[ \t]*\n(.*?)```", re.S)


def extract_code(text: str) -> tuple[str, str]:
    """Code from the LAST ```python block, else the last ``` block, else an unclosed fence, else the raw text."""
    blocks = _FENCE.findall(text)
    py = [body for lang, body in blocks if lang.lower() in ("python", "py", "python3")]
    if py:
        return py[-1], "fenced-python"
    if blocks:
        return blocks[-1][1], "fenced"
    m = None
    for m in re.finditer(r"```[A-Za-z0-9_+-]*[ \t]*\n", text):
        pass
    if m is not None:
        # Output cut off (or fence never closed): everything after the last opener.
        return text[m.end():], "unclosed-fence"
    return text, "raw"
