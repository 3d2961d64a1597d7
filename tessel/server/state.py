"""What the app knows about itself: the engine (once loaded), admission, in-flight and drain."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tessel.server.metrics import ServerMetrics
from tessel.server.protocol.errors import APIError
from tessel.server.settings import ServerSettings

if TYPE_CHECKING:
    from tessel.engine import AsyncEngine

RETRY_AFTER_S = 1  # what a 429 tells the client to wait


@dataclass
class Ticket:
    """One admitted HTTP request: queued until its first token, in flight until closed."""

    state: ServerState
    tokens: int  # prompt tokens it counts against ``max_queue_tokens`` while queued
    queued: bool = True
    closed: bool = False

    def set_tokens(self, tokens: int) -> None:
        """Replace the admission estimate by the exact count, once the prompts are encoded."""
        if self.queued:
            self.state.num_queued_tokens += tokens - self.tokens
        self.tokens = tokens

    def started(self) -> None:
        """The first output arrived: the request no longer counts against the queue limits."""
        if self.queued:
            self.queued = False
            self.state.num_queued -= 1
            self.state.num_queued_tokens -= self.tokens

    def close(self) -> None:
        if not self.closed:
            self.started()
            self.closed = True
            self.state.num_in_flight -= 1


@dataclass
class ServerState:
    """Shared by every route through ``app.state.tessel``."""

    settings: ServerSettings
    metrics: ServerMetrics
    api_keys: list[str] = field(default_factory=list)  # flags, environment and key file
    engine: AsyncEngine | None = None  # None while the model loads
    served_model_name: str = ""
    created: int = field(default_factory=lambda: int(time.time()))
    draining: bool = False
    stalled: bool = False  # the watchdog saw work pending with no step finishing
    load_error: BaseException | None = None
    num_queued: int = 0  # admitted, no output yet (tokenizing, waiting or prefilling)
    num_queued_tokens: int = 0  # their prompt tokens (estimated until encoded)
    num_in_flight: int = 0  # admitted, response not yet finished

    def ready_engine(self) -> AsyncEngine:
        """The engine, or a 503 while the model is loading or the server drains."""
        if self.draining:
            raise APIError(503, "the server is shutting down", code="draining")
        if self.engine is None:
            raise APIError(503, "the model is still loading", code="loading")
        return self.engine

    def is_ready(self) -> bool:
        return (
            not self.draining
            and not self.stalled
            and self.engine is not None
            and self.engine.is_alive()
        )

    def check_model(self, model: str | None) -> None:
        # Before the model loads its name is unknown: a 404 naming "``" would tell a client to
        # fix a request that is right, where a 503 tells it to retry.
        self.ready_engine()
        if model is not None and model != self.served_model_name:
            raise APIError(
                404,
                f"The model `{model}` does not exist; this server serves `{self.served_model_name}`.",
                param="model",
                code="model_not_found",
            )

    def admit(self, estimated_tokens: int) -> Ticket:
        """Admit a generation request, or refuse it (503 draining, 429 queue full by requests
        or by prompt tokens) before any tokenizing is spent on it. A request alone in the
        queue is always admitted, however long: a retry could never do better."""
        self.ready_engine()
        settings = self.settings
        if self.num_queued >= settings.max_queue:
            self._refuse(f"{settings.max_queue} requests waiting")
        if (
            self.num_queued
            and self.num_queued_tokens + estimated_tokens > settings.max_queue_tokens
        ):
            self._refuse(
                f"{self.num_queued_tokens} prompt tokens waiting, this request adds about "
                f"{estimated_tokens}, the limit is {settings.max_queue_tokens}"
            )
        self.num_queued += 1
        self.num_queued_tokens += estimated_tokens
        self.num_in_flight += 1
        return Ticket(self, estimated_tokens)

    def _refuse(self, why: str) -> None:
        self.metrics.rejected("queue_full")
        raise APIError(
            429,
            f"the server's queue is full ({why}); retry later",
            code="queue_full",
            headers={"Retry-After": str(RETRY_AFTER_S)},
        )

    async def wait_idle(self, timeout_s: float) -> bool:
        """Wait until no request is in flight; False when ``timeout_s`` passed first."""
        deadline = time.monotonic() + timeout_s
        while self.num_in_flight > 0:
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.05)
        return True
