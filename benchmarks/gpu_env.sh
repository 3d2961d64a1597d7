# Sourced by the GPU run scripts: install the wheels carried in .whl/ (the device image lacks
# pydantic, gguf, fastapi, ...) and set the environment. See ../.library/device/README.md.
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:.
else
  export PYTHONPATH=.
fi
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
