"""Tensor descriptors: when the copy engine (TMA) can fetch a kernel's tiles, and how.

A host-side ``TensorDescriptor`` names a tensor's shape, strides and the tile shape a kernel
loads; on Hopper the kernel then fetches tiles with the bulk tensor copy engine, which also
zero-fills rows and columns past the tensor's edge. Triton's interpreter runs the same code on
the CPU. Layouts the copy engine cannot address take the pointer path instead.
"""

from __future__ import annotations

import functools

import torch

from flashtext.kernels.config import KernelConfig, block_d
from flashtext.kernels.launcher import PerConfig

try:  # host-side tensor descriptors (Triton >= 3.4)
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - older Triton: the pointer path only
    TensorDescriptor = None


@functools.cache
def capability_major(index: int | None) -> int:
    """The compute capability's major number of a CUDA device (asked once per device: the
    query costs microseconds, and it runs for every tensor of every launch)."""
    return torch.cuda.get_device_capability(index)[0]


def tma_ok(t: torch.Tensor) -> bool:
    """Can the copy engine (TMA, Hopper and later; or the interpreter) fetch tiles of ``t``?
    It needs a 16-byte aligned base, unit stride along head_dim and every other stride a
    positive multiple of 16 bytes; other layouts take the pointer path."""
    if TensorDescriptor is None:
        return False
    if t.is_cuda and capability_major(t.device.index) < 9:
        return False
    size = t.element_size()
    return (t.stride(-1) == 1 and t.data_ptr() % 16 == 0
            and all(s > 0 and s * size % 16 == 0 for s in t.stride()[:-1]))


def descriptor(t: torch.Tensor, rows: int):
    """A descriptor that hands out ``rows`` x BLOCK_D tiles of one head: over ``t`` (Z, H, N, d)
    at coordinates [batch, head, first row, 0], or over packed ``t`` (total, H, d) at
    [first row, head, 0]. Rows past the tensor and columns past d read as 0."""
    block = [1, 1, rows] if t.dim() == 4 else [rows, 1]
    return TensorDescriptor(t, list(t.shape), list(t.stride()), block + [block_d(t.shape[-1])])


def tile_sources(config: KernelConfig, rows: str, *tensors: torch.Tensor) -> tuple[bool, list]:
    """What a kernel's inner loop should read its streamed tiles from: descriptors (made per
    launch configuration, ``rows`` = "BLOCK_M" or "BLOCK_N" tall) when ``config.tma`` is on and
    every tensor's layout allows it, else the tensors themselves. Returns (USE_TMA, arguments)."""
    if config.tma and all(tma_ok(t) for t in tensors):
        return True, [PerConfig(lambda c, t=t: descriptor(t, getattr(c, rows))) for t in tensors]
    return False, list(tensors)


__all__ = ["TensorDescriptor", "capability_major", "descriptor", "tile_sources", "tma_ok"]
