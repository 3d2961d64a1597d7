"""W8A8 kernels against kernels/quant/reference.py: Triton's interpreter on the CPU, real
kernels on CUDA (``-m gpu``). Ragged sizes (not multiples of any tile), zero rows, outliers."""

from __future__ import annotations

import pytest
import torch

from tessel.kernels.quant import act_quant, gemm, gemm_configs
from tessel.kernels.quant import reference as ref
from tessel.kernels.quant.types import FP8_DTYPE, QuantizedTensor
from tests.kernels.conftest import INTERPRETED

SHAPES = [(1, 48, 64), (5, 100, 200), (33, 72, 1100)]  # (M, N, K)


def _act_dtype(device: str) -> torch.dtype:
    return torch.bfloat16 if device == "cuda" else torch.float32


def _rows(m: int, k: int, device: str, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """Normal rows with one outlier channel, plus an all-zero row."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g)
    x[:, k // 3] *= 40.0
    x[m // 2] = 0.0
    return x.to(device=device, dtype=dtype)


def _int_products(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b.T exactly, in int64 on the CPU."""
    return (a.cpu().long() @ b.cpu().long().T).to(torch.int32)


def _assert_quantized_close(got: QuantizedTensor, want: QuantizedTensor, exact: bool) -> None:
    """Interpreted: bit-equal. CUDA: the scale within an ulp or two (rsqrt.approx in the norm),
    and int8 codes off by at most 1, on at most 1% of elements (rounding ties after that)."""
    assert got.data.dtype == want.data.dtype and got.data.shape == want.data.shape
    if exact:
        assert torch.equal(got.data, want.data) and torch.equal(got.scale, want.scale)
        return
    torch.testing.assert_close(got.scale, want.scale, rtol=2e-2, atol=0)
    diff = (got.data.float() - want.data.float()).abs()
    if got.data.dtype == torch.int8:
        assert diff.max() <= 1 and (diff > 0).float().mean() <= 0.01
    else:
        torch.testing.assert_close(got.data.float(), want.data.float(), rtol=0.13, atol=2e-3)


@pytest.mark.parametrize("shape", SHAPES)
def test_int8_gemm_accumulates_exactly_in_int32(device: str, shape: tuple[int, int, int]) -> None:
    m, n, k = shape
    g = torch.Generator().manual_seed(1)
    a = torch.randint(-127, 128, (m, k), generator=g, dtype=torch.int8)
    b = torch.randint(-128, 128, (n, k), generator=g, dtype=torch.int8)
    a[0], b[0] = 127, -128  # one entry of K * 127 * -128: past 2^24 when K > 1032, so not fp32-exact
    want = _int_products(a, b)
    assert torch.equal(ref.int8_mm(a, b), want)  # the reference's chunked-fp32 path is exact too
    got = gemm.int8_mm(a.to(device), b.to(device))
    assert got.dtype == torch.int32 and torch.equal(got.cpu(), want)


@pytest.mark.parametrize("qdtype", [torch.int8, FP8_DTYPE], ids=["int8", "fp8"])
@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
@pytest.mark.parametrize("shape", SHAPES)
def test_scaled_mm_dequantizes_like_the_reference(
    device: str, qdtype: torch.dtype, bias: bool, shape: tuple[int, int, int]
) -> None:
    m, n, k = shape
    dtype = _act_dtype(device)
    xq = ref.quantize_rows(_rows(m, k, device, dtype), qdtype)
    wq = ref.quantize_rows(torch.randn(n, k, device=device), qdtype)
    b = torch.randn(n, device=device).to(dtype) if bias else None
    got = gemm.scaled_mm(xq.data, xq.scale, wq.data, wq.scale, b, dtype)
    want = ref.scaled_mm(xq.data, xq.scale, wq.data, wq.scale, b, dtype)
    assert got.dtype == dtype
    if dtype == torch.bfloat16:  # same fp32 value (int8) or sum order apart (fp8), then one bf16 rounding
        torch.testing.assert_close(got, want, rtol=2**-7, atol=1e-3)
    else:
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("qdtype", [torch.int8, FP8_DTYPE], ids=["int8", "fp8"])
@pytest.mark.parametrize("k", [64, 200, 5000])
def test_quantize_rows(device: str, qdtype: torch.dtype, k: int) -> None:
    if qdtype == FP8_DTYPE and INTERPRETED:
        pytest.skip("Triton's interpreter converts fp32 -> e4m3 wrongly at binade edges (-127.9 -> -64)")
    x = _rows(7, k, device, _act_dtype(device))
    got = act_quant.quantize_rows(x, qdtype)
    want = ref.quantize_rows(x, qdtype)
    _assert_quantized_close(got, want, exact=INTERPRETED)
    assert torch.equal(got.data[3].float(), torch.zeros(k, device=device))  # the zero row stays zero


@pytest.mark.parametrize("qdtype", [torch.int8, FP8_DTYPE], ids=["int8", "fp8"])
@pytest.mark.parametrize("with_residual", [False, True], ids=["norm", "add-norm"])
def test_rms_norm_quant_matches_norm_then_quant(device: str, qdtype: torch.dtype, with_residual: bool) -> None:
    if qdtype == FP8_DTYPE and INTERPRETED:
        pytest.skip("Triton's interpreter converts fp32 -> e4m3 wrongly at binade edges")
    dtype = _act_dtype(device)
    x, residual = _rows(6, 200, device, dtype), _rows(6, 200, device, dtype, seed=1)
    w = (torch.rand(200) + 0.5).to(device=device, dtype=dtype)
    res = residual if with_residual else None
    got, got_res = act_quant.rms_norm_quant(x, res, w, 1e-6, qdtype)
    want, want_res = ref.rms_norm_quant(x, res, w, 1e-6, qdtype)
    torch.testing.assert_close(got_res, want_res, rtol=0, atol=0)
    _assert_quantized_close(got, want, exact=False)  # rsqrt may differ in its last bit
    assert got.dtype == dtype


def test_silu_and_mul_quant_matches_unfused(device: str) -> None:
    x = _rows(5, 2 * 300, device, _act_dtype(device))
    _assert_quantized_close(act_quant.silu_and_mul_quant(x, torch.int8),
                            ref.silu_and_mul_quant(x, torch.int8), exact=INTERPRETED)


def test_quantization_error_is_within_half_a_step() -> None:
    """The reference itself: |dequant(q(x)) - x| <= scale / 2 for int8, and E4M3's relative step for fp8."""
    x = _rows(9, 333, "cpu", torch.float32)
    q = ref.quantize_rows(x, torch.int8)
    assert ((q.data.float() * q.scale - x).abs() <= q.scale / 2 * (1 + 1e-6)).all()
    assert q.data.abs().max() == 127
    f = ref.quantize_rows(x, FP8_DTYPE)
    err = (f.data.float() * f.scale - x).abs()
    assert (err <= x.abs() * 2**-4 + f.scale * 2**-9).all()  # 3 mantissa bits; subnormals near 0


@pytest.mark.parametrize("split_k", [2, 3, 5])
def test_split_k_is_exact_and_leaves_its_counts_at_zero(device: str, split_k: int) -> None:
    """K cut into ranges summed by the tile's last program: int8 stays bit-exact in int32 (5
    ranges of a 5-step K: one each; 3 of 5: uneven; with K = 200 some ranges are empty), the
    dequantized output matches, and a second launch (the arrival counts reset) does too."""
    m, n, k = 37, 72, 1100
    config = gemm_configs.tile_config(16, 32, 256 if k > 1000 else 64, 4, 2, True, split_k)
    g = torch.Generator().manual_seed(split_k)
    a = torch.randint(-127, 128, (m, k), generator=g, dtype=torch.int8)
    b = torch.randint(-128, 128, (n, k), generator=g, dtype=torch.int8)
    for _ in range(2):
        assert torch.equal(gemm.int8_mm(a.to(device), b.to(device), config=config).cpu(), _int_products(a, b))
    assert all(torch.all(counts == 0) for counts in gemm._arrivals.values())
    dtype = _act_dtype(device)
    for qdtype, kk in ((torch.int8, 200), (FP8_DTYPE, 1100)):
        xq = ref.quantize_rows(_rows(m, kk, device, dtype), qdtype)
        wq = ref.quantize_rows(torch.randn(n, kk, device=device), qdtype)
        bias = torch.randn(n, device=device).to(dtype)
        got = gemm.scaled_mm(xq.data, xq.scale, wq.data, wq.scale, bias, dtype, config=config)
        want = ref.scaled_mm(xq.data, xq.scale, wq.data, wq.scale, bias, dtype)
        tol = dict(rtol=2**-7, atol=1e-2) if dtype == torch.bfloat16 else dict(rtol=1e-5, atol=1e-4)
        torch.testing.assert_close(got, want, **tol)  # type: ignore[arg-type]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("config", gemm_configs.all_configs()
                         + [pytest.param(c, id=f"pinned{i}") for i, c in enumerate(gemm_configs.pinned_configs())])
def test_every_tuning_config_is_correct(config: object) -> None:
    """Each config the autotuner or a pinned shape may pick, run directly on a ragged shape."""
    m, n, k = 37, 200, 1100
    a = torch.randint(-127, 128, (m, k), dtype=torch.int8, device="cuda")
    b = torch.randint(-127, 128, (n, k), dtype=torch.int8, device="cuda")
    assert torch.equal(gemm.int8_mm(a, b, config=config).cpu(), _int_products(a, b))  # type: ignore[arg-type]
    xq = ref.quantize_rows(torch.randn(m, k, device="cuda"), FP8_DTYPE)
    wq = ref.quantize_rows(torch.randn(n, k, device="cuda"), FP8_DTYPE)
    got = gemm.scaled_mm(xq.data, xq.scale, wq.data, wq.scale, None, torch.float32, config=config)  # type: ignore[arg-type]
    want = ref.scaled_mm(xq.data, xq.scale, wq.data, wq.scale, None, torch.float32)
    # fp8 wgmma sums 128 products at a time in ~14-bit precision (see gemm.FP8_PROMOTE_K); left
    # unpromoted, this shape's error was 1e-2 of the output's range
    torch.testing.assert_close(got, want, rtol=0, atol=1e-3 * float(want.abs().max()))


def test_launchers_name_bad_arguments() -> None:
    a = torch.zeros(4, 64, dtype=torch.int8)
    s4, s8 = torch.ones(4, 1), torch.ones(8, 1)
    with pytest.raises(ValueError, match="b has dtype"):
        gemm.scaled_mm(a, s4, torch.zeros(8, 64, dtype=FP8_DTYPE), s8, None, torch.float32)
    with pytest.raises(ValueError, match="b has shape"):
        gemm.scaled_mm(a, s4, torch.zeros(8, 32, dtype=torch.int8), s8, None, torch.float32)
    with pytest.raises(ValueError, match="b_scale must be a contiguous tensor of 8"):
        gemm.scaled_mm(a, s4, torch.zeros(8, 64, dtype=torch.int8), s4, None, torch.float32)
    with pytest.raises(ValueError, match="a has dtype"):
        gemm.scaled_mm(a.float(), s4, a.float(), s4, None, torch.float32)
    with pytest.raises(ValueError, match="no 8-bit quantization"):
        act_quant.quantize_rows(torch.randn(2, 8), torch.int16)
    with pytest.raises(ValueError, match="weight has dtype"):
        act_quant.rms_norm_quant(torch.randn(2, 8), None, torch.ones(8, dtype=torch.float16), 1e-6, torch.int8)
