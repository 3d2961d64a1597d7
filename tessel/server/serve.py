"""Running the app under uvicorn, with a graceful drain on SIGTERM.

uvicorn's own SIGTERM handling stops accepting connections at once and re-raises the
signal after shutdown (exit status 143). Serving fleets want a drain instead: readiness
turns 503 so the load balancer stops sending, requests in flight finish (up to
``drain_timeout_s``), then the process exits 0. A second signal exits at once.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import threading
from types import FrameType

import uvicorn

from tessel.server.app import build_app
from tessel.server.settings import ServerSettings
from tessel.server.state import ServerState

log = logging.getLogger("tessel.server")

FAILED_EXIT_GRACE_S = 15.0
"""After a fatal failure, how long the orderly shutdown may take before the process is ended
anyway (a step thread stuck in a dead NCCL collective would otherwise block exit forever)."""


class DrainingServer(uvicorn.Server):
    """A uvicorn server whose first SIGTERM drains instead of stopping."""

    def __init__(self, config: uvicorn.Config, state: ServerState, drain_timeout_s: float) -> None:
        super().__init__(config)
        self.state = state
        self.drain_timeout_s = drain_timeout_s
        self.exit_code = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain: asyncio.Task[None] | None = None

    async def serve(self, sockets: list | None = None) -> None:  # type: ignore[type-arg]
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if sig == signal.SIGTERM and not self.state.draining and self._loop is not None:
            self.state.draining = True  # readiness turns 503 and new requests get 503 now
            self._loop.call_soon_threadsafe(self._start_drain)
            return
        self.force_exit = self.should_exit  # a second signal: stop waiting
        self.should_exit = True

    def _start_drain(self) -> None:
        self._drain = asyncio.ensure_future(self._drain_then_exit())

    async def _drain_then_exit(self) -> None:
        log.info("SIGTERM: draining %d request(s) in flight", self.state.num_in_flight)
        if not await self.state.wait_idle(self.drain_timeout_s):
            log.warning(
                "drain timeout (%.0f s) passed with %d request(s) in flight",
                self.drain_timeout_s,
                self.state.num_in_flight,
            )
        self.should_exit = True

    def fail(self, err: BaseException) -> None:
        """The model could not be loaded, or the engine stopped for good: exit non-zero."""
        if self.exit_code:
            return
        log.error("exiting: %s", err)
        self.exit_code = 1
        self.should_exit = True
        timer = threading.Timer(FAILED_EXIT_GRACE_S, _hard_exit, args=(self.exit_code,))
        timer.daemon = True
        timer.start()


def _hard_exit(code: int) -> None:
    log.error("shutdown did not finish within %.0f s; exiting now", FAILED_EXIT_GRACE_S)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def serve(settings: ServerSettings) -> int:
    """Serve until SIGINT, or SIGTERM and a drain; the process's exit status."""
    holder: list[DrainingServer] = []
    app = build_app(settings, on_load_failure=lambda err: holder[0].fail(err))
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level.lower(),
        log_config=None,  # uvicorn's lines go through our root handler, request ids included
        timeout_graceful_shutdown=5,
        access_log=False,
    )
    server = DrainingServer(config, app.state.tessel, settings.drain_timeout_s)
    holder.append(server)
    server.run()
    return server.exit_code
