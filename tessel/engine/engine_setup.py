"""Build an engine's parts from its config: checkpoint -> model -> KV cache -> scheduler.

Above one rank, rank 0 (this process) starts the tensor-parallel group first (spawning the
workers, or joining torchrun's), then builds its own shard exactly as each worker does."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from transformers import PreTrainedTokenizerFast

from tessel.config.model_arch import ModelArch
from tessel.config.settings import EngineConfig
from tessel.engine.gc_freeze import release_frozen_heap
from tessel.engine.kv_cache.manager import KVCacheManager
from tessel.engine.loader import load_checkpoint
from tessel.engine.models.layers.parallel import check_tensor_parallel
from tessel.engine.models.layers.quantization import QuantConfig, resolve_quant_config
from tessel.engine.output_processor import OutputProcessor
from tessel.engine.runner.model_runner import ModelRunner
from tessel.engine.scheduler.scheduler import Scheduler
from tessel.engine.shard_setup import build_shard, resolve_device

if TYPE_CHECKING:
    from tessel.engine.distributed.leader import TensorParallelLeader

log = logging.getLogger("tessel.engine")


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
    overlap_scheduling: bool = False  # EngineCore launches step N+1 before reading step N
    parallel: TensorParallelLeader | None = None  # rank 0's hold on the workers; None at one rank
    tensor_parallel_size: int = 1
    kv_cache_bytes: int = 0  # the KV cache's memory summed over every rank


def build_engine_parts(config: EngineConfig) -> EngineParts:
    release_frozen_heap()
    start = time.perf_counter()
    checkpoint = load_checkpoint(config.model)  # before any worker: a cold GGUF converts once
    arch = ModelArch.from_hf(checkpoint.hf_config)
    size = config.tensor_parallel_size
    check_tensor_parallel(arch, size)
    leader = None
    if size > 1:
        from tessel.engine.distributed.leader import TensorParallelLeader

        resolve_quant_config(config.model, checkpoint.hf_config, resolve_device(config))  # refused before any spawn
        leader = TensorParallelLeader.start(config)
    try:
        shard = build_shard(config, checkpoint, arch, leader.group if leader else None)
    except BaseException:
        if leader is not None:
            leader.shutdown()
        raise
    num_blocks = shard.num_blocks
    kv = KVCacheManager(num_blocks, config.cache.block_size, config.cache.enable_prefix_caching)
    scheduler = Scheduler(config.scheduler, kv, shard.max_model_len)
    tokenizer = checkpoint.tokenizer
    if tokenizer is None and checkpoint.source.startswith("preset "):
        tokenizer = placeholder_tokenizer(arch.vocab_size, next(iter(arch.eos_token_ids), None))
    if tokenizer is None:
        raise ValueError(f"{checkpoint.source} has no tokenizer")
    eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else next(iter(arch.eos_token_ids), None)
    log.info(
        "loaded %s (%s, %s%s on %s%s) in %.1f s; %d KV blocks of %d tokens%s",
        checkpoint.served_name, arch.architecture, str(shard.dtype).removeprefix("torch."), _quant_note(shard.quant),
        shard.device, f", tensor parallel x{size}" if size > 1 else "", time.perf_counter() - start, num_blocks,
        config.cache.block_size, " in fp8 (E4M3)" if shard.runner.kv_caches[0][0].dtype == torch.float8_e4m3fn else "",
    )
    return EngineParts(
        arch=arch,
        tokenizer=tokenizer,
        served_name=checkpoint.served_name,
        runner=shard.runner,
        scheduler=scheduler,
        output_processor=OutputProcessor(tokenizer),
        max_model_len=shard.max_model_len,
        vocab_size=arch.vocab_size,
        eos_token_id=eos,
        device=shard.device,
        overlap_scheduling=config.overlap_scheduling,
        parallel=leader,
        tensor_parallel_size=size,
        kv_cache_bytes=num_blocks * shard.kv_bytes_per_block * size,
    )


def _quant_note(quant: QuantConfig | None) -> str:
    if quant is None:
        return ""
    return f", W8A8 {quant.scheme}" + (" from the checkpoint" if quant.from_checkpoint else "")


def placeholder_tokenizer(vocab_size: int, eos_token_id: int | None) -> PreTrainedTokenizerFast:
    """For random-weight presets, which ship no tokenizer: token ``i`` reads ``<i>``."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"<{i}>": i for i in range(vocab_size)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<0>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    eos = f"<{eos_token_id}>" if eos_token_id is not None and eos_token_id < vocab_size else None
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=eos, unk_token="<0>")
