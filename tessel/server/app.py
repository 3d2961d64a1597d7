"""``build_app``: the FastAPI application around one engine."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware

from tessel.engine.gc_freeze import freeze_startup_heap
from tessel.server.auth import load_api_keys
from tessel.server.limits import BodySizeLimit
from tessel.server.metrics import ServerMetrics
from tessel.server.protocol.errors import install_error_handlers
from tessel.server.request_log import RequestIdMiddleware
from tessel.server.routes import chat, completion, health, models, tokenize
from tessel.server.settings import ServerSettings
from tessel.server.state import ServerState
from tessel.server.watchdog import watch_engine

if TYPE_CHECKING:
    from tessel.engine import AsyncEngine

log = logging.getLogger("tessel.server")


def build_app(
    settings: ServerSettings,
    engine: AsyncEngine | None = None,
    on_load_failure: Callable[[BaseException], None] | None = None,
) -> FastAPI:
    """The app serving ``engine``, which the caller then owns (starts and shuts down).

    Without ``engine`` the app loads one from ``settings`` in the background once it starts,
    answering /health at once and /ready with 503 until the model is loaded, and shuts it
    down on exit. ``on_load_failure`` is told if that load fails, or if the engine later stops
    for good (a tensor-parallel worker died or hung): the CLI then exits non-zero.
    """
    state = ServerState(
        settings=settings, metrics=ServerMetrics(), api_keys=load_api_keys(settings)
    )
    state.metrics.add_engine_collector(lambda: state.engine.stats() if state.engine else None)
    state.metrics.add_server_collector(
        lambda: {
            "in_flight": state.num_in_flight,
            "queued": state.num_queued,
            "queued_tokens": state.num_queued_tokens,
            "stalled": float(state.stalled),
        }
    )
    if engine is not None:
        _attach(state, engine)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        owned: list[AsyncEngine] = []
        loader = None
        if state.engine is None:
            loader = asyncio.create_task(_load(state, owned, on_load_failure))
        watchdog = asyncio.create_task(watch_engine(state), name="tessel-watchdog")
        try:
            yield
        finally:
            state.draining = True
            watchdog.cancel()
            if loader is not None:
                loader.cancel()
            await asyncio.gather(watchdog, *([loader] if loader else []), return_exceptions=True)
            for own in owned:
                await own.shutdown()

    app = FastAPI(title="Tessel", version="0.1.0", lifespan=lifespan)
    app.state.tessel = state
    install_error_handlers(app)
    for module in (completion, chat, models, tokenize, health):
        app.include_router(module.router)
    if settings.cors_allow_origins:  # off unless configured: browsers may not call us
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_allow_origins,
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "Content-Type", "X-Request-Id"],
        )
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_request_bytes)
    app.add_middleware(RequestIdMiddleware)  # outermost: every log line of the request has it
    return app


def _attach(state: ServerState, engine: AsyncEngine) -> None:
    state.served_model_name = state.settings.served_model_name or engine.model_name
    state.metrics.model_name = state.served_model_name
    state.metrics.init_labels()
    state.engine = engine


async def _load(
    state: ServerState,
    owned: list[AsyncEngine],
    on_failure: Callable[[BaseException], None] | None,
) -> None:
    # heavy (torch): imported only when a model is loaded
    from tessel.engine.process_engine import open_engine

    settings = state.settings
    try:
        engine = await asyncio.to_thread(open_engine, settings.engine_config(), settings.engine_process)
        owned.append(engine)
        await engine.start()
        if on_failure is not None:
            engine.on_fatal(on_failure)
    except Exception as err:
        log.exception("loading the model failed")
        state.load_error = err
        if on_failure is not None:
            on_failure(err)
        return
    _attach(state, engine)
    freeze_startup_heap()  # the server's own loop streams every token: same stalls to avoid
    log.info(
        "Tessel ready: serving %s (max_model_len %d) at http://%s:%d/v1",
        state.served_model_name,
        engine.max_model_len,
        settings.host,
        settings.port,
    )
