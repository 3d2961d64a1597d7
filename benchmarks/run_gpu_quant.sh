#!/usr/bin/env bash
# One device call for issue 7: the W8A8 GPU tests, then benchmarks/quant.py (table printed last).
# Usage on the GPU machine, from the repo root (wheels for pydantic/gguf carried in .whl/ if absent):
#   bash benchmarks/run_gpu_quant.sh
set -uo pipefail
source benchmarks/gpu_env.sh
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
timeout ${TEST_TIMEOUT:-200} python3 -m pytest -q -p no:cacheprovider -m gpu -s \
  tests/kernels/test_quant.py tests/gpu/test_quant_gpu.py 2>&1 | tee "$OUT/pytest_quant_gpu.log" | tail -25
timeout ${BENCH_TIMEOUT:-380} python3 benchmarks/quant.py --out "$OUT/quant.md" --json "$OUT/quant.json" ${BENCH_ARGS:-} \
  2>&1 | tee "$OUT/quant.log" | tail -60
