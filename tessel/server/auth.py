"""API keys: loaded from flags, environment and a key file; checked in constant time."""

from __future__ import annotations

import hmac
from pathlib import Path

from fastapi import Request

from tessel.server.protocol.errors import APIError
from tessel.server.settings import ServerSettings
from tessel.server.state import ServerState


def server_state(request: Request) -> ServerState:
    """The app's ``ServerState`` (a FastAPI dependency)."""
    state: ServerState = request.app.state.tessel
    return state


def load_api_keys(settings: ServerSettings) -> list[str]:
    """``--api-key``/``TESSEL_API_KEY`` plus the lines of ``--api-key-file`` (blank lines and
    ``#`` comments skipped). A missing or unreadable file is an error at start-up."""
    keys = [key for key in settings.api_key if key]
    if settings.api_key_file is not None:
        text = Path(settings.api_key_file).read_text(encoding="utf-8")
        for line in text.splitlines():
            key = line.strip()
            if key and not key.startswith("#"):
                keys.append(key)
    return keys


def key_matches(given: str, keys: list[str]) -> bool:
    """True when ``given`` equals one of ``keys``; every key is compared, each in constant time."""
    given_bytes = given.encode()
    matched = False
    for key in keys:
        matched |= hmac.compare_digest(given_bytes, key.encode())
    return matched


def check_api_key(request: Request) -> None:
    """401 unless ``Authorization: Bearer <key>`` names a configured key (no keys: open)."""
    keys = server_state(request).api_keys
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


async def require_api_key(request: Request) -> None:
    """The API routes' dependency: ``check_api_key``."""
    check_api_key(request)
