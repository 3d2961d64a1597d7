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
from engine.models.layers.quantization import QuantConfig, quantize_model, resolve_quant_config
from engine.models.layers.quantization.compressed_tensors import drop_zero_points
from engine.models.registry import build_model
from engine.output_processor import OutputProcessor
from engine.runner.cuda_graph import default_graph_sizes
from engine.runner.host_allocator import keep_step_buffers_in_heap
from engine.runner.memory_profile import device_bytes_in_use, kv_budget_bytes, peak_activation_bytes
from engine.runner.model_runner import ModelRunner, RunnerLimits, kv_bytes_per_block
from engine.scheduler.scheduler import Scheduler
from kernels.attention.decode_plan import DecodeConfig

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
    overlap_scheduling: bool = False  # EngineCore launches step N+1 before reading step N


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
    in_use_at_start = device_bytes_in_use(device) if device.type == "cuda" else 0
    dtype = resolve_dtype(config, device)
    max_model_len = min(config.model.max_model_len or arch.max_position_embeddings, arch.max_position_embeddings)
    if config.model.max_model_len and config.model.max_model_len > arch.max_position_embeddings:
        raise ValueError(
            f"max_model_len {config.model.max_model_len} exceeds the model's context length "
            f"{arch.max_position_embeddings}"
        )
    quant = resolve_quant_config(config.model, checkpoint.hf_config, device)
    default_dtype = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = build_model(arch, max_model_len, quant=quant)
        model.load_weights(drop_zero_points(checkpoint.weights()) if quant else checkpoint.weights())
        if quant is not None:
            quantize_model(model, quant, checkpoint.tokenizer)
    finally:
        torch.set_default_dtype(default_dtype)
    model.eval()
    if device.type == "cpu":
        keep_step_buffers_in_heap()
        model.pack_cpu_weights()
    num_blocks = _num_blocks(config, arch, dtype, device, model, max_model_len, in_use_at_start)
    runner = ModelRunner(
        model, arch, num_blocks, config.cache.block_size, device, dtype, config.model.seed,
        _runner_limits(config, max_model_len, device),
    )
    runner.pipeline.capture_graphs()
    kv = KVCacheManager(num_blocks, config.cache.block_size, config.cache.enable_prefix_caching)
    scheduler = Scheduler(config.scheduler, kv, max_model_len)
    tokenizer = checkpoint.tokenizer
    if tokenizer is None and checkpoint.source.startswith("preset "):
        tokenizer = placeholder_tokenizer(arch.vocab_size, next(iter(arch.eos_token_ids), None))
    if tokenizer is None:
        raise ValueError(f"{checkpoint.source} has no tokenizer")
    eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else next(iter(arch.eos_token_ids), None)
    log.info(
        "loaded %s (%s, %s%s on %s) in %.1f s; %d KV blocks of %d tokens",
        checkpoint.served_name, arch.architecture, str(dtype).removeprefix("torch."), _quant_note(quant),
        device, time.perf_counter() - start, num_blocks, config.cache.block_size,
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
        overlap_scheduling=config.overlap_scheduling,
    )


def _quant_note(quant: QuantConfig | None) -> str:
    if quant is None:
        return ""
    return f", W8A8 {quant.scheme}" + (" from the checkpoint" if quant.from_checkpoint else "")


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
    config: EngineConfig, arch: ModelArch, dtype: torch.dtype, device: torch.device,
    model: torch.nn.Module, max_model_len: int, in_use_at_start: int,
) -> int:
    if config.cache.num_blocks is not None:
        return config.cache.num_blocks
    per_block = kv_bytes_per_block(arch, config.cache.block_size, dtype)
    if device.type == "cuda":
        sched = config.scheduler
        activations = peak_activation_bytes(
            model, arch, min(sched.max_num_batched_tokens, max_model_len), sched.max_num_seqs,
            config.cache.block_size, dtype, device,
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


def placeholder_tokenizer(vocab_size: int, eos_token_id: int | None) -> PreTrainedTokenizerFast:
    """For random-weight presets, which ship no tokenizer: token ``i`` reads ``<i>``."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"<{i}>": i for i in range(vocab_size)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<0>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    eos = f"<{eos_token_id}>" if eos_token_id is not None and eos_token_id < vocab_size else None
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=eos, unk_token="<0>")
