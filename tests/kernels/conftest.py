"""Kernel tests: Triton's interpreter on the CPU, real kernels on CUDA (``-m gpu``).

TRITON_INTERPRET must be set before triton is first imported in this process. pytest imports
this conftest before any kernel test module (and the other suites never need a GPU); on a
machine with CUDA the variable is left alone and the CPU cases are skipped instead.
"""

from __future__ import annotations

import os

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("TESSEL_AUTOTUNE", "0")  # one config per kernel: tests check numbers
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


@pytest.fixture(
    params=[
        pytest.param("cpu", id="cpu"),
        pytest.param("cuda", id="cuda", marks=pytest.mark.gpu),
    ]
)
def device(request: pytest.FixtureRequest) -> str:
    """cpu runs the kernels in Triton's interpreter; cuda runs them for real, in bf16."""
    if request.param == "cpu" and not INTERPRETED:
        pytest.skip("CPU kernel tests need TRITON_INTERPRET=1 (set when CUDA is absent)")
    if request.param == "cuda" and not HAS_CUDA:
        pytest.skip("needs CUDA")
    return str(request.param)
