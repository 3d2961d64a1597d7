"""A real ``tessel serve --tensor-parallel-size 2`` process (gloo on the CPU) and its worker:
it serves rank-0-sampled greedy text equal to the one-rank engine's; a killed or hung worker turns
/ready to 503 and the server exits non-zero within the timeout; a killed server takes its worker
with it. Every case ends with no process of the group left."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tessel.engine import LLM, SamplingParams
from tests.checkpoints import write_tiny_checkpoint
from tests.e2e.conftest import API_KEY, ROOT, ServerProcess, start_server, stop_server

HEADERS = {"Authorization": f"Bearer {API_KEY}"}
TIMEOUT_S = 6  # --distributed-timeout-s: how long a hung worker may keep a step waiting
EXIT_WITHIN_S = TIMEOUT_S + 20  # the timeout, then the orderly shutdown (slow on a busy CPU)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_checkpoint(tmp_path_factory.mktemp("tp-e2e"), "llama")


@pytest.fixture
def tp_server(tiny_dir: Path, tmp_path: Path) -> Iterator[ServerProcess]:
    srv = start_server(
        tmp_path, "--model", str(tiny_dir), "--max-model-len", "256", "--tensor-parallel-size", "2",
        "--distributed-timeout-s", str(TIMEOUT_S),
    )
    pids = descendants(srv.process.pid)
    try:
        yield srv
    finally:
        stop_server(srv)
        for pid in pids:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (the worker, multiprocessing's resource tracker), from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def assert_all_gone(pids: list[int], within_s: float = 10.0) -> None:
    """Every process of the group ends soon after the server: multiprocessing's resource tracker
    leaves only once it reads EOF on the pipe the exited server held, a moment later on a busy CPU."""
    deadline = time.monotonic() + within_s
    while (left := [p for p in pids if alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, f"orphans left behind: {[Path(f'/proc/{p}/cmdline').read_bytes() for p in left]}"


def worker_pid(srv: ServerProcess) -> int:
    workers = [p for p in descendants(srv.process.pid) if b"spawn_main" in Path(f"/proc/{p}/cmdline").read_bytes()]
    assert len(workers) == 1, workers
    return workers[0]


def ready_status(srv: ServerProcess) -> int | None:
    """/ready's status, or None once the server no longer answers."""
    try:
        return httpx.get(f"{srv.base_url}/ready", timeout=2).status_code
    except httpx.HTTPError:
        return None


def wait_exit(srv: ServerProcess, within_s: float) -> tuple[int, float]:
    start = time.monotonic()
    code = srv.process.wait(timeout=within_s)
    return code, time.monotonic() - start


def test_serves_then_a_killed_worker_makes_it_unready_and_exit(
    tp_server: ServerProcess, tiny_dir: Path
) -> None:
    body = {"prompt": "The quick brown fox", "max_tokens": 12, "temperature": 0, "ignore_eos": True}
    reply = httpx.post(f"{tp_server.base_url}/v1/completions", json=body, headers=HEADERS, timeout=120)
    assert reply.status_code == 200, reply.text
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    expected = LLM(str(tiny_dir), num_blocks=256).generate(["The quick brown fox"], params)[0]
    assert reply.json()["choices"][0]["text"] == expected.outputs[0].text
    metrics = httpx.get(f"{tp_server.base_url}/metrics", timeout=10).text
    assert 'tessel_tensor_parallel_size{model_name="tiny-llama"} 2.0' in metrics

    group = descendants(tp_server.process.pid)
    os.kill(worker_pid(tp_server), signal.SIGKILL)
    deadline = time.monotonic() + EXIT_WITHIN_S
    while (status := ready_status(tp_server)) == 200 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert status in (503, None)  # 503, or already gone
    code, took = wait_exit(tp_server, EXIT_WITHIN_S)
    assert code == 1, tp_server.log()
    log = tp_server.log()
    assert "tensor-parallel worker rank 1" in log and "exited with code -9" in log
    assert "shutting the tensor-parallel group down" in log
    assert_all_gone(group)
    print(f"killed worker: server exited in {took:.1f} s")


def test_hung_worker_fails_the_step_after_the_timeout(tp_server: ServerProcess) -> None:
    worker = worker_pid(tp_server)
    group = descendants(tp_server.process.pid)
    os.kill(worker, signal.SIGSTOP)  # alive but silent: only the timeout can tell
    try:
        start = time.monotonic()
        body = {"prompt": "Hello", "max_tokens": 4}
        reply = httpx.post(f"{tp_server.base_url}/v1/completions", json=body, headers=HEADERS, timeout=60)
        waited = time.monotonic() - start
        assert reply.status_code == 500 and "tensor-parallel step failed" in reply.text
        assert TIMEOUT_S - 0.5 <= waited < TIMEOUT_S + 10
        code, _ = wait_exit(tp_server, EXIT_WITHIN_S)
        assert code == 1, tp_server.log()
        assert "Timed out" in tp_server.log()
    finally:
        if alive(worker):
            os.kill(worker, signal.SIGCONT)
    assert_all_gone(group)


def test_killed_server_takes_its_worker_along(tp_server: ServerProcess) -> None:
    group = descendants(tp_server.process.pid)
    assert group
    tp_server.process.kill()  # no shutdown code runs in the server
    tp_server.process.wait()
    assert_all_gone(group)


def test_unfit_size_exits_at_once_with_the_allowed_sizes(tmp_path: Path) -> None:
    """The default model's 9 query heads do not split over 2 ranks."""
    with pytest.raises(RuntimeError, match=r"server exited with 1:(.|\n)*allowed sizes: 1, 3"):
        start_server(tmp_path, "--tensor-parallel-size", "2")


PARENT = """
import subprocess, sys, time
child = "from tessel.engine.distributed.worker import exit_with_parent; import os, time; exit_with_parent(os.getppid()); print('watching', flush=True); time.sleep(120)"
p = subprocess.Popen([sys.executable, "-c", child], stdout=sys.stdout)
print(p.pid, flush=True)
time.sleep(120)
"""


def test_a_worker_busy_outside_any_collective_still_exits_with_its_parent() -> None:
    """The parent watch alone (no socket to notice closing, as while loading or in an NCCL op)."""
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        assert parent.stdout.readline().strip() == "watching"
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 5
        while alive(child) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(child), "the child outlived its parent"
    finally:
        parent.kill()
