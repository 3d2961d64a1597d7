#!/usr/bin/env bash
# One device call: the fused-MoE tests on CUDA (both paths), the engine's MoE tests with the
# few-token GEMV path on, then the MoE layer benchmark (table last).
# Usage on the GPU machine, from the repo root: bash benchmarks/run_gpu_moe.sh [--sweep]
set -uo pipefail
source benchmarks/gpu_env.sh
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
timeout ${TEST_TIMEOUT:-200} python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_fused_moe.py 2>&1 | tee "$OUT/pytest_moe.log" | tail -5
TESSEL_MOE_GEMV=1 timeout ${TEST_TIMEOUT:-200} python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_engine_gpu.py \
  -k "qwen3_moe or mixtral" 2>&1 | tee "$OUT/pytest_moe_engine_gemv.log" | tail -5
python3 benchmarks/moe_layer.py --out "$OUT/moe_layer.md" "$@" 2>&1 | tee "$OUT/moe_bench.log" | tail -40
