#!/usr/bin/env bash
# Issue 7, batch 256: decode attention over the KV cache stored head-major per block (HND) against
# token-major (NHD), benchmarks/kv_layout.py; then any engine variants of benchmarks/quant.py, each in
# its own process, with the b=1 greedy tokens printed. (The engine's HND opt-in, TESSEL_KV_LAYOUT=hnd with
# the "+hnd" variant, is at commit 736c041: results/kv_layout_h100.md.)
#   bash benchmarks/run_gpu_kv_layout.sh   (~2.5 min on an H100)   VARIANTS="bf16 int8+fp8kv" for the engine too
set -uo pipefail
source benchmarks/gpu_env.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
if [ "${MICRO:-1}" = 1 ]; then
  timeout ${MICRO_TIMEOUT:-240} python3 benchmarks/kv_layout.py --budget-s ${MICRO_BUDGET:-190} --out "$OUT/kv_layout.md" \
    > "$OUT/kv_layout.log" 2>&1 || tail -5 "$OUT/kv_layout.log"
  cut -d'|' -f2-10 "$OUT/kv_layout.md" | grep -v "^---" | head -16
fi
for v in ${VARIANTS:-}; do
  f="$OUT/quant_$(echo "$v" | tr '+.' '__')"
  timeout ${BENCH_TIMEOUT:-120} python3 benchmarks/quant.py --skip-gemm --profile-batch ${PROFILE:-0} --variants "$v" \
    --budget-s 110 --out "$f.md" > "$f.log" 2>&1 || tail -5 "$f.log"
  grep -F "| $v |" "$f.md" | head -1
  grep -o "'b1_tokens': \[[0-9, ]*\]" "$f.log" | head -1
done
