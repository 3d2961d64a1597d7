#!/usr/bin/env bash
# One device call: cold start (benchmarks/cold_start.py), optionally the host loop against a
# baseline tree (benchmarks/host_loop.py), then optionally GPU tests.
#   COLD_ARGS="--cases cold warm" TESTS="tests/gpu/test_engine_gpu.py" bash benchmarks/run_gpu_cold.sh
#   HOST_ARGS="--model Llama-3.2-1B --baseline-dir DIR" bash benchmarks/run_gpu_cold.sh
set -uo pipefail
source benchmarks/gpu_env.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
[ -n "${COLD_ARGS:-}" ] && timeout ${COLD_TIMEOUT:-400} python3 benchmarks/cold_start.py --out "$OUT/cold.md" --json "$OUT/cold.json" ${COLD_ARGS:-} 2>&1 | tee "$OUT/cold.log" | grep -v Warning | tail -8
python3 - "$OUT/cold.json" <<'PY' || true
import json, sys
for r in json.load(open(sys.argv[1])):
    print(r["case"], "in-run compiles by kernel:", r.get("in_run_kernels"))
    print("   first (kernel, s into the run):", r.get("in_run_first_at_s"))
PY
if [ -n "${HOST_ARGS:-}" ]; then
  timeout ${HOST_TIMEOUT:-240} python3 benchmarks/host_loop.py --out "$OUT/host.md" $HOST_ARGS 2>&1 | tee "$OUT/host.log" | tail -12
fi
if [ -n "${TESTS:-}" ]; then
  timeout ${TEST_TIMEOUT:-150} python3 -m pytest -q -p no:cacheprovider -m gpu $TESTS 2>&1 | tee "$OUT/pytest_gpu.log" | tail -15
fi
