#!/usr/bin/env bash
# Issue 7, batch 256: the warp-split decode walk (TESSEL_DECODE_WARPS=1) on the GPU, in one call:
# its GPU tests (every tile pinned in turn, bf16 and fp8 caches), decode attention alone against the
# tile walk (benchmarks/decode_warps.py), then the engine table with and without it, each variant in
# its own process.   bash benchmarks/run_gpu_decode_warps.sh   (~7 min on an H100)
set -uo pipefail
source benchmarks/gpu_env.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
timeout ${TEST_TIMEOUT:-90} python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_attention.py \
  tests/kernels/test_fp8_kv_cache.py -k "warp" 2>&1 | tail -3
timeout ${MICRO_TIMEOUT:-200} python3 benchmarks/decode_warps.py --budget-s ${MICRO_BUDGET:-160} --out "$OUT/decode_warps.md" \
  > "$OUT/decode_warps.log" 2>&1 || tail -5 "$OUT/decode_warps.log"
cut -c1-220 "$OUT/decode_warps.md" | grep "^| b="
for v in ${VARIANTS:-int8+fp8kv+warps int8+fp8kv bf16 int8+fp8kv+warps+f16dots}; do
  f="$OUT/quant_$(echo "$v" | tr '+.' '__')"
  timeout ${BENCH_TIMEOUT:-120} python3 benchmarks/quant.py --skip-gemm --profile-batch ${PROFILE:-0} --variants "$v" \
    --budget-s 110 --out "$f.md" > "$f.log" 2>&1 || tail -5 "$f.log"
  grep -F "| $v |" "$f.md" | head -1
done
