#!/bin/bash
# Times the test suite the way the tier budget is stated (README "Run the tests"): the AVX2 path on any
# x86 machine, so that an AVX-512 machine measures what an AVX2-only one runs.
#
#   bash scripts/test_timing.sh                  # the default tier, every test's duration, per-file totals
#   bash scripts/test_timing.sh -m slow          # the second tier
#   bash scripts/test_timing.sh tests/test_engine.py   # any pytest arguments
#   bash scripts/test_timing.sh -n 0             # in one process (default: -n auto, as the README's command)
#
# torch takes its AVX2 kernels (ATEN_CPU_CAPABILITY=avx2) and omnitts' native kernels are built for
# Haswell (OMNITTS_NATIVE_MARCH=haswell: AVX2 + FMA, no AVX-512, a cache entry of their own; the first
# run compiles them, ~10 s). Measure on a quiet machine: a busy one inflates every number.
# The log lands in ${OUT:-.cache/timing}/pytest.log; the closing table sums durations per file.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-.cache/timing}
mkdir -p "$OUT"
export ATEN_CPU_CAPABILITY=avx2 OMNITTS_NATIVE_MARCH=haswell
started=$(date +%s)
python -m pytest -q -p no:cacheprovider -n auto --durations=0 --durations-min=0 "$@" 2>&1 | tee "$OUT/pytest.log"
status=${PIPESTATUS[0]}
echo "test_timing: pytest exited $status after $(( $(date +%s) - started )) s (wall, imports included)"
# "0.52s call     tests/test_x.py::test_y[...]": summed per file, setup and teardown included.
awk '$1 ~ /^[0-9.]+s$/ && $3 ~ /^tests\// { split($3, a, "::"); t[a[1]] += $1 + 0 }
     END { for (f in t) printf "%8.1f s  %s\n", t[f], f }' "$OUT/pytest.log" | sort -rn
exit "$status"
