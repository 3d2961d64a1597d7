"""The engine watchdog: work pending with no step finishing turns readiness off, and says so.

A stuck device or a wedged step leaves the process alive (``/health`` answers) but serving
nothing; the load balancer should stop sending to it, so ``/ready`` turns 503 while it lasts.
"""

from __future__ import annotations

import asyncio
import logging

from tessel.server.state import ServerState

log = logging.getLogger("tessel.watchdog")


def check_engine(state: ServerState) -> None:
    """One look: set ``state.stalled`` from the engine's progress, logging each change."""
    engine = state.engine
    if engine is None:
        return
    threshold = state.settings.watchdog_timeout_s
    waited = engine.seconds_without_progress()
    stalled = engine.is_alive() and waited > threshold
    if stalled and not state.stalled:
        log.error(
            "engine watchdog: work pending and no engine step finished for %.1f s "
            "(threshold %.1f s); /ready answers 503",
            waited,
            threshold,
        )
    elif state.stalled and not stalled:
        log.warning("engine watchdog: the engine makes progress again; /ready answers 200")
    state.stalled = stalled


async def watch_engine(state: ServerState) -> None:
    """Run ``check_engine`` a few times per threshold, until cancelled."""
    interval = min(1.0, state.settings.watchdog_timeout_s / 4)
    while True:
        await asyncio.sleep(interval)
        check_engine(state)
