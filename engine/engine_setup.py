"""Build an engine's parts from its config: checkpoint -> model -> KV cache -> scheduler."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch
from transformers import PreTrainedTokenizerFast

from config.model_arch import ModelArch
from config.settings import EngineConfig
from engine.kv_cache.manager import KVCacheManager
from engine.loader import load_checkpoint
from engine.models.registry import build_model
from engine.output_processor import OutputProcessor
from engine.runner.model_runner import ModelRunner, kv_bytes_per_block
from engine.scheduler.scheduler import Scheduler

log = logging.getLogger("tessel.engine")

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class EngineParts:
    """Everything ``EngineCore`` drives, already wired together."""

    arch: ModelArch
    tokenizer: PreTrainedTokenizerFast
    served_name: str
    runner: ModelRunner
    scheduler: Scheduler
    output_processor: OutputProcessor
    max_model_len: int
    vocab_size: int
    eos_token_id: int | None
    device: torch.device


def resolve_device(config: EngineConfig) -> torch.device:
    if config.device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(config.device)


def resolve_dtype(config: EngineConfig, device: torch.device) -> torch.dtype:
    if config.model.dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return _DTYPES[config.model.dtype]


def build_engine_parts(config: EngineConfig) -> EngineParts:
    start = time.perf_counter()
    checkpoint = load_checkpoint(config.model)
    arch = ModelArch.from_hf(checkpoint.hf_config)
    device = resolve_device(config)
    dtype = resolve_dtype(config, device)
    max_model_len = min(config.model.max_model_len or arch.max_position_embeddings, arch.max_position_embeddings)
    if config.model.max_model_len and config.model.max_model_len > arch.max_position_embeddings:
        raise ValueError(
            f"max_model_len {config.model.max_model_len} exceeds the model's context length "
            f"{arch.max_position_embeddings}"
        )
    default_dtype = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = build_model(arch, max_model_len)
        model.load_weights(checkpoint.weights())
    finally:
        torch.set_default_dtype(default_dtype)
    model.eval()
    num_blocks = _num_blocks(config, arch, dtype, device)
    runner = ModelRunner(model, arch, num_blocks, config.cache.block_size, device, dtype, config.model.seed)
    kv = KVCacheManager(num_blocks, config.cache.block_size, config.cache.enable_prefix_caching)
    scheduler = Scheduler(config.scheduler, kv, max_model_len)
    tokenizer = checkpoint.tokenizer
    if tokenizer is None:
        raise ValueError(f"{checkpoint.source} has no tokenizer")
    eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else next(iter(arch.eos_token_ids), None)
    log.info(
        "loaded %s (%s, %s on %s) in %.1f s; %d KV blocks of %d tokens",
        checkpoint.served_name, arch.architecture, str(dtype).removeprefix("torch."), device,
        time.perf_counter() - start, num_blocks, config.cache.block_size,
    )
    return EngineParts(
        arch=arch,
        tokenizer=tokenizer,
        served_name=checkpoint.served_name,
        runner=runner,
        scheduler=scheduler,
        output_processor=OutputProcessor(tokenizer),
        max_model_len=max_model_len,
        vocab_size=arch.vocab_size,
        eos_token_id=eos,
        device=device,
    )


def _num_blocks(config: EngineConfig, arch: ModelArch, dtype: torch.dtype, device: torch.device) -> int:
    if config.cache.num_blocks is not None:
        return config.cache.num_blocks
    per_block = kv_bytes_per_block(arch, config.cache.block_size, dtype)
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        budget = free - (1 - config.cache.gpu_memory_utilization) * total
    else:
        budget = config.cache.kv_cache_memory_gb * 1024**3
    return max(int(budget // per_block), 1)
