#!/bin/bash
# Everything a GPU session should run, in one call (steps 1-6 took about 9 minutes on an H100; step 7,
# added since, has not run on a GPU yet):
#
#   OFFICIAL_PYTHON=.cache/ref-venv/bin/python OUT=device-out bash scripts/device_check.sh [cuda]
#   QUICK=1 ... bash scripts/device_check.sh cpu    # the script itself, on tiny shapes (CPU fake, ~3 min)
#
# 1. graph vs eager codes and host syncs on a tiny checkpoint (float32);
# 2. `omnitts synth` on the CPU and on the device, float32 greedy: codes must be identical;
# 3. parity with the official package on the device (float32, TF32 off; the engine's graphs and
#    eager frames, alone and batched, included): scripts/parity.py --device;
# 4. throughput at concurrency 1/8/32/64, 0.6B and 1.7B shapes, bfloat16, and the official package;
# 5. a whole `omnitts synth` process on 64 items (0.6B, 100 frames), timed at max batch 64 and 8, then
#    again under cProfile;
# 6. the first-call cost of attention on new shapes per sdpa backend (scripts/sdpa_first_calls.py);
# 7. the whole pipeline (scripts/bench_device.py --pipeline): audio-s/s with the codec, first audio,
#    capture, peak memory, the engine/codec/host split and the roofline, 0.6B and 1.7B at max batch 64
#    (PIPE_LINES lines, default 256; PIPE_BATCHES, default 64; the full run is the script's defaults:
#    1000 lines, max batch 8,32,64,128); then a short synth under set_sync_debug_mode: "error" (any host
#    sync outside Engine._collect and graph capture fails its item) and "warn" (the syncs by omnitts
#    line), and which attention kernel ran (flash / efficient / cudnn / math; "unknown" on the CPU);
# 8. deterministic mode: a manifest alone, then reversed among other lines, codes and samples compared with
#    --deterministic and without (scripts/check_deterministic.py; it exits 1 if a --deterministic line differs).
# Logs and JSON land in $OUT. OFFICIAL_PYTHON: a python with qwen-tts 0.1.1 (scripts/reference_env.py
# builds one on the CPU; on a GPU machine install its pins next to a CUDA torch).
set -u
DEVICE=${1:-cuda}
OUT=${OUT:-device-out}
OFFICIAL=${OFFICIAL_PYTHON:-.cache/ref-venv/bin/python}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if [ -n "${QUICK:-}" ]; then
    PRESETS="tiny-0.6b tiny-1.7b"; FRAMES=16; CONCURRENCY=1,4; ITEMS=8; SHAPE=tiny-0.6b; ITEM_FRAMES=10
    PIPE="--presets tiny-0.6b --lines ${PIPE_LINES:-12} --seconds 0.5,1 --max-batch ${PIPE_BATCHES:-4}"
    SYNC_PRESET=tiny-0.6b
else
    PRESETS="0.6b 1.7b"; FRAMES=128; CONCURRENCY=1,8,32,64; ITEMS=64; SHAPE=0.6b; ITEM_FRAMES=100
    PIPE="--presets 0.6b,1.7b --lines ${PIPE_LINES:-256} --max-batch ${PIPE_BATCHES:-64}"
    SYNC_PRESET=0.6b
fi
VENV=$(dirname "$(dirname "$OFFICIAL")")
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else 'no cuda')"
echo "=== 1. tiny checkpoint, float32"
timeout 120 python3 scripts/bench_device.py --device "$DEVICE" --preset tiny-0.6b --dtype float32 --frames 40 \
    --concurrency 1,8 --json "$OUT/tiny.json" 2>&1 | tail -6
echo "=== 2. synth on cpu and $DEVICE"
printf '%s\n' '{"id":"a","text":"Hello, and welcome to the test.","speaker":"ryan"}' \
    '{"id":"b","text":"Take a deep breath, then read the next line.","speaker":"vivian","instruct":"Calm."}' \
    '{"id":"c","text":"Short.","speaker":"serena"}' > "$OUT/lines.jsonl"
timeout 60 python3 -m omnitts demo -o "$OUT/demo" --model-dir "$OUT/demo-ckpt" > /dev/null 2>&1
for d in cpu "$DEVICE"; do
    timeout 120 python3 -m omnitts synth "$OUT/lines.jsonl" -m "$OUT/demo-ckpt" -o "$OUT/synth-$d" --device "$d" \
        --dtype float32 --greedy --save-codes --max-frames 30 -q > "$OUT/synth-$d.log" 2>&1 || echo "synth $d failed"
done
python3 - "$OUT" "$DEVICE" <<'PY'
import sys, numpy as np
out, dev = sys.argv[1:]
for i in "abc":
    a, b = np.load(f"{out}/synth-cpu/{i}.codes.npy"), np.load(f"{out}/synth-{dev}/{i}.codes.npy")
    print(i, "codes identical" if a.shape == b.shape and (a == b).all() else "CODES DIFFER")
PY
echo "=== 3. parity on $DEVICE"
timeout 420 python3 scripts/parity.py --device "$DEVICE" --venv "$VENV" --work "$OUT/parity" --frames 48 \
    --json "$OUT/parity.json" > "$OUT/parity.log" 2>&1; echo "parity exit $?"
grep -E "False$" "$OUT/parity.log" | head -20; echo "(rows not ok above, if any)"
echo "=== 4. throughput"
for preset in $PRESETS; do
    timeout 240 python3 scripts/bench_device.py --device "$DEVICE" --preset $preset --frames $FRAMES \
        --concurrency $CONCURRENCY --official-python "$OFFICIAL" --official-frames 24 \
        --json "$OUT/bench-$preset.json" 2>&1 \
        | grep -E "graph vs|host syncs|concurrency"
done
echo "=== 5. whole synth process, $ITEMS items"
python3 -c "from omnitts.testing.checkpoint import build_checkpoint as b; b('$OUT/ck06', kind='custom_voice', preset='$SHAPE')"
python3 - "$OUT/m64.jsonl" "$ITEMS" <<'PY'
import json, sys
with open(sys.argv[1], "w") as f:
    for i in range(int(sys.argv[2])):
        f.write(json.dumps({"id": f"i{i}", "text": f"Line number {i} of the batch manifest, read aloud at an even pace.",
                            "speaker": ["ryan", "vivian", "serena", "aiden"][i % 4]}) + "\n")
PY
for mb in 64 8; do
    /usr/bin/time -f "max-batch $mb: %e s wall" timeout 180 python3 -m omnitts synth "$OUT/m64.jsonl" -m "$OUT/ck06" \
        -o "$OUT/o$mb" --device "$DEVICE" --max-batch $mb --max-frames $ITEM_FRAMES --greedy -q 2>&1 | grep -E "realtime|wall"
done
timeout 180 python3 -m cProfile -o "$OUT/synth.prof" -m omnitts synth "$OUT/m64.jsonl" -m "$OUT/ck06" -o "$OUT/oprof" \
    --device "$DEVICE" --max-batch 64 --max-frames $ITEM_FRAMES --greedy -q > /dev/null 2>&1
python3 -c "import pstats; pstats.Stats('$OUT/synth.prof').sort_stats('tottime').print_stats(15)" | tail -22
echo "=== 6. attention first calls"
if [ "$DEVICE" = cuda ]; then timeout 60 python3 scripts/sdpa_first_calls.py 2>&1 | grep -v Warn; fi
echo "=== 7. whole pipeline: synth end to end, timed"
timeout 900 python3 scripts/bench_device.py --pipeline --device "$DEVICE" $PIPE --json "$OUT/pipeline.json" 2>&1 \
    | tail -8; echo "pipeline exit ${PIPESTATUS[0]}"
for mode in error warn; do
    timeout 300 python3 scripts/bench_device.py --pipeline --device "$DEVICE" --presets $SYNC_PRESET --lines 16 \
        --seconds 1,2 --max-batch 8 --sync-debug $mode --json "$OUT/pipeline-sync-$mode.json" 2>&1 | tail -16
    echo "sync-debug $mode exit ${PIPESTATUS[0]}"
done
echo "=== 8. deterministic mode"
timeout 300 python3 scripts/check_deterministic.py --device "$DEVICE" $( [ -n "${QUICK:-}" ] && echo --lines 4 ) 2>&1 \
    | tail -4; echo "check_deterministic exit ${PIPESTATUS[0]}"
