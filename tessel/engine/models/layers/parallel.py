"""Tensor-parallel placement: which rank this process is, and which slice of each sharded
dimension (heads, columns, vocabulary rows) it owns. Plain numbers; the collectives that join
the slices live in ``collectives.py``."""

from __future__ import annotations

from dataclasses import dataclass

from tessel.config.model_arch import ModelArch


@dataclass(frozen=True)
class ParallelRank:
    rank: int = 0
    size: int = 1

    def shard(self, total: int, what: str) -> int:
        """This rank's share of ``total`` items (heads, columns, vocab rows)."""
        if total % self.size:
            raise ValueError(f"{what}={total} is not divisible by tensor_parallel_size={self.size}")
        return total // self.size

    def kv_heads(self, total: int) -> tuple[int, int]:
        """(KV heads on this rank, index of the first): split when ``total`` divides by the
        size, else one head per rank, each head replicated on ``size // total`` ranks."""
        if total % self.size == 0:
            local = total // self.size
            return local, self.rank * local
        if self.size % total:
            raise ValueError(
                f"num_key_value_heads={total} neither divides nor is divisible by "
                f"tensor_parallel_size={self.size}"
            )
        return 1, self.rank * total // self.size

    def vocab_rows(self, vocab_size: int) -> tuple[int, int]:
        """(rows per rank, first row of this rank): ceil(vocab / size) rows each, the last
        rank's tail padded with zero rows, so any vocabulary splits."""
        local = -(-vocab_size // self.size)
        return local, self.rank * local


SINGLE = ParallelRank()


def tensor_parallel_sizes(arch: ModelArch, up_to: int = 64) -> list[int]:
    """The sizes ``arch`` can be split into: query heads and the MLP width (and each expert's,
    0 for a dense model) divide by the size, and the KV heads either divide by it or divide it
    (then they are replicated)."""
    q, kv, inter = arch.num_attention_heads, arch.num_key_value_heads, arch.intermediate_size
    moe = arch.moe_intermediate_size
    return [
        n for n in range(1, up_to + 1)
        if q % n == 0 and inter % n == 0 and moe % n == 0 and (kv % n == 0 or n % kv == 0)
    ]


def check_tensor_parallel(arch: ModelArch, size: int) -> None:
    """A ``ValueError`` naming the sizes that work when ``size`` does not fit ``arch``."""
    if size == 1:
        return
    allowed = tensor_parallel_sizes(arch, up_to=max(64, size))
    if size in allowed:
        return
    q, kv, inter = arch.num_attention_heads, arch.num_key_value_heads, arch.intermediate_size
    if q % size:
        why = f"num_attention_heads={q} is not divisible by {size}"
    elif inter % size:
        why = f"intermediate_size={inter} is not divisible by {size}"
    elif arch.moe_intermediate_size % size:
        why = f"moe_intermediate_size={arch.moe_intermediate_size} is not divisible by {size}"
    else:
        why = f"num_key_value_heads={kv} neither divides nor is divisible by {size}"
    raise ValueError(
        f"tensor_parallel_size={size} does not fit this model: {why}; "
        f"allowed sizes: {', '.join(map(str, allowed))}"
    )
