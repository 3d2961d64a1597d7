# Sourced by the GPU run scripts: install the wheels carried in .whl/ (the device image lacks
# pydantic, gguf, fastapi, ...; `bash benchmarks/fetch_wheels.sh` downloads them) and set the
# environment. See ../.library/device/README.md.
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:.
  # pydantic may want a newer typing_extensions than the image's; add ours only then, since
  # shadowing the image's copy is otherwise a needless risk to torch.
  if ! python3 -c "import pydantic, fastapi" 2>/dev/null && ls .whl/fallback/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/fallback/*.whl
  fi
  python3 -c "import pydantic, pydantic_settings, gguf, fastapi" || echo "WARNING: carried wheels do not import"
else
  export PYTHONPATH=.
fi
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
