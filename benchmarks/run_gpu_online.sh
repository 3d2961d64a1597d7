#!/usr/bin/env bash
# Issue 5's online benchmark in one device call: Llama-3.1-8B shape (random bf16 weights)
# behind `tessel serve`, ShareGPT-like synthetic lengths, QPS 4, 16 and inf; table last.
# Usage on the GPU machine, from the repo root: bash benchmarks/run_gpu_online.sh
# Env: SERVER_ARGS (extra `tessel serve` flags), QPS (default "4 16 inf"), TAG (result-name suffix);
# the server inherits the rest, e.g. TESSEL_STREAM_COALESCE=1 or TESSEL_PREFILL_PACK_GQA=1.
set -uo pipefail
source benchmarks/gpu_env.sh
# The device image has no aiohttp (the client) or httpx (the readiness checks); their wheels are carried in .whl/extra.
python3 -c "import httpx, aiohttp" 2>/dev/null || python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/extra/*.whl
python3 -c "import httpx, aiohttp, tessel.server.app" || { echo "client or server imports fail (fastapi needs opentelemetry-api in .whl)"; exit 1; }
PORT=8011
python3 benchmarks/serve_gpu_dummy.py --model Llama-3.1-8B --load-format dummy --port $PORT \
  --max-model-len 4096 --max-num-seqs 256 ${SERVER_ARGS:-} > "$OUT/server${TAG:-}.log" 2>&1 &
server=$!
for _ in $(seq 1 240); do curl -sf localhost:$PORT/ready >/dev/null && break; sleep 1; done
curl -sf localhost:$PORT/ready >/dev/null || { echo "server not ready"; tail -30 "$OUT/server${TAG:-}.log"; kill $server; exit 1; }
declare -A NUM=([4]=${N4:-200} [16]=${N16:-400} [inf]=${NINF:-500})
TAG=${TAG:-}
for qps in ${QPS:-4 16 inf}; do
  set -- $qps ${NUM[$qps]}
  timeout ${RUN_TIMEOUT:-150} python3 benchmarks/serve.py --base-url http://127.0.0.1:$PORT --lengths sharegpt \
    --num-prompts $2 --request-rate $1 --slo-ttft-ms 1000 --slo-tpot-ms 50 --result-dir "$OUT" \
    --result-name online_qps$1$TAG.json 2>&1 | tee "$OUT/online_qps$1$TAG.log" | tail -22
done
kill -TERM $server; wait $server
echo "==== summary ===="
python3 - "$OUT" "$TAG" <<'PY'
import json, sys, pathlib
print("| QPS | req/s | out tok/s | TTFT p50/p99 ms | TPOT p50/p99 ms | ITL p50/p99 ms | failed |")
print("|---|---|---|---|---|---|---|")
for q in ("4", "16", "inf"):
    p = pathlib.Path(sys.argv[1]) / f"online_qps{q}{sys.argv[2]}.json"
    if not p.exists():
        print(f"| {q} | (no result) |"); continue
    r = json.loads(p.read_text())
    f = lambda k: f"{r[k]['p50']:.1f} / {r[k]['p99']:.1f}"
    print(f"| {q} | {r['request_throughput']:.1f} | {r['output_throughput']:.0f} | {f('ttft_ms')} | {f('tpot_ms')} | {f('itl_ms')} | {r['failed']} |")
PY
