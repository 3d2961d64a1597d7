"""Which layers' int8 weights round worse after rotation (issue 7's accuracy, CPU).

For every W8A8 layer of the default model: the relative output error of its weight rounded to
nearest per output channel, ``tr(D H D^T) / tr(W H W^T)`` with ``D = W - Q(W)`` and ``H = X^T X``
its inputs' second moments (the calibration prompts plus the first 800 tokens of Ruth), before
and after the rotation (residual folded and turned, down_proj's input turned), as shipped.

    PYTHONPATH=. python3 benchmarks/quant_layer_error.py [--out FILE]
"""

from __future__ import annotations

import argparse
from collections import defaultdict

import torch
from torch import nn

from benchmarks.quant_accuracy import TEXTS
from benchmarks.report import emit
from tessel.engine import LLM
from tessel.engine.models.layers.linear import ColumnParallelLinear, RowParallelLinear
from tessel.engine.models.layers.quantization import gptq, rotation
from tessel.engine.models.layers.quantization.calibration import calibration_prompts
from tessel.kernels.quant import reference as quant_reference

KINDS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")


def relative_errors(model: nn.Module, prompts: list[list[int]]) -> dict[str, float]:
    layers = {n: m for n, m in model.named_modules() if isinstance(m, ColumnParallelLinear | RowParallelLinear)}
    hessians = gptq.input_hessians(model, layers, prompts)
    errors = {}
    for name, module in layers.items():
        w = module.get_parameter("weight").data.double()
        q = quant_reference.quantize_rows(w.float(), torch.int8)
        d, h = w - q.data.double() * q.scale.double(), hessians[name].double()
        errors[name] = float(torch.trace(d @ h @ d.T) / torch.trace(w @ h @ w.T))
    return errors


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    llm = LLM(None, num_blocks=64, block_size=16)
    model = llm.core.runner.model
    prompts = [llm.tokenizer.encode(p) for p in calibration_prompts(None)]
    prompts.append(llm.tokenizer.encode(TEXTS["Ruth + Jonah"].read_text())[:800])
    plain = relative_errors(model, prompts)
    rotation.rotate_residual(model)
    rotation.rotate_down_input(model)
    turned = relative_errors(model, prompts)

    def name(i: int, kind: str) -> str:
        return next(n for n in plain if n.startswith(f"model.layers.{i}.") and n.endswith(kind))

    sums: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    rows = []
    for i in range(len(model.model.layers)):  # type: ignore[arg-type]
        cells = []
        for kind in KINDS:
            a, b = plain[name(i, kind)], turned[name(i, kind)]
            sums[kind][0] += a
            sums[kind][1] += b
            cells.append(f"{a:.1e} -> {b:.1e} ({b / a:.1f}x)")
        rows.append(f"| {i} | " + " | ".join(cells) + " |")
    lines = ["Relative output error of int8 weights rounded to nearest, plain -> rotated:", "",
             "| kind | sum over layers, plain | rotated | rotated / plain |", "|---|---:|---:|---:|"]
    lines += [f"| {k} | {a:.2e} | {b:.2e} | {b / a:.2f}x |" for k, (a, b) in sums.items()]
    lines += ["", "| layer | " + " | ".join(KINDS) + " |", "|---:|" + "---:|" * len(KINDS), *rows]
    emit(lines, args.out)


if __name__ == "__main__":
    main()
