"""The worker processes rank 0 spawns on its own host (torch.multiprocessing, spawn), and the
thread that notices one of them exit."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess

import torch.distributed as dist
import torch.multiprocessing as mp

from tessel.config.settings import EngineConfig
from tessel.engine.distributed.group import TensorParallelError

log = logging.getLogger("tessel.engine")


def joined_key(rank: int) -> str:
    """The store key a spawned worker sets once it runs (before the slower group set-up)."""
    return f"tessel/worker-joined/{rank}"


class LocalWorkers:
    """Ranks 1..N-1 as child processes. They are daemonic (ended when this process exits) and
    each also watches its parent, so none outlives rank 0 even if it is killed."""

    def __init__(self, processes: Sequence[BaseProcess]) -> None:
        self.processes = list(processes)  # processes[i] is rank i + 1
        self.stopping = False

    @classmethod
    def spawn(cls, config: EngineConfig, size: int, port: int) -> LocalWorkers:
        from tessel.engine.distributed.worker import run_spawned_worker

        ctx = mp.get_context("spawn")
        processes = [
            ctx.Process(
                target=run_spawned_worker, args=(config, rank, size, port),
                name=f"tessel-tp-rank{rank}", daemon=True,
            )
            for rank in range(1, size)
        ]
        for p in processes:
            p.start()
        log.info(
            "tensor parallel x%d: spawned worker ranks %s",
            size, ", ".join(f"{r + 1} (pid {p.pid})" for r, p in enumerate(processes)),
        )
        return cls(processes)

    def wait_joined(self, store: dist.Store, timeout_s: float) -> None:
        """Until every worker has reached the store; a worker that exits first (a bad import,
        a spawn-unsafe main module) fails this at once instead of after the timeout."""
        keys = [joined_key(rank) for rank in range(1, len(self.processes) + 1)]
        deadline = time.monotonic() + timeout_s
        while not store.check(keys):
            for rank, p in enumerate(self.processes, start=1):
                if not p.is_alive():
                    raise TensorParallelError(
                        f"tensor-parallel worker rank {rank} (pid {p.pid}) exited with code "
                        f"{p.exitcode} while starting"
                    )
            if time.monotonic() > deadline:
                raise TensorParallelError(f"tensor-parallel workers did not start within {timeout_s:.0f} s")
            time.sleep(0.05)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.processes if p.pid is not None]

    def watch(self, on_exit: Callable[[TensorParallelError], None]) -> None:
        """Call ``on_exit`` (from a daemon thread) when a worker exits before ``stop``."""

        def run() -> None:
            by_sentinel = {p.sentinel: (rank, p) for rank, p in enumerate(self.processes, start=1)}
            first = wait(list(by_sentinel))[0]
            if self.stopping:
                return
            rank, p = by_sentinel[first]  # type: ignore[index]
            p.join(timeout=1)
            on_exit(TensorParallelError(
                f"tensor-parallel worker rank {rank} (pid {p.pid}) exited with code {p.exitcode}"
            ))

        threading.Thread(target=run, name="tessel-tp-monitor", daemon=True).start()

    def stop(self, grace_s: float) -> None:
        """Wait up to ``grace_s`` for the workers to leave, then kill what is left."""
        self.stopping = True
        deadline = time.monotonic() + grace_s
        for p in self.processes:
            p.join(timeout=max(deadline - time.monotonic(), 0))
        for p in self.processes:
            if p.is_alive():
                log.warning("tensor-parallel worker %s (pid %s) did not stop; killing it", p.name, p.pid)
                p.kill()
                p.join(timeout=5)
