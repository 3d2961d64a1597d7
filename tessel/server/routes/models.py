"""GET /v1/models."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request

from tessel.server.auth import require_api_key, server_state

router = APIRouter(dependencies=[Depends(require_api_key)])


@router.get("/v1/models")
async def list_models(request: Request) -> dict[str, Any]:
    state = server_state(request)
    engine = state.ready_engine()
    card = {
        "id": state.served_model_name,
        "object": "model",
        "created": state.created,
        "owned_by": "tessel",
        "root": engine.model_name,
        "max_model_len": engine.max_model_len,
    }
    return {"object": "list", "data": [card]}
