"""Rank 0's hold on a tensor-parallel group: start it, notice when it fails, shut it down."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from tessel.config.settings import EngineConfig
from tessel.engine.distributed.group import (
    TensorParallelError,
    TensorParallelGroup,
    init_group,
    leader_store,
    torchrun_env,
)
from tessel.engine.distributed.local_workers import LocalWorkers
from tessel.engine.distributed.step_channel import StepChannel
from tessel.engine.shard_setup import resolve_device

log = logging.getLogger("tessel.engine")

STOP_GRACE_S = 10.0  # how long workers get to leave after the stop message
START_TIMEOUT_S = 600.0  # spawned workers must import torch and reach the store within this


class TensorParallelLeader:
    """The group as rank 0 sees it, with the workers it spawned (none under torchrun)."""

    def __init__(self, group: TensorParallelGroup, workers: LocalWorkers | None) -> None:
        self.group = group
        self.workers = workers
        self.failure: TensorParallelError | None = None
        self._callbacks: list[Callable[[TensorParallelError], None]] = []
        self._lock = threading.Lock()
        self._closed = False

    @classmethod
    def start(cls, config: EngineConfig) -> TensorParallelLeader:
        """Join torchrun's group when its environment says so, else spawn ranks 1..N-1 here."""
        size, timeout = config.tensor_parallel_size, config.distributed_timeout_s
        device_type = resolve_device(config).type
        env = torchrun_env()
        if env is not None and env.world_size > 1:
            if env.world_size != size or env.rank != 0:
                raise ValueError(
                    f"under torchrun (RANK={env.rank}, WORLD_SIZE={env.world_size}) rank 0 "
                    f"serves with tensor_parallel_size={env.world_size}; got {size}"
                )
            return cls(init_group(0, size, device_type, timeout, local_rank=env.local_rank), None)
        store = leader_store(size, timeout)
        workers = LocalWorkers.spawn(config, size, store.port)
        try:
            workers.wait_joined(store, max(timeout, START_TIMEOUT_S))
            group = init_group(0, size, device_type, timeout, store=store)
        except BaseException:
            workers.stop(grace_s=0)
            raise
        leader = cls(group, workers)
        workers.watch(leader.fail)
        return leader

    @property
    def size(self) -> int:
        return self.group.size

    def on_failure(self, callback: Callable[[TensorParallelError], None]) -> None:
        """Call ``callback`` (from any thread) once the group fails; at once if it has."""
        with self._lock:
            failed = self.failure
            if failed is None:
                self._callbacks.append(callback)
        if failed is not None:
            callback(failed)

    def fail(self, error: TensorParallelError) -> None:
        """Record the group's failure (a worker exited, a collective raised or timed out)."""
        with self._lock:
            if self.failure is not None or self._closed:
                return
            self.failure = error
            callbacks = list(self._callbacks)
        log.error("%s; shutting the tensor-parallel group down", error)
        for callback in callbacks:
            callback(error)

    def shutdown(self) -> None:
        """Stop the workers: a stop message while the group is healthy, then join, then kill."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if self.workers is not None:
            self.workers.stopping = True
        if self.failure is None:
            try:
                StepChannel(self.group).send_stop()
            except Exception as exc:  # a peer already gone: the kill below ends the rest
                log.warning("tensor parallel: could not send stop (%s)", exc)
        if self.workers is not None:
            self.workers.stop(grace_s=STOP_GRACE_S if self.failure is None else 0)
        if self.failure is None or self.group.device.type != "cuda":
            self.group.destroy()  # a failed NCCL group may hang in destroy; the process ends anyway

