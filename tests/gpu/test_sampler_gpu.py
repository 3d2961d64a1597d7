"""The sampler on CUDA: greedy and temperature rows take the one-pass Triton path, and keep the
contracts the torch path keeps on the CPU (tests/engine/test_sampler.py)."""

from __future__ import annotations

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

from tessel.engine.request import Request  # noqa: E402
from tessel.engine.sampler import Sampler  # noqa: E402
from tessel.engine.sampling_metadata import SamplingMetadata  # noqa: E402
from tessel.engine.sampling_params import SamplingParams  # noqa: E402

V = 32000


def req(rid: str, **params: object) -> Request:
    return Request(request_id=rid, prompt_token_ids=[0], params=SamplingParams(max_tokens=100, **params), max_tokens=100)


def sample(sampler: Sampler, logits: torch.Tensor, rows: list[Request]) -> list[int]:
    meta = SamplingMetadata.build(rows, logits.shape[1], "cuda")
    return sampler.sample(logits.clone(), meta).token_ids


def test_greedy_bf16_logits_equal_argmax() -> None:
    logits = torch.randn(64, V, device="cuda").bfloat16()
    got = sample(Sampler(), logits, [req(str(i), temperature=0.0) for i in range(64)])
    assert got == logits.float().argmax(-1).tolist()


def test_seeded_row_ignores_batch_composition() -> None:
    """A seeded request's tokens depend on its seed and step only (fused path)."""
    gen = torch.Generator(device="cuda").manual_seed(3)
    steps = [torch.randn(V, device="cuda", generator=gen) for _ in range(6)]

    def run(layout: list[str], engine_seed: int) -> list[int]:
        sampler, picked = Sampler(engine_seed), []
        rows = [req(rid, temperature=1.0, seed=99) if rid == "s" else req(rid, temperature=1.0) for rid in layout]
        for logits in steps:
            batch = torch.stack([logits if rid == "s" else torch.randn(V, device="cuda") for rid in layout])
            picked.append(sample(sampler, batch, rows)[layout.index("s")])
            for r in rows:
                r.output_token_ids.append(0)
        return picked

    alone = run(["s"], 0)
    assert run(["a", "s", "b"], 1) == alone
    assert len(set(alone)) > 1  # the draws move with the step


def test_fused_and_torch_paths_agree_in_distribution(monkeypatch: pytest.MonkeyPatch) -> None:
    base = torch.randn(16, device="cuda")
    rows = [req(str(i), temperature=0.8) for i in range(4096)]
    fused = torch.tensor(sample(Sampler(1), base.expand(4096, -1), rows))
    monkeypatch.setenv("TESSEL_FUSED_SAMPLING", "0")
    plain = torch.tensor(sample(Sampler(1), base.expand(4096, -1), rows))
    f1, f2 = (torch.bincount(t, minlength=16).double() / 4096 for t in (fused, plain))
    assert (f1 - f2).abs().max() < 0.04
