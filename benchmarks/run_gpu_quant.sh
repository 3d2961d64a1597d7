#!/usr/bin/env bash
# Issue 7 on the GPU: the W8A8 GPU tests and/or benchmarks/quant.py (its table printed last).
# Usage on the GPU machine, from the repo root (wheels for pydantic/gguf carried in .whl/ if absent):
#   bash benchmarks/run_gpu_quant.sh bench   # the benchmark alone (< 6 min on an H200)
#   bash benchmarks/run_gpu_quant.sh tests   # the GPU tests alone (kernel configs + engine, ~3-4 min)
#   bash benchmarks/run_gpu_quant.sh         # both, tests first (may pass a 10-minute call limit)
WHAT=${1:-all}
set -uo pipefail
source benchmarks/gpu_env.sh
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
[ "$WHAT" = bench ] || timeout ${TEST_TIMEOUT:-280} python3 -m pytest -q -p no:cacheprovider -m gpu -s \
  tests/kernels/test_quant.py tests/gpu/test_quant_gpu.py 2>&1 | tee "$OUT/pytest_quant_gpu.log" | tail -25
[ "$WHAT" = tests ] || timeout ${BENCH_TIMEOUT:-380} python3 benchmarks/quant.py --out "$OUT/quant.md" --json "$OUT/quant.json" ${BENCH_ARGS:-} \
  2>&1 | tee "$OUT/quant.log" | tail -60
