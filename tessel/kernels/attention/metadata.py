"""What one engine step tells every attention layer: plain tensors, built once per step."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class AttentionMetadata:
    """The batch's layout over the paged KV cache.

    Tokens of all requests are packed along one axis (``num_tokens``); request ``b`` owns
    query rows ``query_start_loc[b]:query_start_loc[b + 1]``, which are the last positions
    of its ``seq_lens[b]`` tokens of context (cached prefix + new tokens).
    """

    slot_mapping: torch.Tensor  # [num_tokens] int64: cache slot (block * block_size + offset) per new token; -1 skips
    query_start_loc: torch.Tensor  # [batch + 1] int32: prefix sums of new tokens per request
    seq_lens: torch.Tensor  # [batch] int32: context length of each request after this step
    block_tables: torch.Tensor  # [batch, max_blocks] int32: physical block ids; unused entries are 0
    max_query_len: int  # longest run of new tokens (1 for a pure decode batch)
    max_seq_len: int  # longest context
    block_size: int
    # seq_lens on the host, so planning a step's decode tiles needs no device-to-host copy.
    seq_lens_cpu: torch.Tensor | None = None
    # Per-step work the backend computes once and every layer reuses (e.g. the decode tile plan
    # on CUDA, the gather index on the CPU reference path).
    scratch: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def single_prefill(cls, num_tokens: int, block_size: int, device: torch.device) -> AttentionMetadata:
        """One request's whole prompt over a scratch cache whose blocks are 0, 1, 2, ... in
        order (profiling and calibration runs)."""
        n = num_tokens
        return cls(
            slot_mapping=torch.arange(n, device=device),
            query_start_loc=torch.tensor([0, n], dtype=torch.int32, device=device),
            seq_lens=torch.tensor([n], dtype=torch.int32, device=device),
            block_tables=torch.arange(-(-n // block_size), dtype=torch.int32, device=device)[None],
            max_query_len=n, max_seq_len=n, block_size=block_size,
            seq_lens_cpu=torch.tensor([n], dtype=torch.int32),
        )

    @property
    def batch_size(self) -> int:
        return int(self.seq_lens.shape[0])

    @property
    def is_decode_only(self) -> bool:
        return self.max_query_len == 1
