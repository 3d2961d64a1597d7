"""Typed settings for every subsystem, composed into one frozen ``EngineConfig``.

Each field's docstring is its help text; the CLI and the ``TESSEL_`` environment
variables are generated from these same fields (see ``server/cli.py``).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

Dtype = Literal["auto", "float32", "bfloat16", "float16"]
LoadFormat = Literal["auto", "gguf", "hf", "dummy"]
Quantization = Literal["int8", "fp8"]
QuantRotation = Literal["residual", "residual_and_down"]
KVCacheDtype = Literal["auto", "fp8", "fp8_e4m3"]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ModelConfig(_Frozen):
    model: str | None = None
    """Path to a GGUF file, a Hugging Face checkpoint directory, or a preset name
    (``config/models/*.json``, used with ``load_format='dummy'``). None: the default model."""
    load_format: LoadFormat = "auto"
    """How to read ``model``: by its shape (auto), GGUF, HF safetensors, or random weights."""
    dtype: Dtype = "auto"
    """Compute dtype; auto is float32 on the CPU and bfloat16 on CUDA."""
    max_model_len: int | None = Field(default=None, ge=1)
    """Longest prompt + output in tokens; defaults to the model's context length."""
    seed: int = 0
    """Seed for random weights and for unseeded sampling."""
    cache_dir: str | None = None
    """Where converted GGUF weights are cached; default ``~/.cache/tessel``."""
    quantization: Quantization | None = None
    """W8A8 for the decoder's linear layers (qkv, o, gate/up, down; embedding, lm_head and norms
    stay in the model dtype): int8 = symmetric int8 weights per output channel, int8 activations
    per token; fp8 = the same with E4M3 (CUDA, compute capability >= 8.9). None: as the
    checkpoint's quantization_config says (compressed-tensors W8A8), else unquantized."""
    smoothquant_alpha: float | None = Field(default=None, ge=0, le=1)
    """SmoothQuant strength for load-time quantization: each input channel of a linear layer is
    divided by max|x|^alpha / max|w|^(1-alpha) (folded into the norm or up projection before
    it) and its weight column multiplied by the same. None: no smoothing."""
    smoothquant_calibration: str | None = None
    """Text file of calibration prompts, one per line, for SmoothQuant and GPTQ; None: the
    built-in prompts."""
    quant_rotation: QuantRotation | None = None
    """Rotation (QuaRot) before load-time quantization, exact without it: residual = the residual
    stream turned by a seeded random-sign Hadamard matrix, folded into the weights (free at run
    time; a tied LM head gets its own copy); residual_and_down = also down_proj's input, online
    (a Hadamard transform per token and layer). Before SmoothQuant when both are set. One GPU or
    CPU process only (tensor_parallel_size=1). None: no rotation."""
    quant_gptq: bool = False
    """Load-time W8A8 weights rounded by GPTQ (error feedback under the inputs' second moments
    from the calibration prompts) instead of to nearest: same scales, format and kernels; a few
    seconds more at load on small models."""
    quantize_lm_head: bool = False
    """Load-time W8A8 for the LM head too (per-row weights, per-token hidden states), not only
    the decoder's linear layers: half the head's weight bytes a step, for a small accuracy cost.
    The embedding lookup keeps the float weights (a tied head then holds both)."""

    @model_validator(mode="after")
    def _smoothing_needs_quantization(self) -> ModelConfig:
        if self.quantization is None and (
            self.smoothquant_alpha is not None or self.smoothquant_calibration is not None
        ):
            raise ValueError("smoothquant_alpha / smoothquant_calibration need quantization set")
        if self.quantization is None and self.quant_rotation is not None:
            raise ValueError("quant_rotation needs quantization set")
        if self.quantization is None and self.quantize_lm_head:
            raise ValueError("quantize_lm_head needs quantization set")
        if self.quantization is None and self.quant_gptq:
            raise ValueError("quant_gptq needs quantization set")
        if self.smoothquant_calibration is not None and self.smoothquant_alpha is None and not self.quant_gptq:
            raise ValueError("smoothquant_calibration is given but neither smoothquant_alpha nor quant_gptq is")
        return self


class CacheConfig(_Frozen):
    block_size: int = Field(default=16, ge=1, le=256)
    """Tokens per KV-cache block."""
    num_blocks: int | None = Field(default=None, ge=1)
    """KV blocks to allocate; None sizes the cache from ``kv_cache_memory_gb``."""
    kv_cache_memory_gb: float = Field(default=2.0, gt=0)
    """Memory given to the KV cache when ``num_blocks`` is not set (CPU)."""
    gpu_memory_utilization: float = Field(default=0.9, gt=0, le=1)
    """Fraction of GPU memory the engine may use (weights + activations + KV)."""
    enable_prefix_caching: bool = True
    """Reuse the KV of full blocks whose token prefix was computed before."""
    kv_cache_dtype: KVCacheDtype = "auto"
    """How the KV cache stores K and V: auto = the model dtype; fp8 (= fp8_e4m3) = E4M3 with a
    scale of 1.0, as vLLM without calibrated scales: half the bytes of bf16, so twice the blocks
    and half the KV read per decode step; attention still computes in the model dtype. CUDA needs
    compute capability 8.9+ (Ada, Hopper)."""


class SchedulerConfig(_Frozen):
    max_num_seqs: int = Field(default=256, ge=1)
    """Most requests running in one step."""
    max_num_batched_tokens: int = Field(default=2048, ge=1)
    """Token budget of one step; longer prompts are prefilled in chunks."""
    enable_chunked_prefill: bool = True
    """Split long prompts over several steps, mixed with decodes."""


class EngineConfig(_Frozen):
    model: ModelConfig = ModelConfig()
    cache: CacheConfig = CacheConfig()
    scheduler: SchedulerConfig = SchedulerConfig()
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where the model runs; auto picks CUDA when available."""
    enforce_eager: bool = False
    """Run every step eagerly: no CUDA graphs for decode (CUDA only; the CPU is always eager)."""
    cuda_graph_batch_sizes: list[int] | None = None
    """Decode batch sizes captured as CUDA graphs (a batch is padded to the next one; larger
    batches run eagerly). None: 1, 2, 4, 8, then every 8 up to min(max_num_seqs, 256)."""
    overlap_scheduling: bool = True
    """Schedule and prepare step N+1 while step N computes; its decode inputs take N's sampled
    ids on the device. A stopped request wastes at most one step. Off: one step at a time."""
    decode_split: Literal["balanced", "static", "none"] = "balanced"
    """How decode attention splits the KV: balanced tiles, FlashDecoding's static splits, or none."""
    tensor_parallel_size: int = Field(default=1, ge=1)
    """Processes (one per GPU) the model is split across, Megatron-style; rank 0 schedules, samples
    and serves. Above 1, the other ranks are spawned on this host, or, under torchrun, are the
    processes that RANK, WORLD_SIZE and MASTER_ADDR describe (see deploy/tensor-parallel.md)."""
    distributed_timeout_s: float = Field(default=120.0, gt=0)
    """Tensor parallel: how long a collective of a step waits for a peer before the group is
    declared failed (a hung worker). Loading and waiting for the next step have no deadline."""

    @model_validator(mode="after")
    def _budget_fits_a_block(self) -> EngineConfig:
        if (
            not self.scheduler.enable_chunked_prefill
            and self.model.max_model_len is not None
            and self.scheduler.max_num_batched_tokens < self.model.max_model_len
        ):
            raise ValueError(
                "scheduler.max_num_batched_tokens must be >= model.max_model_len "
                "when chunked prefill is off"
            )
        sizes = self.cuda_graph_batch_sizes
        if sizes is not None and (not sizes or min(sizes) < 1):
            raise ValueError("cuda_graph_batch_sizes must be a non-empty list of sizes >= 1")
        if self.model.quant_gptq and self.tensor_parallel_size > 1:
            # a row-parallel shard sees a slice of each input row: its error feedback would stop
            # at the slice's edge, and the shards' scales would need agreeing; not worth it yet
            raise ValueError("model.quant_gptq needs tensor_parallel_size=1")
        if self.model.quant_rotation is not None and self.tensor_parallel_size > 1:
            # each rank holds a vocabulary slice of the embedding and a slice of the MLP width:
            # folding the rotation would need the whole matrices gathered, for a load-time gain
            raise ValueError("model.quant_rotation needs tensor_parallel_size=1")
        return self
