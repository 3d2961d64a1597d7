"""The real engine on the default model, loaded once; apps are built around it per test.

Every async test here runs on the session's event loop (the engine's loop task lives there):
modules set ``pytestmark = pytest.mark.asyncio(loop_scope="session")``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
import pytest_asyncio
from fastapi import FastAPI

from tessel.engine import AsyncEngine, SamplingParams
from tessel.server.app import build_app
from tessel.server.settings import ServerSettings

# Small enough to load fast and to see a leaked block: 128 blocks of 16 tokens.
ENGINE_SETTINGS = {"max_model_len": 512, "num_blocks": 128, "max_num_seqs": 16}
IDLE_KV_BLOCKS: dict[int, int] = {}  # engine id -> blocks used before any request


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def engine() -> AsyncIterator[AsyncEngine]:
    config = ServerSettings(**ENGINE_SETTINGS).engine_config()
    eng = await asyncio.to_thread(AsyncEngine.from_config, config)
    await eng.start()
    IDLE_KV_BLOCKS[id(eng)] = eng.stats().kv_blocks_used
    yield eng
    await eng.shutdown()


@asynccontextmanager
async def serving(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    """An httpx client talking to ``app`` in-process, its lifespan entered."""
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://tessel", timeout=120
        ) as client:
            yield client


@pytest.fixture
def make_app(engine: AsyncEngine) -> Callable[..., FastAPI]:
    def make(**settings: Any) -> FastAPI:
        return build_app(ServerSettings(**{**ENGINE_SETTINGS, **settings}), engine)

    return make


@pytest_asyncio.fixture(loop_scope="session")
async def client(make_app: Callable[..., FastAPI]) -> AsyncIterator[httpx.AsyncClient]:
    async with serving(make_app()) as c:
        yield c


async def engine_text(
    engine: AsyncEngine, prompt: str | list[int], params: SamplingParams
) -> list[str]:
    """The reference: each choice's full text straight from ``AsyncEngine.generate``."""
    texts = [""] * params.n
    async for out in engine.generate(
        prompt, params, f"ref-{id(params)}-{asyncio.get_running_loop().time()}"
    ):
        for choice in out.outputs:
            texts[choice.index] += choice.text
    return texts


async def wait_until_idle(engine: AsyncEngine, timeout_s: float = 30.0) -> None:
    """Until the engine holds no request and no KV block (aborts land at a step boundary)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        stats = engine.stats()
        idle_blocks = IDLE_KV_BLOCKS.get(id(engine), 0)
        if (
            stats.num_running == 0
            and stats.num_waiting == 0
            and stats.kv_blocks_used <= idle_blocks
        ):
            return
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"engine not idle after {timeout_s} s: {stats}")
        await asyncio.sleep(0.05)
