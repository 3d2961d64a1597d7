"""One rank's share of the engine: its model shard with weights (quantized and packed for the
CPU where asked), a KV cache every rank can hold, and the runner. Rank 0 and the tensor-parallel
workers build it with the same code, so their collectives (quantization scales, SmoothQuant's
calibration, profiling, graph capture) line up one for one."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from tessel.config.model_arch import ModelArch
from tessel.config.settings import EngineConfig
from tessel.engine.loader import Checkpoint
from tessel.engine.models.layers.parallel import SINGLE
from tessel.engine.models.layers.quantization import (
    QuantConfig,
    quantize_model,
    resolve_quant_config,
)
from tessel.engine.models.layers.quantization.compressed_tensors import drop_zero_points
from tessel.engine.models.registry import build_model
from tessel.engine.runner.cuda_graph import default_graph_sizes
from tessel.engine.runner.host_allocator import keep_step_buffers_in_heap
from tessel.engine.runner.memory_profile import (
    device_bytes_in_use,
    kv_budget_bytes,
    peak_activation_bytes,
)
from tessel.engine.runner.model_runner import ModelRunner, RunnerLimits, kv_bytes_per_block
from tessel.kernels.attention.decode_plan import DecodeConfig

if TYPE_CHECKING:
    from tessel.engine.distributed.group import TensorParallelGroup

log = logging.getLogger("tessel.engine")

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class Shard:
    """What one rank built."""

    model: nn.Module
    runner: ModelRunner
    num_blocks: int  # KV blocks, the same on every rank
    kv_bytes_per_block: int  # on this rank (its KV heads only)
    max_model_len: int
    device: torch.device
    dtype: torch.dtype
    quant: QuantConfig | None  # the W8A8 plan; None: unquantized


def resolve_device(config: EngineConfig) -> torch.device:
    if config.device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(config.device)


def resolve_dtype(config: EngineConfig, device: torch.device) -> torch.dtype:
    if config.model.dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return _DTYPES[config.model.dtype]


def resolve_kv_cache_dtype(config: EngineConfig, device: torch.device, dtype: torch.dtype) -> torch.dtype:
    if config.cache.kv_cache_dtype == "auto":
        return dtype
    if device.type == "cuda" and torch.cuda.get_device_capability(device) < (8, 9):
        major, minor = torch.cuda.get_device_capability(device)
        raise ValueError(
            f"kv_cache_dtype={config.cache.kv_cache_dtype} needs a GPU with fp8 conversions (compute "
            f"capability 8.9+: Ada, Hopper); this one is {major}.{minor}: use kv_cache_dtype=auto"
        )
    return torch.float8_e4m3fn


def resolve_max_model_len(config: EngineConfig, arch: ModelArch) -> int:
    if config.model.max_model_len and config.model.max_model_len > arch.max_position_embeddings:
        raise ValueError(
            f"max_model_len {config.model.max_model_len} exceeds the model's context length "
            f"{arch.max_position_embeddings}"
        )
    return min(config.model.max_model_len or arch.max_position_embeddings, arch.max_position_embeddings)


def build_shard(
    config: EngineConfig, checkpoint: Checkpoint, arch: ModelArch,
    group: TensorParallelGroup | None = None,
) -> Shard:
    """Load this rank's weights (only its slices, where the checkpoint can be read in part),
    quantize that shard and pack it for the CPU, size the KV cache (the smallest count over the
    ranks) and build the runner."""
    device = group.device if group is not None else resolve_device(config)
    in_use_at_start = device_bytes_in_use(device) if device.type == "cuda" else 0
    dtype = resolve_dtype(config, device)
    kv_dtype = resolve_kv_cache_dtype(config, device, dtype)
    tp = group.tp if group is not None else SINGLE
    max_model_len = resolve_max_model_len(config, arch)
    quant = resolve_quant_config(config.model, checkpoint.hf_config, device)
    weights = checkpoint.weights
    if group is not None and checkpoint.weight_slices is not None:
        weights = checkpoint.weight_slices
    default_dtype = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = build_model(arch, max_model_len, tp, quant)
        model.load_weights(drop_zero_points(weights()) if quant else weights())  # type: ignore[operator]
        if quant is not None:  # on this rank's shard (row-parallel layers agree on their scales)
            quantize_model(model, quant, checkpoint.tokenizer)
    finally:
        torch.set_default_dtype(default_dtype)
    model.eval()
    if device.type == "cpu":
        keep_step_buffers_in_heap()
        model.pack_cpu_weights()  # type: ignore[operator]
    if group is not None:
        group.barrier()  # loading takes as long as it takes; the data group's timeout starts now
    per_block = kv_bytes_per_block(arch, config.cache.block_size, kv_dtype, tp)
    num_kv_heads = tp.kv_heads(arch.num_key_value_heads)[0]
    num_blocks = _num_blocks(config, arch, kv_dtype, device, model, max_model_len, per_block, num_kv_heads,
                             in_use_at_start)
    if group is not None:
        num_blocks = group.agree_min(num_blocks)
    channel = None
    if group is not None:
        from tessel.engine.distributed.step_channel import StepChannel

        channel = StepChannel(group)
    runner = ModelRunner(
        model, arch, num_blocks, config.cache.block_size, device, dtype, config.model.seed,
        _runner_limits(config, max_model_len, device), tp=tp, channel=channel, kv_dtype=kv_dtype,
    )
    runner.pipeline.capture_graphs()
    runner.pipeline.warm_up_sampling(dtype)
    return Shard(model, runner, num_blocks, per_block, max_model_len, device, dtype, quant)


def _runner_limits(config: EngineConfig, max_model_len: int, device: torch.device) -> RunnerLimits:
    graphs: tuple[int, ...] = ()
    if device.type == "cuda" and not config.enforce_eager:
        sizes = config.cuda_graph_batch_sizes or default_graph_sizes(config.scheduler.max_num_seqs)
        graphs = tuple(sorted(s for s in sizes if s <= config.scheduler.max_num_seqs)) or (1,)
    return RunnerLimits(
        max_tokens=config.scheduler.max_num_batched_tokens,
        max_seqs=config.scheduler.max_num_seqs,
        max_model_len=max_model_len,
        decode=DecodeConfig(mode=config.decode_split),
        graph_sizes=graphs,
    )


def _num_blocks(
    config: EngineConfig, arch: ModelArch, kv_dtype: torch.dtype, device: torch.device,
    model: nn.Module, max_model_len: int, per_block: int, num_kv_heads: int, in_use_at_start: int,
) -> int:
    """On CUDA: what fits after weights and profiled activations; on the CPU:
    ``kv_cache_memory_gb`` per rank."""
    if config.cache.num_blocks is not None:
        return config.cache.num_blocks
    if device.type == "cuda":
        sched = config.scheduler
        activations = peak_activation_bytes(
            model, arch, min(sched.max_num_batched_tokens, max_model_len), sched.max_num_seqs,
            config.cache.block_size, kv_dtype, device, num_kv_heads=num_kv_heads,
        )
        budget = kv_budget_bytes(config.cache.gpu_memory_utilization, in_use_at_start, activations, device)
        log.info("profiled activations %.2f GiB; KV budget %.2f GiB", activations / 2**30, budget / 2**30)
    else:
        budget = int(config.cache.kv_cache_memory_gb * 1024**3)
    num_blocks = int(budget // per_block)
    if num_blocks < 2:
        where = "gpu_memory_utilization" if device.type == "cuda" else "kv_cache_memory_gb"
        raise ValueError(
            f"no memory left for the KV cache ({budget / 2**30:.2f} GiB for blocks of "
            f"{per_block / 2**20:.1f} MiB): raise {where}, or lower max_num_batched_tokens"
        )
    return num_blocks
