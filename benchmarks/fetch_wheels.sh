#!/usr/bin/env bash
# Fill .whl/ (git-ignored) with the wheels the GPU machine's image lacks, at the versions this
# checkout's venv holds, built for its Python (3.12, x86_64). benchmarks/gpu_env.sh installs
# them there; carry [".whl"] in each device call. Run once per checkout, after `make test`'s set-up:
#   bash benchmarks/fetch_wheels.sh
set -euo pipefail
PIP=${PIP:-.venv/bin/pip}
PKGS="pydantic pydantic-core pydantic-settings gguf fastapi starlette uvicorn prometheus-client annotated-types
      typing-inspection python-dotenv annotated-doc h11 httptools opentelemetry-api"
pins=()
for p in $PKGS; do
  v=$($PIP show "$p" 2>/dev/null | sed -n 's/^Version: //p')
  pins+=("$p${v:+==$v}")
done
mkdir -p .whl/fallback
$PIP download -q --only-binary=:all: --no-deps --python-version 3.12 --platform manylinux2014_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 -d .whl "${pins[@]}" 2>&1 | grep -v "is ignored" || true
# pydantic may want a newer typing_extensions than the image's (gpu_env.sh adds it only then)
te=$($PIP show typing-extensions 2>/dev/null | sed -n 's/^Version: //p')
$PIP download -q --only-binary=:all: --no-deps --python-version 3.12 -d .whl/fallback "typing-extensions${te:+==$te}" \
  2>&1 | grep -v "is ignored" || true
ls .whl
