#!/usr/bin/env bash
# Issue 7, batch 256: the KV cache head-major per block (HND) against token-major (NHD): decode attention
# alone (benchmarks/kv_layout.py), then the engine table each way (TESSEL_KV_LAYOUT=hnd), each variant in
# its own process; the b=1 greedy tokens of each engine case are printed to check the layouts agree.
#   bash benchmarks/run_gpu_kv_layout.sh   (~8 min on an H100)
set -uo pipefail
source benchmarks/gpu_env.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
if [ "${MICRO:-1}" = 1 ]; then
  timeout ${MICRO_TIMEOUT:-240} python3 benchmarks/kv_layout.py --budget-s ${MICRO_BUDGET:-190} --out "$OUT/kv_layout.md" \
    > "$OUT/kv_layout.log" 2>&1 || tail -5 "$OUT/kv_layout.log"
  cut -d'|' -f2-10 "$OUT/kv_layout.md" | grep -v "^---" | head -16
fi
for v in ${VARIANTS:-int8+fp8kv+hnd int8+fp8kv bf16 bf16+hnd}; do
  f="$OUT/quant_$(echo "$v" | tr '+.' '__')"
  timeout ${BENCH_TIMEOUT:-120} python3 benchmarks/quant.py --skip-gemm --profile-batch ${PROFILE:-0} --variants "$v" \
    --budget-s 110 --out "$f.md" > "$f.log" 2>&1 || tail -5 "$f.log"
  grep -F "| $v |" "$f.md" | head -1
  grep -o "'b1_tokens': \[[0-9, ]*\]" "$f.log" | head -1
done
