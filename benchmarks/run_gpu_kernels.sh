#!/usr/bin/env bash
# One device call: the kernel tests on CUDA (bf16), then the attention benchmark (table last).
# Usage on the GPU machine, from the repo root: bash benchmarks/run_gpu_kernels.sh
set -uo pipefail
source benchmarks/gpu_env.sh
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
timeout ${TEST_TIMEOUT:-300} python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels ${EXTRA_TESTS:-} 2>&1 | tee "$OUT/pytest_gpu.log" | tail -25
python3 benchmarks/attention.py --out "$OUT/attention.md" --json "$OUT/attention.json" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log" | tail -80
