"""kernels/gemv.py: decode-sized linear layers on our GEMM kernel, against ``F.linear``
(Triton's interpreter on the CPU, the real kernel on CUDA with ``-m gpu``)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tessel.kernels import gemv


def _operands(m: int, n: int, k: int, device: str, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(m * 1000 + n + k)
    x = torch.randn(m, k, generator=g)
    w = torch.randn(n, k, generator=g) / k**0.5
    return x.to(device=device, dtype=dtype), w.to(device=device, dtype=dtype)


def _assert_close(got: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> None:
    want = F.linear(x.float(), w.float())  # fp32 sums: ours and cuBLAS's differ only in order and rounding
    tol = dict(rtol=1e-5, atol=1e-4) if x.dtype == torch.float32 else dict(rtol=2**-7, atol=2e-2)
    torch.testing.assert_close(got.float(), want, **tol)  # type: ignore[arg-type]


# (m, n, k, (BLOCK_N, BLOCK_K, warps, stages, SPLIT_K)): ragged N and K, M from 1 to the tile's
# 16, K cut into 1-3 ranges (3 ranges of 7 K-steps: uneven), a last range left empty
CASES = [(1, 48, 64, (32, 32, 4, 2, 1)), (5, 100, 200, (32, 64, 4, 2, 2)), (16, 72, 224, (64, 32, 4, 2, 3)),
         (3, 40, 96, (32, 32, 4, 2, 4))]


@pytest.mark.parametrize("case", CASES)
def test_gemv_matches_linear(device: str, case: tuple[int, int, int, tuple[int, ...]]) -> None:
    m, n, k, tile = case
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    x, w = _operands(m, n, k, device, dtype)
    for _ in range(2):  # the split's arrival counts reset for the next launch
        got = gemv.linear(x, w, gemv.tile_config(*tile))
        assert got.shape == (m, n) and got.dtype == dtype
        _assert_close(got, x, w)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_pinned_tiles_match_cublas_and_only_decode_sized_opted_in_calls_take_them(monkeypatch: pytest.MonkeyPatch) -> None:
    name = torch.cuda.get_device_name()
    shapes = gemv._PINNED.get(name) or {(4096, 4096): (64, 128, 4, 6, 2)}
    monkeypatch.setitem(gemv._PINNED, name, shapes)
    monkeypatch.setenv("TESSEL_GEMV", "1")
    for (n, k) in shapes:
        for m in (1, 2, 16):
            x, w = _operands(m, n, k, "cuda", torch.bfloat16)
            config = gemv.config_for(x, w, None)
            assert config is not None
            _assert_close(gemv.linear(x, w, config), x, w)
    x, w = _operands(17, *next(iter(shapes)), "cuda", torch.bfloat16)
    assert gemv.config_for(x, w, None) is None  # past the tile: cuBLAS
    assert gemv.config_for(x[:1], w, torch.zeros(w.shape[0], device="cuda", dtype=w.dtype)) is None
    assert gemv.config_for(x[:1].float(), w.float(), None) is None
    assert gemv.config_for(x[:1], w[:, :-8], None) is None  # a shape without a tile
    monkeypatch.setenv("TESSEL_GEMV", "0")
    assert gemv.config_for(x[:1], w, None) is None
