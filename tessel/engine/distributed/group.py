"""The torch.distributed groups of one tensor-parallel engine.

Two groups, because they wait differently:
- the default group (NCCL on CUDA, gloo on the CPU) carries the model's all-reduces, the logits
  gather and the sampled ids; it has ``distributed_timeout_s``, so a hung peer fails the step;
- ``control`` (always gloo, on the CPU) carries rank 0's step broadcasts and start-up agreement;
  workers wait on it for as long as rank 0 idles, so it has no practical timeout, while rank 0's
  own sends on it carry the step timeout (``send_control``). A peer that dies closes its
  sockets, which fails a gloo wait at once.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from tessel.engine.models.layers.parallel import ParallelRank

CONTROL_TIMEOUT = timedelta(days=365)
TORCHRUN_KEYS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


class TensorParallelError(RuntimeError):
    """The tensor-parallel group failed (a rank died, hung past the timeout, or a step raised
    part-way, leaving the ranks out of step); the engine cannot continue."""


@dataclass(frozen=True)
class TorchrunEnv:
    """This process's place in a group started by torchrun (or any launcher setting its env)."""

    rank: int
    world_size: int
    local_rank: int


def torchrun_env() -> TorchrunEnv | None:
    """The standard RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT, if all are set."""
    if not all(k in os.environ for k in TORCHRUN_KEYS):
        return None
    rank = int(os.environ["RANK"])
    return TorchrunEnv(rank, int(os.environ["WORLD_SIZE"]), int(os.environ.get("LOCAL_RANK", rank)))


@dataclass
class TensorParallelGroup:
    """This process's rank, its device, and the control group (the data group is the default)."""

    rank: int
    size: int
    device: torch.device
    control: dist.ProcessGroup
    timeout: timedelta  # of a step's collectives

    @property
    def tp(self) -> ParallelRank:
        return ParallelRank(self.rank, self.size)

    def agree_min(self, value: int) -> int:
        """The smallest ``value`` over the ranks (the KV block count every rank can hold)."""
        t = torch.tensor([value], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.control)
        return int(t.item())

    def send_control(self, tensor: torch.Tensor) -> None:
        """Rank 0's broadcast on the control group, failing after the step timeout: gloo's send
        waits for the receiver to post its buffer, which a hung worker never does."""
        opts = dist.BroadcastOptions()
        opts.rootRank, opts.timeout = 0, self.timeout
        self.control.broadcast([tensor], opts).wait()

    def barrier(self) -> None:
        """Wait, without a deadline, until every rank is here (after loading, before serving)."""
        dist.barrier(group=self.control)

    def destroy(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


def init_group(
    rank: int, size: int, device_type: str, timeout_s: float,
    store: dist.Store | None = None, local_rank: int | None = None,
) -> TensorParallelGroup:
    """Join the group: through ``store`` (rank 0's, for workers it spawned) or the torchrun env."""
    if dist.is_initialized():
        raise RuntimeError(
            "torch.distributed is already initialised in this process: one tensor-parallel "
            "engine per process (shut the previous one down first)"
        )
    cuda = device_type == "cuda"
    device = torch.device("cuda", rank if local_rank is None else local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    timeout = timedelta(seconds=timeout_s)
    backend = "nccl" if cuda else "gloo"
    if store is not None:
        dist.init_process_group(backend, store=store, rank=rank, world_size=size, timeout=timeout)
    else:
        dist.init_process_group(backend, init_method="env://", rank=rank, world_size=size, timeout=timeout)
    control = dist.new_group(backend="gloo", timeout=CONTROL_TIMEOUT)
    return TensorParallelGroup(rank, size, device, control, timeout)


def leader_store(size: int, timeout_s: float) -> dist.TCPStore:
    """Rank 0's rendezvous store on a free loopback port, for workers spawned on this host."""
    return dist.TCPStore(
        "127.0.0.1", 0, size, is_master=True, timeout=timedelta(seconds=timeout_s),
        wait_for_workers=False,
    )


def worker_store(port: int, size: int, timeout_s: float) -> dist.TCPStore:
    return dist.TCPStore("127.0.0.1", port, size, is_master=False, timeout=timedelta(seconds=timeout_s))
