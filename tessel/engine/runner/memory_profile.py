"""Size the KV cache from free GPU memory after the weights and a profiling run of the largest step."""

from __future__ import annotations

import torch
from torch import nn

from tessel.config.model_arch import ModelArch
from tessel.kernels.attention.metadata import AttentionMetadata


@torch.inference_mode()
def peak_activation_bytes(
    model: nn.Module, arch: ModelArch, max_tokens: int, max_seqs: int, block_size: int,
    dtype: torch.dtype, device: torch.device, num_kv_heads: int | None = None,
) -> int:
    """Device memory the largest step needs beyond weights and KV: one prefill of ``max_tokens``
    tokens through a scratch cache (of ``dtype``: the KV cache's), plus float32 logits for
    ``max_seqs`` rows."""
    blocks = -(-max_tokens // block_size)
    shape = (blocks, block_size, num_kv_heads or arch.num_key_value_heads, arch.head_dim)
    caches = [(torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
              for _ in range(arch.num_hidden_layers)]
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    ids = torch.zeros(max_tokens, dtype=torch.long, device=device)
    positions = torch.arange(max_tokens, device=device)
    md = AttentionMetadata.single_prefill(max_tokens, block_size, device)
    hidden = model(ids, positions, caches, md)
    rows = hidden[:1].expand(max_seqs, -1).contiguous()
    logits = model.compute_logits(rows)  # type: ignore[operator]  # None on tensor-parallel workers: rank 0 has them
    if logits is not None:
        torch.softmax(logits.float(), dim=-1)
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - base
    cache_bytes = sum(k.numel() * k.element_size() * 2 for k, _ in caches)
    del caches, hidden, rows, logits, md
    torch.cuda.empty_cache()
    return int(peak - cache_bytes)


def device_bytes_in_use(device: torch.device) -> int:
    """Memory in use on the device by anyone (this process's other engines, other processes)."""
    free, total = torch.cuda.mem_get_info(device)
    return int(total - free)


def kv_budget_bytes(
    utilization: float, in_use_at_start: int, activation_bytes: int, device: torch.device,
    reserve: int = 512 << 20,
) -> int:
    """What the KV cache may take: this engine's share (utilization x total) less what it has
    taken since it started (weights), the profiled activations and a reserve for CUDA graphs and
    the pipeline's buffers. As in vLLM, memory others held before the start is not charged to the
    share (two engines at 0.3 fit on one device), but the cache never exceeds what is free now."""
    free, total = torch.cuda.mem_get_info(device)
    own = (total - free) - in_use_at_start
    share = utilization * total - own - activation_bytes - reserve
    return int(min(share, free - activation_bytes - reserve))
