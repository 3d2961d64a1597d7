"""Bearer-token check for the API routes, in constant time."""

from __future__ import annotations

import hmac

from fastapi import Request

from server.protocol.errors import APIError
from server.state import ServerState


def server_state(request: Request) -> ServerState:
    """The app's ``ServerState`` (a FastAPI dependency)."""
    state: ServerState = request.app.state.tessel
    return state


def key_matches(given: str, keys: list[str]) -> bool:
    """True when ``given`` equals one of ``keys``; every key is compared, each in constant time."""
    given_bytes = given.encode()
    matched = False
    for key in keys:
        matched |= hmac.compare_digest(given_bytes, key.encode())
    return matched


async def require_api_key(request: Request) -> None:
    """401 unless ``Authorization: Bearer <key>`` names a configured key (no keys: open)."""
    keys = server_state(request).settings.api_key
    if not keys:
        return
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token:
        raise APIError(
            401,
            "Missing API key: send it as 'Authorization: Bearer YOUR_KEY'.",
            code="invalid_api_key",
            headers={"WWW-Authenticate": "Bearer"},
        )
    if not key_matches(token.strip(), keys):
        raise APIError(
            401,
            "Incorrect API key provided.",
            code="invalid_api_key",
            headers={"WWW-Authenticate": "Bearer"},
        )
