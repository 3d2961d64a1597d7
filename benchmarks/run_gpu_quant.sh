#!/usr/bin/env bash
# Issue 7 on the GPU: the W8A8 GPU tests and/or benchmarks/quant.py (its table printed last).
# Usage on the GPU machine, from the repo root (wheels for pydantic/gguf carried in .whl/ if absent):
#   bash benchmarks/run_gpu_quant.sh bench   # the benchmark alone (< 6 min on an H200)
#   bash benchmarks/run_gpu_quant.sh tests   # the GPU tests alone (kernel configs + engine, ~3-4 min)
#   bash benchmarks/run_gpu_quant.sh         # both, tests first (may pass a 10-minute call limit)
#   bash benchmarks/run_gpu_quant.sh splitk  # split-K: its GPU tests, the M = 64 tile sweep with split-K
#                                            # (int8, fp8), then the engine with the sweep's winners pinned
#   VARIANTS="bf16 int8 int8+nosplit" bash benchmarks/run_gpu_quant.sh engine
#                                            # the engine table alone for these variants (quant.py engine_case);
#                                            # TESTS=1 runs the decode attention GPU tests first; ISOLATE=1 runs
#                                            # each variant in its own process (autotuned tiles, e.g. decode
#                                            # attention's, are otherwise the first variant's: decode_walks_h100.md)
WHAT=${1:-all}
set -uo pipefail
source benchmarks/gpu_env.sh
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
if [ "$WHAT" = splitk ]; then
  timeout 120 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_quant.py -k "split or every_tuning" 2>&1 | tail -3
  for dt in int8 fp8; do
    timeout ${SWEEP_TIMEOUT:-170} python3 benchmarks/quant_sweep.py --dtype $dt --ms ${SWEEP_MS:-64} --split \
      --pins-out "$OUT/pins.json" --out "$OUT/sweep_$dt.md" > "$OUT/sweep_$dt.log" 2>&1 || tail -5 "$OUT/sweep_$dt.log"
  done
  [ -f "$OUT/pins.json" ] || echo "{}" > "$OUT/pins.json"
  cat "$OUT"/sweep_*.md "$OUT/pins.json"
  TESSEL_W8A8_PIN_FILE="$OUT/pins.json" timeout ${BENCH_TIMEOUT:-280} python3 benchmarks/quant.py --skip-gemm \
    --budget-s 250 --out "$OUT/quant.md" > "$OUT/quant.log" 2>&1 || tail -20 "$OUT/quant.log"
  grep -E "^\| (variant|bf16|int8|fp8)" "$OUT/quant.md"
  exit 0
fi
if [ "$WHAT" = engine ]; then
  [ "${TESTS:-0}" = 1 ] && timeout ${TEST_TIMEOUT:-200} python3 -m pytest -q -p no:cacheprovider -m gpu \
    tests/kernels/test_attention.py tests/kernels/test_fp8_kv_cache.py 2>&1 | tail -3
  if [ "${ISOLATE:-0}" = 1 ]; then
    for v in ${VARIANTS:-bf16 int8}; do
      f="$OUT/quant_${v//+/_}"  # no '+' in the names of files that come back
      timeout ${BENCH_TIMEOUT:-300} python3 benchmarks/quant.py --skip-gemm --variants "$v" --budget-s ${BUDGET:-280} \
        --out "$f.md" > "$f.log" 2>&1 || tail -20 "$f.log"
      grep -F "| $v |" "$f.md" | head -1
    done
    exit 0
  fi
  timeout ${BENCH_TIMEOUT:-300} python3 benchmarks/quant.py --skip-gemm --variants ${VARIANTS:-bf16 int8} \
    --budget-s ${BUDGET:-280} --out "$OUT/quant.md" > "$OUT/quant.log" 2>&1 || tail -20 "$OUT/quant.log"
  grep -E "^\| (variant|bf16|int8|fp8)" "$OUT/quant.md"
  exit 0
fi
[ "$WHAT" = bench ] || timeout ${TEST_TIMEOUT:-280} python3 -m pytest -q -p no:cacheprovider -m gpu -s \
  tests/kernels/test_quant.py tests/gpu/test_quant_gpu.py 2>&1 | tee "$OUT/pytest_quant_gpu.log" | tail -25
[ "$WHAT" = tests ] || timeout ${BENCH_TIMEOUT:-380} python3 benchmarks/quant.py --out "$OUT/quant.md" --json "$OUT/quant.json" ${BENCH_ARGS:-} \
  2>&1 | tee "$OUT/quant.log" | tail -60
