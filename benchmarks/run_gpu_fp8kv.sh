#!/usr/bin/env bash
# The fp8 KV cache (kv_cache_dtype=fp8) on the GPU: its GPU tests, decode attention over a bf16
# and an fp8 cache (benchmarks/fp8_kv_decode.py), then issue 7's engine table (benchmarks/quant.py:
# decode tok/s at batch 64 and 256, KV blocks) with and without it.
#   VARIANTS="bf16 int8 int8+fp8kv bf16+fp8kv" PROMPT_LEN=128 [TUNE_CONTEXT=992 | SWEEP=1] bash benchmarks/run_gpu_fp8kv.sh
# e.g. the fp8 decode variants: SWEEP=1 DECODE_TIMEOUT=240 VARIANTS="bf16 int8 int8+fp8kv int8+fp8kv+f16dots int8+fp8kv+vbytes"
set -uo pipefail
source benchmarks/gpu_env.sh
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/gpu.txt"
if [ "${TESTS:-1}" = 1 ]; then
  timeout ${TEST_TIMEOUT:-200} python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_fp8_kv_cache.py \
    tests/gpu/test_engine_gpu.py -k "fp8" 2>&1 | tee "$OUT/pytest_gpu.log" | tail -8
fi
timeout ${DECODE_TIMEOUT:-90} python3 benchmarks/fp8_kv_decode.py ${SWEEP:+--sweep} ${TUNE_CONTEXT:+--tune-context $TUNE_CONTEXT} --out "$OUT/fp8_kv_decode.md" > "$OUT/fp8_kv_decode.log" 2>&1
tail -${DECODE_LINES:-7} "$OUT/fp8_kv_decode.log" | cut -c1-120
timeout ${CASE_TIMEOUT:-380} python3 benchmarks/quant.py --skip-gemm --variants ${VARIANTS:-bf16 int8 int8+fp8kv bf16+fp8kv} \
  --prompt-len ${PROMPT_LEN:-128} --profile-batch ${PROFILE:-0} --budget-s ${BUDGET:-340} --out "$OUT/quant_fp8kv.md" \
  > "$OUT/quant_fp8kv.log" 2>&1
grep -E "^\| (bf16|int8|fp8)" "$OUT/quant_fp8kv.md" | cut -c1-200
grep -E "Error|FAILED" "$OUT/quant_fp8kv.log" | head -5
