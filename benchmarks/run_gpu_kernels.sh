#!/usr/bin/env bash
# One device call: the kernel tests on CUDA (bf16), then the attention benchmark (table last).
# Usage on the GPU machine, from the repo root: bash benchmarks/run_gpu_kernels.sh
set -uo pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels -x 2>&1 | tee "$OUT/pytest_gpu.log" | tail -25
python3 benchmarks/attention.py --out "$OUT/attention.md" --json "$OUT/attention.json" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log" | tail -80
