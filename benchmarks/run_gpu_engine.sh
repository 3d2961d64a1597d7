#!/usr/bin/env bash
# One device call for issue 5: GPU engine tests, then the decode-roofline, throughput and
# ablation benchmarks; full logs and tables under $OUT, a short table printed last.
# Usage on the GPU machine, from the repo root (wheels for pydantic/gguf carried in .whl/):
#   bash benchmarks/run_gpu_engine.sh
set -uo pipefail
source benchmarks/gpu_env.sh
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
python3 -c 'import torch, triton, transformers; print("torch", torch.__version__, "triton", triton.__version__, "transformers", transformers.__version__)'
timeout ${TEST_TIMEOUT:-180} python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu -x -s 2>&1 | tee "$OUT/pytest_gpu.log" | tail -30
timeout ${ROOF_TIMEOUT:-160} python3 benchmarks/decode_roofline.py --out "$OUT/roofline.md" --json "$OUT/roofline.json" 2>&1 | tee "$OUT/roofline.log" | tail -20
timeout ${TPUT_TIMEOUT:-90} python3 benchmarks/throughput.py --out "$OUT/throughput.md" --json "$OUT/throughput.json" 2>&1 | tee "$OUT/throughput.log" | tail -12
timeout ${ABL_TIMEOUT:-120} python3 benchmarks/ablation.py --out "$OUT/ablation.md" --json "$OUT/ablation.json" 2>&1 | tee "$OUT/ablation.log" | tail -12
echo "==== summary ===="; cat "$OUT"/roofline.md "$OUT"/throughput.md "$OUT"/ablation.md 2>/dev/null
