#!/usr/bin/env bash
# One device call for the decode-path kernels: their GPU tests, batch-1 decode kernel by kernel
# (benchmarks/decode_profile.py), nano-vllm's offline benchmark with the fused sampler on and off
# (alternating), then the attention benchmark (issue 4's table).
# Carry [".whl"]; logs and tables land in $OUT, a short summary is printed last.
set -uo pipefail
source benchmarks/gpu_env.sh
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv,noheader
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
timeout ${TEST_TIMEOUT:-200} python3 -m pytest -q -p no:cacheprovider -m gpu ${TESTS:-tests/kernels/test_attention.py \
  tests/kernels/test_sampling.py tests/kernels/test_fused_ops.py tests/gpu/test_sampler_gpu.py tests/gpu/test_engine_gpu.py} \
  -k "${TEST_K:-not fp32_equals_cpu or tiny}" 2>&1 | tee "$OUT/pytest.log" | tail -4
timeout ${PROFILE_TIMEOUT:-150} python3 benchmarks/decode_profile.py ${PROFILE_ARGS:-} --out "$OUT/decode_profile.md" \
  > "$OUT/decode_profile.log" 2>&1 || tail -20 "$OUT/decode_profile.log"
for fused in ${THROUGHPUT_ORDER:-1 0 1 0}; do
  TESSEL_FUSED_SAMPLING=$fused timeout 80 python3 benchmarks/throughput.py --json "$OUT/tput_$fused.json" 2>&1 \
    | grep -E "output tok/s|^\| Tessel" | sed "s/^/fused=$fused /" | tee -a "$OUT/throughput.log"
done
[ "${ATTENTION:-1}" = 1 ] && timeout ${ATTN_TIMEOUT:-150} python3 benchmarks/attention.py --out "$OUT/attention.md" \
  > "$OUT/attention.log" 2>&1 || tail -20 "$OUT/attention.log"
echo "==== summary ===="
cat "$OUT/decode_profile.md" 2>/dev/null | tail -8
cat "$OUT/throughput.log"
grep -E "^\| (uniform|skewed|long tail|single|prefill)" "$OUT/attention.md" 2>/dev/null | grep -E "balanced \||triton paged|sdpa cudnn" 
