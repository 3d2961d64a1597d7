"""A tensor-parallel worker: join the group, build this rank's shard, then run each step rank 0
broadcasts until it says stop. Spawned by rank 0, or started by torchrun as ``tessel serve``."""

from __future__ import annotations

import logging
import os
import threading
import time

import torch

from tessel.config.model_arch import ModelArch
from tessel.config.settings import EngineConfig
from tessel.engine.distributed.group import (
    TensorParallelGroup,
    init_group,
    torchrun_env,
    worker_store,
)
from tessel.engine.distributed.local_workers import joined_key
from tessel.engine.gc_freeze import freeze_startup_heap
from tessel.engine.loader import load_checkpoint
from tessel.engine.shard_setup import build_shard, resolve_device

log = logging.getLogger("tessel.engine")

PARENT_POLL_S = 0.5


def run_spawned_worker(config: EngineConfig, rank: int, size: int, port: int) -> None:
    """Entry point of a process rank 0 spawned; exits with 1 if anything fails."""
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s %(levelname)s tp-rank{rank}: %(message)s")
    exit_with_parent(os.getppid())
    device = resolve_device(config)
    if device.type == "cpu":  # the ranks share this host's cores
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // size))
    try:
        store = worker_store(port, size, config.distributed_timeout_s)
        store.set(joined_key(rank), "1")
        group = init_group(rank, size, device.type, config.distributed_timeout_s, store=store)
        follow_steps(config, group)
    except BaseException:
        log.exception("tensor-parallel worker rank %d failed", rank)
        os._exit(1)  # no atexit: a broken group's teardown could block


def run_torchrun_worker(config: EngineConfig) -> int:
    """``tessel serve`` on a torchrun rank other than 0: a worker for rank 0's server."""
    env = torchrun_env()
    assert env is not None and env.rank > 0
    if env.world_size != config.tensor_parallel_size:
        raise ValueError(
            f"torchrun started WORLD_SIZE={env.world_size} processes but tensor_parallel_size="
            f"{config.tensor_parallel_size}; pass --tensor-parallel-size {env.world_size}"
        )
    device = resolve_device(config)
    group = init_group(
        env.rank, env.world_size, device.type, config.distributed_timeout_s, local_rank=env.local_rank
    )
    follow_steps(config, group)
    return 0


def follow_steps(config: EngineConfig, group: TensorParallelGroup) -> None:
    """Load this rank's shard and run rank 0's steps until the stop message."""
    checkpoint = load_checkpoint(config.model)
    arch = ModelArch.from_hf(checkpoint.hf_config)
    shard = build_shard(config, checkpoint, arch, group)
    pipeline = shard.runner.pipeline
    assert pipeline.channel is not None
    log.info("tensor-parallel rank %d of %d ready on %s", group.rank, group.size, group.device)
    freeze_startup_heap()
    sampled = None
    while (step := pipeline.channel.receive(pipeline.buffers.acquire(), pipeline.static_plan)) is not None:
        sampled = pipeline.follow(step, sampled)
    group.destroy()


def exit_with_parent(parent: int) -> None:
    """Exit at once when rank 0 dies (this process is re-parented), even mid-collective."""

    def run() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_S)
        os._exit(1)

    threading.Thread(target=run, name="tessel-tp-parent-watch", daemon=True).start()
