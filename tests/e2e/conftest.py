"""A real ``tessel serve`` process on a free loopback port, and the offline engine beside it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tessel.engine import LLM
from tessel.server.settings import ServerSettings

ROOT = Path(__file__).resolve().parents[2]
# The same engine settings for the server and the offline reference.
ENGINE_FLAGS = {"max_model_len": 512, "num_blocks": 256, "max_num_seqs": 32}
API_KEY = "e2e-key"
STARTUP_TIMEOUT_S = 240


@dataclass
class ServerProcess:
    process: subprocess.Popen[bytes]
    base_url: str  # http://127.0.0.1:PORT
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def start_server(tmp: Path, *extra: str) -> ServerProcess:
    """``python -m server.cli serve`` with ENGINE_FLAGS; returns once /ready says 200."""
    port = free_port()
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in ENGINE_FLAGS.items()]
    cmd = [
        sys.executable,
        "-m",
        "tessel.server.cli",
        "serve",
        "--port",
        str(port),
        "--api-key",
        API_KEY,
        *flags,
        *extra,
    ]
    log_path = tmp / f"server-{port}.log"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with log_path.open("wb") as log:
        process = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env)
    server = ServerProcess(process, f"http://127.0.0.1:{port}", log_path)
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode}:\n{server.log()}")
        try:
            if httpx.get(f"{server.base_url}/ready", timeout=1).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    stop_server(server)
    raise RuntimeError(f"server not ready after {STARTUP_TIMEOUT_S} s:\n{server.log()}")


def stop_server(server: ServerProcess) -> int:
    if server.process.poll() is None:
        server.process.send_signal(signal.SIGINT)
        try:
            server.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.process.kill()
            server.process.wait()
    return server.process.returncode


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    srv = start_server(tmp_path_factory.mktemp("tessel"))
    yield srv
    stop_server(srv)


@pytest.fixture(scope="session")
def llm() -> LLM:
    """The offline engine with the server's settings: the reference for greedy texts."""
    return LLM(config=ServerSettings(**ENGINE_FLAGS).engine_config())
