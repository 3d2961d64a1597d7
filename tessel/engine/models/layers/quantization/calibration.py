"""SmoothQuant's calibration data, and running one prompt through a model outside the engine.

The built-in prompts are short and varied (prose, dialogue, code, numbers, lists, other
languages) so every channel that lights up in serving lights up here too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from tessel.kernels.attention.metadata import AttentionMetadata

CALIBRATION_PROMPTS = (
    "The history of the printing press begins in the fifteenth century, when Johannes Gutenberg "
    "combined movable metal type, oil-based ink and a wooden screw press into one system.",
    "User: Can you explain why the sky is blue?\nAssistant: Sunlight is scattered by the molecules "
    "of the air, and shorter blue wavelengths are scattered much more strongly than red ones.",
    "def merge_sorted(a: list[int], b: list[int]) -> list[int]:\n    out, i, j = [], 0, 0\n"
    "    while i < len(a) and j < len(b):\n        if a[i] <= b[j]:\n            out.append(a[i]); i += 1\n"
    "        else:\n            out.append(b[j]); j += 1\n    return out + a[i:] + b[j:]",
    "Quarterly revenue rose 12.4% to $3,218 million; operating margin was 21.7%, up from 19.2%. "
    "Table: 2021 | 2022 | 2023 -> 1,204 | 1,377 | 1,562.",
    "Ingredients: 200 g flour, 3 eggs, 250 ml milk, a pinch of salt. Whisk the eggs, add the milk, "
    "then fold in the flour until smooth. Rest for 30 minutes before cooking.",
    "La Révolution française a profondément transformé la société. Die Wissenschaft ist ein "
    "gemeinsames Werk vieler Generationen. El agua es esencial para la vida en la Tierra.",
    "Solve for x: 3x + 7 = 22. Subtract 7 from both sides to get 3x = 15, then divide by 3: x = 5. "
    "Check: 3 * 5 + 7 = 22.",
    "<html><body><h1>Welcome</h1><p>Click <a href=\"/start\">here</a> to begin.</p></body></html> "
    "SELECT name, COUNT(*) FROM orders GROUP BY name HAVING COUNT(*) > 10;",
    "Once upon a time, in a kingdom by the sea, there lived a lighthouse keeper who kept a journal "
    "of every ship that passed, every storm, and every letter that never arrived.",
    "1. Preheat the oven. 2. Grease the pan. 3. Mix dry ingredients. 4. Add wet ingredients. "
    "5. Bake for 25 minutes. 6. Let it cool completely before slicing.",
)


def calibration_prompts(path: str | None) -> list[str]:
    """Non-empty lines of ``path``, or the built-in prompts."""
    if path is None:
        return list(CALIBRATION_PROMPTS)
    lines = [line.strip() for line in Path(path).read_text().splitlines() if line.strip()]
    if not lines:
        raise ValueError(f"smoothquant_calibration: {path} has no prompts")
    return lines


@torch.inference_mode()
def prefill_hidden(model: nn.Module, token_ids: list[int], block_size: int = 16) -> torch.Tensor:
    """Final hidden states [T, hidden] of one prompt, through a scratch paged KV cache."""
    arch: Any = model.arch  # type: ignore[attr-defined]
    tp: Any = model.tp  # type: ignore[attr-defined]
    kv_heads = tp.kv_heads(arch.num_key_value_heads)[0]  # this rank's, under tensor parallelism
    ref = model.get_parameter("model.embed_tokens.weight")
    device, dtype, n = ref.device, ref.dtype, len(token_ids)
    blocks = -(-n // block_size)
    shape = (blocks, block_size, kv_heads, arch.head_dim)
    caches = [(torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
              for _ in range(arch.num_hidden_layers)]
    md = AttentionMetadata.single_prefill(n, block_size, device)
    ids = torch.tensor(token_ids, device=device)
    out: torch.Tensor = model(ids, torch.arange(n, device=device), caches, md)
    return out
