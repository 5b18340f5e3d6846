"""What the kernel test modules share: where kernels run, the sweeps, seeded inputs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import flashtext
from flashtext.kernels.accuracy import model_cases, sweep_cases

DEVICE = flashtext.torch_device()
ON_GPU = flashtext.on_gpu()
gpu = pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU (bf16 and the larger sweep)")

CPU_SWEEP = sweep_cases("cpu", ("float32", "float16"))
GPU_SWEEP = sweep_cases("gpu", ("float32", "float16", "bfloat16"))


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().to("cpu", torch.float64).numpy()


def _rand(*shape, dtype=torch.float32, seed=0, device=DEVICE):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(device=device, dtype=dtype)


def launched_on(fn, *args, **kwargs):
    """Run ``fn(*args, **kwargs)``; return its result and the set of addresses of every tensor
    its kernel launches were handed (directly or through a tensor descriptor)."""
    from flashtext.kernels.launcher import watch_launches

    with watch_launches() as launches:
        result = fn(*args, **kwargs)
    assert launches, "no kernel was launched"
    return result, set().union(*(launch.data_ptrs() for launch in launches))


def _poisoned(t: torch.Tensor, extra_rows: int = 48, extra_cols: int = 32) -> torch.Tensor:
    """A view of ``t`` inside a larger buffer whose extra rows and columns hold NaN: a kernel
    that reads past the end of a row or of the sequence turns the result into NaN. Padding by
    multiples of 16 keeps every stride's divisibility by 16, so a compiled kernel specializes
    exactly as for ``t`` itself and only the memory around it differs: any bit of difference
    is then a read out of bounds (other padding compiles another variant, equal only up to
    rounding)."""
    z, h, n, d = t.shape
    big = torch.full((z, h, n + extra_rows, d + extra_cols), float("nan"), dtype=t.dtype,
                     device=t.device)
    big[:, :, :n, :d] = t
    return big[:, :, :n, :d]


def gpu_model_sweep(head_dims) -> list:
    """The real-model cases (fp16, bf16) at the head dimensions a kernel has."""
    return [c for c in model_cases("gpu", ("float16", "bfloat16")) if c.head_dim in head_dims]


def assert_has_gqa_and_windows(cases) -> None:
    """A model sweep still holds K/V groups of 1, 4 and 8 query heads and three windows."""
    assert {c.heads // (c.heads_kv or c.heads) for c in cases} >= {1, 4, 8}
    assert len({c.window for c in cases}) >= 3


class FakeCompiled:
    """A compiled kernel as Triton's launch returns it, launched as kernel[grid](*args): what a
    fast-path test checks that a repeated launch reused."""

    function = "cufunction"

    def __init__(self):
        self.calls = []

    def run(self):  # present on a real CompiledKernel; the fast path requires it
        raise AssertionError

    def __getitem__(self, grid):
        return lambda *args: self.calls.append((grid, args))
