#!/usr/bin/env bash
# One device call: the prefill kernel's GPU tests, its benchmark against the kernel before
# 2026-12-06 and SDPA, the GPU engine's token checks, then issue 5's ablation (all on / all off).
# Usage on the GPU machine, from the repo root: bash benchmarks/run_gpu_prefill.sh
set -uo pipefail
source benchmarks/gpu_env.sh
nvidia-smi --query-gpu=name,memory.total --format=csv | tee "$OUT/gpu.txt"
timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_attention.py 2>&1 | tail -3
timeout 280 python3 benchmarks/prefill_attention.py --out "$OUT/prefill.md" --json "$OUT/prefill.json" ${BENCH_ARGS:-} 2>&1 \
  | tee "$OUT/prefill.log" | grep -v '^{' | tail -30
[ "${ABLATION:-1}" = 1 ] && timeout ${ABL_TIMEOUT:-200} python3 benchmarks/ablation.py \
  --cases ${ABL_CASES:-"all on" "all off" "all on (again: order effects)"} --out "$OUT/ablation.md" --json "$OUT/ablation.json" 2>&1 \
  | tee "$OUT/ablation.log" | tail -9
timeout ${ENGINE_TEST_TIMEOUT:-300} python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_engine_gpu.py \
  -k "test_cuda_fp32_equals_cpu and tiny" 2>&1 | tee "$OUT/engine_tests.log" | tail -3
echo "==== prefill ===="; cat "$OUT/prefill.md" 2>/dev/null | head -30
