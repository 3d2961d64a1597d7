"""Double-buffered step inputs: pinned host arrays that stage 1 fills, device twins that stage 2
copies them into, and the events that keep step N+2 from overwriting what step N still reads."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class BufferSpec:
    """Capacity of one input buffer."""

    name: str
    size: int  # elements
    dtype: torch.dtype


def input_specs(max_tokens: int, max_seqs: int, max_blocks: int, plan_size: int) -> list[BufferSpec]:
    """Every per-step input of the model, sized for the largest step the scheduler can make."""
    return [
        BufferSpec("input_ids", max_tokens, torch.int64),
        BufferSpec("positions", max_tokens, torch.int64),
        BufferSpec("slot_mapping", max_tokens, torch.int64),
        BufferSpec("query_start_loc", max_seqs + 1, torch.int32),
        BufferSpec("seq_lens", max_seqs, torch.int32),
        BufferSpec("block_tables", max_seqs * max_blocks, torch.int32),
        BufferSpec("logits_indices", max_seqs, torch.int64),
        BufferSpec("prev_src", max_seqs, torch.int64),  # rows of the last step's sampled ids...
        BufferSpec("prev_dst", max_seqs, torch.int64),  # ...and the input_ids rows they fill
        BufferSpec("decode_plan", max(plan_size, 1), torch.int32),
    ]


class StepBuffers:
    """One set of inputs: stage 1 writes ``host(name)[:n]`` (numpy views of pinned memory),
    stage 2 ``upload``s the written prefixes, stage 3 reads ``device(name)``."""

    def __init__(self, specs: list[BufferSpec], device: torch.device, index: int) -> None:
        self.index = index
        self.device = device
        cuda = device.type == "cuda"
        self._host = {s.name: torch.zeros(s.size, dtype=s.dtype, pin_memory=cuda) for s in specs}
        # On the CPU the "device" buffers are the host ones: stage 2 has nothing to copy.
        self._dev = (
            {s.name: torch.zeros(s.size, dtype=s.dtype, device=device) for s in specs}
            if cuda
            else self._host
        )
        self._np = {name: t.numpy() for name, t in self._host.items()}
        self._used: dict[str, int] = {}
        self.uploaded: torch.cuda.Event | None = None  # stage 2 done: host side reusable
        self.consumed: torch.cuda.Event | None = None  # stage 4 enqueued after it: device side reusable

    def write(self, name: str, values: np.ndarray) -> np.ndarray:
        """Copy ``values`` into the host buffer; returns the written view."""
        n = int(values.size)
        view = self._np[name][:n]
        view[:] = values.reshape(-1)
        self._used[name] = n
        return view

    def reserve(self, name: str, n: int) -> np.ndarray:
        """The host view of the first ``n`` elements, to fill in place (e.g. the decode plan)."""
        self._used[name] = n
        return self._np[name][:n]

    def used(self, name: str) -> int:
        return self._used.get(name, 0)

    def host_view(self, name: str) -> np.ndarray:
        """The written prefix of a host buffer (what a tensor-parallel step broadcasts)."""
        return self._np[name][: self._used.get(name, 0)]

    def device_view(self, name: str) -> torch.Tensor:
        return self._dev[name][: self._used.get(name, 0)]

    def begin(self) -> None:
        """Stage 1 may write: wait (host) until this set's previous upload has left pinned memory."""
        if self.uploaded is not None:
            self.uploaded.synchronize()
        self._used.clear()

    def upload(self, stream: torch.cuda.Stream | None) -> None:
        """Stage 2: non-blocking copies of the written prefixes on ``stream``, once the compute
        stream is done with what the previous user of this set read."""
        if stream is None:
            return
        with torch.cuda.stream(stream):
            if self.consumed is not None:
                stream.wait_event(self.consumed)
            for name, n in self._used.items():
                if n:
                    self._dev[name][:n].copy_(self._host[name][:n], non_blocking=True)
            self.uploaded = torch.cuda.Event()
            self.uploaded.record(stream)


class DoubleBuffer:
    """Two ``StepBuffers`` used alternately, so stage 1-2 of step N+1 overlap stage 3 of step N."""

    def __init__(self, specs: list[BufferSpec], device: torch.device) -> None:
        self.sets = [StepBuffers(specs, device, 0), StepBuffers(specs, device, 1)]
        self._next = 0

    def acquire(self) -> StepBuffers:
        buf = self.sets[self._next]
        self._next ^= 1
        buf.begin()
        return buf
