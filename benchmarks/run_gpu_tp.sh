#!/usr/bin/env bash
# Issue 8 on a GPU machine: the tensor-parallel GPU tests, then TP=1 throughput of this tree and,
# side by side, of the tree before tensor parallelism (MAIN_TREE), run alternately twice each so
# drift shows. Logs and tables under $OUT. MAIN_TREE must travel with the call: here,
#   mkdir .tp_before && git archive 6037dbf | tar -x -C .tp_before && echo /.tp_before/ >> .git/info/exclude
# then carry [".whl", ".tp_before"] and run
#   bash benchmarks/run_gpu_tp.sh .tp_before
set -uo pipefail
MAIN_TREE=${1:-}
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  SITE=/tmp/site:
else
  SITE=
fi
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total --format=csv | tee "$OUT/gpu.txt"
PYTHONPATH=$SITE. timeout ${TEST_TIMEOUT:-300} python3 -m pytest -q -p no:cacheprovider -m gpu \
  tests/gpu/test_tensor_parallel_gpu.py -x -s 2>&1 | tee "$OUT/pytest_tp_gpu.log" | tail -20
for round in 1 2; do
  for tree in . $MAIN_TREE; do
    name=$([ "$tree" = . ] && echo issue8 || echo main)
    (cd "$tree" && PYTHONPATH=$SITE. timeout ${TPUT_TIMEOUT:-120} python3 benchmarks/throughput.py \
      --out "$OUT/throughput_${name}_$round.md") 2>&1 | tail -4 | tee -a "$OUT/throughput.log"
  done
done
echo "==== TP=1 throughput (output tok/s) ===="; grep -H "^| Tessel" "$OUT"/throughput_*.md
