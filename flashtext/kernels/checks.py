"""Argument checks every kernel entry point shares: the softmax scale and the device.

Their own module, so that an entry point that needs only these (the decode kernels) does not
import the dense path's dispatch, and a recording of it names only the kernels it ran
(:func:`flashtext.recorded.measured_files`)."""

from __future__ import annotations

import math
import numbers

import torch

from flashtext import _boot


def check_scale(sm_scale, head_dim: int, name: str = "sm_scale") -> float:
    """The softmax scale: ``sm_scale`` if it is a finite number, 1/sqrt(head_dim) if None."""
    if sm_scale is None:
        return 1.0 / math.sqrt(head_dim)
    if isinstance(sm_scale, bool) or not isinstance(sm_scale, numbers.Real) \
            or not math.isfinite(sm_scale):
        raise ValueError(f"{name} must be a finite number or None (1/sqrt(head_dim)), "
                         f"got {sm_scale!r}")
    return float(sm_scale)


def check_device(tensors: dict[str, torch.Tensor]) -> None:
    """One device for all, and one the kernels run on here (or 'meta')."""
    (first, t0), *rest = tensors.items()
    for name, t in rest:
        if t.device != t0.device:
            raise ValueError(f"{first} and {name} must be on one device, got {first} on "
                             f"{t0.device} and {name} on {t.device}")
    device = t0.device
    if device.type == "meta":
        return
    if _boot.INTERPRETING:
        if device.type != "cpu":
            raise ValueError(f"{first} is on {device}, but Triton runs its CPU interpreter on "
                             "this machine: expected CPU tensors (or 'meta')")
        if t0.dtype == torch.bfloat16:
            raise ValueError(f"{first} has dtype torch.bfloat16, which needs a CUDA GPU: "
                             "Triton's CPU interpreter computes bf16 tl.dot wrongly. Use "
                             "torch.float16 or torch.float32 here.")
    elif device.type != "cuda":
        raise ValueError(f"{first} is on {device}, but Triton compiles for the GPU on this "
                         "machine: expected CUDA tensors (.cuda()) or 'meta', or set "
                         "TRITON_INTERPRET=1 before importing flashtext to run on the CPU")


__all__ = ["check_device", "check_scale"]
