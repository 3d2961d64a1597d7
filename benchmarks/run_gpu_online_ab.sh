#!/usr/bin/env bash
# Server variants for the QPS-inf online run, one server each, in one device call (table last).
# Each variant is NAME:ENV (space-separated VAR=VALUE pairs joined by commas), e.g.
#   VARIANTS="base:TESSEL_RUN_AHEAD=0 ahead: coalesce:TESSEL_STREAM_COALESCE=1" bash benchmarks/run_gpu_online_ab.sh
# Env: NINF (requests per run, default 1000), RUN_TIMEOUT (per client run, seconds). A variant's
# own settings win, e.g. "q16:QPS=16,N16=400" for a 16-QPS run.
set -uo pipefail
OUT=${OUT:-/tmp/out}
for variant in ${VARIANTS:-base:TESSEL_RUN_AHEAD=0 ahead:}; do
  name=${variant%%:*}
  envs=${variant#*:}
  echo "==== variant $name (${envs:-defaults})"
  env QPS=inf NINF=${NINF:-1000} TAG=_$name ${envs//,/ } bash benchmarks/run_gpu_online.sh | tail -3
done
echo "==== all variants ===="
python3 - "$OUT" <<'PY'
import json, sys, pathlib
print("| variant | requests | req/s | out tok/s | TTFT p50/p99 ms | TPOT p50/p99 ms | ITL p50/p99 ms | client CPU | failed |")
print("|---|---|---|---|---|---|---|---|---|")
for p in sorted(pathlib.Path(sys.argv[1]).glob("online_qpsinf_n*_*.json"), key=lambda p: p.stat().st_mtime):
    r = json.loads(p.read_text())
    f = lambda k: f"{r[k]['p50']:.1f} / {r[k]['p99']:.1f}"
    print(f"| {p.stem.split('_', 3)[-1]} | {r['args']['num_prompts']} | {r['request_throughput']:.1f} | {r['output_throughput']:.0f} | "
          f"{f('ttft_ms')} | {f('tpot_ms')} | {f('itl_ms')} | {r['client_cpu_share']:.0%} | {r['failed']} |")
PY
