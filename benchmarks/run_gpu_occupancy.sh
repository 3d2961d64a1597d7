#!/usr/bin/env bash
# Issue 7, batch 256: decode attention tiles with more programs per SM (benchmarks/decode_occupancy.py),
# then the engine table with the microbenchmark's best fp8 tile and waves pinned, each variant in its
# own process.   bash benchmarks/run_gpu_occupancy.sh   (~8 min on an H100)
set -uo pipefail
source benchmarks/gpu_env.sh
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
timeout ${SWEEP_TIMEOUT:-270} python3 benchmarks/decode_occupancy.py --budget-s ${SWEEP_BUDGET:-220} \
  --out "$OUT/decode_occupancy.md" --best-out "$OUT/best.txt" > "$OUT/decode_occupancy.log" 2>&1 \
  || tail -5 "$OUT/decode_occupancy.log"
best=$(cat "$OUT/best.txt" 2>/dev/null || echo 32.4.6.0.4)
echo "best fp8 tile.waves at the engine's contexts: $best"
for v in ${VARIANTS:-bf16 int8+fp8kv int8+fp8kv+tile$best}; do
  f="$OUT/quant_$(echo "$v" | tr '+.' '__')"
  timeout ${BENCH_TIMEOUT:-150} python3 benchmarks/quant.py --skip-gemm --variants "$v" --budget-s 140 \
    --out "$f.md" > "$f.log" 2>&1 || tail -5 "$f.log"
  grep -F "| $v |" "$f.md" | head -1
done
