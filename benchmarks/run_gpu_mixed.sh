#!/usr/bin/env bash
# Mixed-step attention on the GPU in one device call: the attention kernel tests (both prefill
# row layouts), the kernel-level A/B (benchmarks/attention_mixed.py), then nano-vllm's offline
# benchmark with the GQA-packed layout off and on, alternating, each run its own process.
# Usage on the GPU machine, from the repo root: bash benchmarks/run_gpu_mixed.sh
set -uo pipefail
source benchmarks/gpu_env.sh
timeout ${TEST_TIMEOUT:-120} python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_attention.py 2>&1 \
  | tee "$OUT/pytest_attention.log" | tail -3
timeout 150 python3 benchmarks/attention_mixed.py --out "$OUT/attention_mixed.md" 2>&1 | tail -12
for round in 1 2; do
  for pack in 0 1; do
    TESSEL_PREFILL_PACK_GQA=$pack timeout 100 python3 benchmarks/throughput.py --out "$OUT/throughput_pack${pack}_$round.md" \
      2>&1 | grep "^Tessel:"
  done
done
echo "==== offline output tok/s (pack 0 = per query head, 1 = GQA-packed) ===="; grep -H "^| Tessel" "$OUT"/throughput_pack*.md
