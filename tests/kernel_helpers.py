"""What the kernel test modules share: where kernels run, the sweeps, seeded inputs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import flashtext
from flashtext.kernels.accuracy import sweep_cases

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
