"""Liveness, readiness and the Prometheus scrape."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from tessel.server.auth import check_api_key, server_state

router = APIRouter()


@router.get("/health")
async def health(request: Request) -> Response:
    """Liveness: 200 unless the model failed to load or the engine loop died."""
    state = server_state(request)
    if state.load_error is not None:
        return JSONResponse({"status": "dead", "error": str(state.load_error)}, status_code=503)
    if state.engine is not None and not state.engine.is_alive() and not state.draining:
        return JSONResponse({"status": "dead", "error": "the engine loop stopped"}, status_code=503)
    return JSONResponse({"status": "ok"})


@router.get("/ready")
async def ready(request: Request) -> Response:
    """Readiness: 200 once the model is loaded and the engine loop runs; 503 loading or draining."""
    state = server_state(request)
    if state.is_ready():
        return JSONResponse({"status": "ready"})
    if state.draining:
        status = "draining"
    elif state.engine is None:
        status = "loading"
    elif state.stalled:
        status = "stalled"
    else:
        status = "not ready"
    return JSONResponse({"status": status}, status_code=503)


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    """The Prometheus scrape; keyed only with ``metrics_require_key``."""
    state = server_state(request)
    if state.settings.metrics_require_key:
        check_api_key(request)
    registry = state.metrics.registry
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
