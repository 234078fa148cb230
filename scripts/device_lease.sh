#!/bin/bash
# The GPU checks that fit one short lease (about 10 minutes on an H200), most telling first; each step is
# time-boxed, so a slow one cannot starve the rest. Logs, JSON and profiles land in $OUT.
#
#   OUT=device-out bash scripts/device_lease.sh [cuda]
#   QUICK=1 OUT=/tmp/lease bash scripts/device_lease.sh cpu    # the script itself, tiny shapes (~2 min)
#
# 1. graphs vs eager codes and host syncs, tiny checkpoint in float32;
# 2. the pipeline under the sync debug mode ("warn": every host sync outside Engine._collect, by line);
# 3. one bfloat16 frame's kernels with and without the fused ops (the fused ops' load check included);
# 4. the whole pipeline, 1.7B at max batch 64 (issue 33's figure), with prefill graphs and without them
#    (OMNITTS_PREFILL_GRAPHS=0: each prompt prefilled eagerly in its own shape);
# 5. the same under --profile: where the wall time goes (synchronizing timers, cProfile, kernel table);
# 6. the engine alone, 0.6B, with the fused ops and with OMNITTS_FUSED=0 (bfloat16: graphs vs eager codes with
#    the padded prefill, its graphs against its eager calls);
# 7. deterministic mode: a line's codes and samples alone and among other lines (scripts/check_deterministic.py),
#    and what it costs (the pipeline of step 4 at max batch 64 with --deterministic).
# scripts/device_check.sh is the long list (parity with the official package among it).
set -u
DEVICE=${1:-cuda}
OUT=${OUT:-device-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
started=$(date +%s)
step() { echo "=== [$(( $(date +%s) - started )) s] $*"; }
exec 3>&1  # the terminal's stdout: a step's note reaches it past the filters its output goes through
boxed() {  # boxed SECONDS COMMAND...: the command, time-boxed; one that runs out of time says so
    local limit=$1 rc
    shift
    timeout "$limit" "$@"
    rc=$?
    if [ $rc -eq 124 ]; then echo "!!! timed out after $limit s: ${*:1:4} ..." >&3; fi
    return $rc
}
if [ -n "${QUICK:-}" ]; then
    BIG=tiny-0.6b; SMALL=tiny-0.6b; LINES=12; PLINES=12; FRAMES=8; CONC=1,4
else
    BIG=1.7b; SMALL=0.6b; LINES=384; PLINES=192; FRAMES=128; CONC=1,8,64
fi
step "1. graphs vs eager, tiny float32"
boxed 120 python3 scripts/bench_device.py --device "$DEVICE" --preset tiny-0.6b --dtype float32 --frames 40 \
    --concurrency 1,8 --json "$OUT/tiny.json" 2>&1 | grep -E "graph vs|host syncs|concurrency"
step "2. host syncs in the pipeline (warn)"
boxed 90 python3 scripts/bench_device.py --pipeline --device "$DEVICE" --presets tiny-0.6b --lines 16 \
    --seconds 1,2 --max-batch 8 --sync-debug warn --json "$OUT/sync.json" 2>&1 | tail -n +3
step "3. kernels per frame"
boxed 90 python3 scripts/bench_device.py --count-ops --preset "$SMALL" --device "$DEVICE" 2>&1 \
    | grep -E "kernels|aten ops|warn" | cut -c1-300
step "4. whole pipeline, $BIG, prefill graphs on and off"
for graphs in 1 0; do
    OMNITTS_PREFILL_GRAPHS=$graphs boxed 120 python3 scripts/bench_device.py --pipeline --device "$DEVICE" \
        --presets "$BIG" --lines "$LINES" --max-batch 64 --json "$OUT/pipeline-prefill$graphs.json" 2>&1 \
        | tail -n +3 | sed "s/^/OMNITTS_PREFILL_GRAPHS=$graphs  /"
done
step "5. the same, profiled"
boxed 150 python3 scripts/bench_device.py --pipeline --device "$DEVICE" --presets "$BIG" --lines "$PLINES" \
    --max-batch 64 --profile "$OUT/profile" --json "$OUT/profiled.json" 2>&1 | tail -n +3
head -30 "$OUT"/profile/kernels-*.txt 2>/dev/null | cut -c1-160
step "6. engine alone, fused ops on and off"
for fused in 1 0; do
    OMNITTS_FUSED=$fused boxed 150 python3 scripts/bench_device.py --device "$DEVICE" --preset "$SMALL" \
        --frames "$FRAMES" --concurrency "$CONC" --json "$OUT/engine-fused$fused.json" 2>&1 \
        | grep -E "graph vs|concurrency" | sed "s/^/OMNITTS_FUSED=$fused  /"
done
step "7. deterministic mode: same line, same codes; its cost"
boxed 150 python3 scripts/check_deterministic.py --device "$DEVICE" --preset "$SMALL" \
    $( [ -n "${QUICK:-}" ] && echo --dtype float32 --lines 4 ) 2>&1 | tail -4
boxed 150 python3 scripts/bench_device.py --pipeline --device "$DEVICE" --presets "$BIG" --lines "$PLINES" \
    --max-batch 64 --deterministic --json "$OUT/deterministic.json" 2>&1 | tail -n +3
step done
