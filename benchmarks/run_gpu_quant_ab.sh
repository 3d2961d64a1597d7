#!/usr/bin/env bash
# Issue 7's engine table (benchmarks/quant.py, bf16 and int8 decode at batch 64 and 256) on a
# baseline tree and on this one, processes alternating, then GPU tests if TESTS names some.
#   BASE=DIR ROUNDS="base work base work" TESTS="tests/gpu/..." bash benchmarks/run_gpu_quant_ab.sh
# DIR holds an older tree's tessel/ and benchmarks/ (git archive REF tessel benchmarks | tar -x -C DIR).
set -uo pipefail
source benchmarks/gpu_env.sh
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/gpu.txt"
i=0
for r in ${ROUNDS:-base work}; do
  i=$((i + 1)); tree=.; [ "$r" = base ] && tree=$BASE
  (cd "$tree" && PYTHONPATH=/tmp/site:. timeout ${CASE_TIMEOUT:-230} python3 benchmarks/quant.py --skip-gemm \
    --variants ${VARIANTS:-bf16 int8} --profile-batch 0 --budget-s 200 --out "$OUT/quant_${i}_$r.md" \
    > "$OUT/quant_${i}_$r.log" 2>&1)
  grep -E "^\| (bf16|int8|fp8)" "$OUT/quant_${i}_$r.md" | sed "s/^/$i $r /" | cut -c1-160
done
if [ -n "${TESTS:-}" ]; then
  timeout ${TEST_TIMEOUT:-150} python3 -m pytest -q -p no:cacheprovider -m gpu $TESTS 2>&1 | tee "$OUT/pytest_gpu.log" | tail -8
fi
