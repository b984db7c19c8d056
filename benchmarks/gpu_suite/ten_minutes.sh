#!/bin/bash
# The GPU suite in about ten minutes of one GPU, in the order benchmarks/README.md gives
# ("The GPU suite"), so that nothing timed shares the device:
#
#   benchmarks/gpu_suite/ten_minutes.sh first OUT [TREE...]   # about 9 minutes
#   benchmarks/gpu_suite/ten_minutes.sh then OUT               # on the same machine, about 3 minutes
#
# first: decode_trees over TREE... and this checkout (checkouts made with
# `git archive COMMIT seqtrans benchmarks | tar -x -C TREE`), the decode_speed and train_mfu
# parts at beam 4, then Multi30k base for 6 minutes in the background with torchrun_resume
# and the GPU tests beside it. then: seqtrans serve on the GPU with that Multi30k run, and
# the compiled training step. Results files and logs go to OUT.
#
# $DEADLINE_S: the seconds the first stage may take in all (default 590); the Multi30k run
# trains for 6 minutes, or less where the timed parts before it left less time.
# $WHEELS: a directory of wheels to install first (seqtrans and its plugins for their entry
# points, and what the machine lacks), for a machine without a package index;
# $SEQTRANS_MIRROR: a directory with Multi30k's files; $WORK: where the runs go (/tmp/gpu-work).
set -u
stage=${1:?first or then}
OUT=${2:?a directory for the results}
shift 2
mkdir -p "$OUT"
T0=$(date +%s)
say() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
cd "$(dirname "$0")/../.."
PY=${PY:-python3}
WORK=${WORK:-/tmp/gpu-work}
if [ -n "${WHEELS:-}" ] && [ ! -d "$WORK/site/seqtrans" ]; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$WORK/site" "$WHEELS"/*.whl || exit 1
fi
export PATH=$WORK/site/bin:$PATH
export PYTHONPATH=$PWD:$PWD/plugins/copy:$PWD/plugins/translation:$WORK/site
export PYTHONUNBUFFERED=1
export SEQTRANS_CACHE_DIR=${SEQTRANS_CACHE_DIR:-$WORK/cache}

if [ "$stage" = first ]; then
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/machine.txt" 2>&1
    say "decode_trees"
    timeout 150 $PY -m benchmarks decode_trees "$@" . --cases base-beam4-b32 --precisions fp32 bf16 \
        --repeats 3 --rounds 2 --sync-trace --device cuda --out "$OUT/decode_trees.json"
    say "decode_speed, train_mfu"
    timeout 150 $PY -m benchmarks gpu_suite --parts decode_speed train_mfu \
        --decode-cases base-beam4-b1 base-beam4-b32 --out "$OUT/speed.json"
    # what is left of the stage's time, less about 50 s for data, start-up and the test set
    minutes=$($PY -c "print(round(min(6.0, (${DEADLINE_S:-590} - $(date +%s) + $T0 - 50) / 60), 2))")
    say "multi30k for $minutes minutes in the background; torchrun_resume and gpu_tests beside it"
    $PY -m benchmarks gpu_suite --parts multi30k --work "$WORK/multi30k" --out "$OUT/multi30k.json" \
        --multi30k-set train.max_minutes=$minutes model.dropout=0.3 train.max_tokens=8192 train.warmup=1000 \
        train.lr_scale=0.5 train.eval_every=1000 train.checkpoint_every=500 train.valid_max_examples=500 \
        > "$OUT/multi30k.log" 2>&1 &
    multi30k=$!
    sleep 20  # the run's start-up alone
    timeout 240 $PY -m benchmarks gpu_suite --parts torchrun_resume gpu_tests --work "$WORK/side" \
        --out "$OUT/side.json"
    wait $multi30k
    say "multi30k exit $?"
elif [ "$stage" = then ]; then
    run=$(ls -d "$WORK"/multi30k/multi30k-base-* | tail -1)
    say "serve_load on $run"
    timeout 100 $PY -m benchmarks serve_load "$run" --device cuda --users 32 --rounds 1 --requests 640 \
        --unbatched-requests 0 --beam 4 --out "$OUT/serve_load-cuda.json"
    say "train_compiled"
    timeout 120 $PY -m benchmarks gpu_suite --parts train_compiled --out "$OUT/train_compiled.json"
else
    echo "usage: $0 first|then OUT [TREE...]" >&2
    exit 2
fi
say done
