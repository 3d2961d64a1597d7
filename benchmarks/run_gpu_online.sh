#!/usr/bin/env bash
# Issue 5's online benchmark in one device call: Llama-3.1-8B shape (random bf16 weights)
# behind `tessel serve`, ShareGPT-like synthetic lengths, QPS 4, 16 and inf; table last.
# Usage on the GPU machine, from the repo root: bash benchmarks/run_gpu_online.sh
# Env: SERVER_ARGS (extra `tessel serve` flags), QPS (default "4 16 inf"), TAG (result-name suffix),
# N4 / N16 / NINF (requests per rate; each may list several counts, run in turn on the same server);
# the server inherits the rest, e.g. TESSEL_STREAM_COALESCE=1 or TESSEL_PREFILL_PACK_GQA=1.
# PYSPY=1 runs the server under py-spy (wheel carried in .whl/tools) and keeps its raw profile.
set -uo pipefail
source benchmarks/gpu_env.sh
# The device image has no aiohttp (the client) or httpx (the readiness checks); their wheels are carried in .whl/extra.
python3 -c "import httpx, aiohttp" 2>/dev/null || python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/extra/*.whl
python3 -c "import httpx, aiohttp, tessel.server.app" || { echo "client or server imports fail (fastapi needs opentelemetry-api in .whl)"; exit 1; }
PORT=8011
SPY=()
if [ "${PYSPY:-0}" = 1 ]; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/spy .whl/tools/py_spy-*.whl
  SPY=(/tmp/spy/bin/py-spy record -r 50 -f raw --nonblocking -o "$OUT/server${TAG:-}.pyspy" --)
fi
"${SPY[@]}" python3 benchmarks/serve_gpu_dummy.py --model Llama-3.1-8B --load-format dummy --port $PORT \
  --max-model-len 4096 --max-num-seqs 256 ${SERVER_ARGS:-} > "$OUT/server${TAG:-}.log" 2>&1 &
server=$!
for _ in $(seq 1 240); do curl -sf localhost:$PORT/ready >/dev/null && break; sleep 1; done
curl -sf localhost:$PORT/ready >/dev/null || { echo "server not ready"; tail -30 "$OUT/server${TAG:-}.log"; kill $server; exit 1; }
declare -A NUM=([4]=${N4:-200} [16]=${N16:-400} [inf]=${NINF:-500})
TAG=${TAG:-}
for qps in ${QPS:-4 16 inf}; do
  for n in ${NUM[$qps]}; do
    timeout ${RUN_TIMEOUT:-150} python3 benchmarks/serve.py --base-url http://127.0.0.1:$PORT --lengths sharegpt \
      --num-prompts $n --request-rate $qps --slo-ttft-ms 1000 --slo-tpot-ms 50 --result-dir "$OUT" \
      --result-name online_qps${qps}_n$n$TAG.json 2>&1 | tee "$OUT/online_qps${qps}_n$n$TAG.log" | tail -22
  done
done
# The engine's own account of the runs: steps, stage seconds, GPU idle between steps.
curl -sf localhost:$PORT/metrics | grep -E "^tessel_engine_(steps|step_stage|gpu_idle|cuda_graph|wasted)" | tee "$OUT/engine_metrics${TAG}.txt"
pkill -TERM -f "^python3 benchmarks/serve_gpu_dummy.py"; wait $server
echo "==== summary ===="
python3 - "$OUT" "$TAG" <<'PY'
import json, sys, pathlib
print("| QPS | requests | req/s | out tok/s | TTFT p50/p99 ms | TPOT p50/p99 ms | ITL p50/p99 ms | client CPU | failed |")
print("|---|---|---|---|---|---|---|---|---|")
for p in sorted(pathlib.Path(sys.argv[1]).glob(f"online_qps*_n*{sys.argv[2]}.json"), key=lambda p: p.stat().st_mtime):
    r = json.loads(p.read_text())
    a = r["args"]
    f = lambda k: f"{r[k]['p50']:.1f} / {r[k]['p99']:.1f}"
    print(f"| {a['request_rate']} | {a['num_prompts']} | {r['request_throughput']:.1f} | {r['output_throughput']:.0f} | "
          f"{f('ttft_ms')} | {f('tpot_ms')} | {f('itl_ms')} | {r['client_cpu_share']:.0%} | {r['failed']} |")
PY
