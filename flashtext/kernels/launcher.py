"""Launching a kernel with a configuration from :mod:`flashtext.kernels.config`.

:func:`launch` binds the launch configuration (tile sizes, warps, stages), steps down through
:meth:`~flashtext.kernels.config.KernelConfig.smaller` when the compiler reports that a
configuration does not fit the GPU's shared memory or registers, and on a GPU reuses the compiled
kernel for repeated launches (:mod:`flashtext.kernels.fastpath`). :func:`watch_launches` records
what each launch was given, so a test or a chapter can check which memory a kernel read.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field

from flashtext.kernels import fastpath
from flashtext.kernels.config import KernelConfig


@dataclass(frozen=True)
class PerConfig:
    """A kernel argument that depends on the launch configuration (a tensor descriptor's tile
    shape follows BLOCK_N): :func:`launch` calls ``make(config)`` for the configuration it runs."""

    make: object

    def __call__(self, config: KernelConfig):
        return self.make(config)


@dataclass
class Launch:
    """What one :func:`launch` handed to a kernel: its name, the configuration that ran and the
    runtime arguments (tensor descriptors included)."""

    kernel: str
    config: KernelConfig
    args: list = field(default_factory=list)

    def data_ptrs(self) -> set[int]:
        """Addresses of every tensor the kernel was given, directly or through a descriptor."""
        import torch

        ptrs = set()
        for a in self.args:
            base = a if isinstance(a, torch.Tensor) else getattr(a, "base", None)
            if isinstance(base, torch.Tensor):
                ptrs.add(base.data_ptr())
        return ptrs


_WATCHERS: list[list[Launch]] = []


@contextlib.contextmanager
def watch_launches() -> Iterator[list[Launch]]:
    """Record every :func:`launch` made inside the ``with`` block (a list of :class:`Launch`)."""
    seen: list[Launch] = []
    _WATCHERS.append(seen)
    try:
        yield seen
    finally:
        _WATCHERS.remove(seen)


def launch(kernel_fn, grid_fn, config: KernelConfig, *args, **constexprs) -> KernelConfig:
    """Launch ``kernel_fn[grid_fn(config)](*args, **constexprs, BLOCK_M=..., BLOCK_N=...)``.

    If the compiler says the configuration needs more shared memory or registers than the GPU
    has, retry with :meth:`KernelConfig.smaller`. Returns the configuration that ran.

    On a GPU a repeated launch skips Triton's argument binding: ``kernel_fn[grid](...)`` costs
    35-50 us of Python per launch on the H200's host, the compiled kernel's own launcher 17-22 us
    (``scripts/profile_host.py --launch``, ``flashtext/data/host_launch_h200.json``), and a small
    fwd+bwd (four launches) is host-bound. The compiled kernel is reused only for arguments that
    look the same to Triton's specialiser (:func:`flashtext.kernels.fastpath.fast_key`).
    """
    from triton.runtime.errors import OutOfResources

    key = (kernel_fn, config, tuple(sorted(constexprs.items())))
    current: KernelConfig | None = _FITS.get(key, config)
    while current is not None:
        resolved = [a(current) if isinstance(a, PerConfig) else a for a in args]
        for seen in _WATCHERS:
            seen.append(Launch(getattr(kernel_fn, "__name__", str(kernel_fn)), current, resolved))
        meta = {**constexprs, "BLOCK_M": current.BLOCK_M, "BLOCK_N": current.BLOCK_N}
        try:
            fastpath.launch(kernel_fn, grid_fn(current), resolved, meta,
                            num_warps=current.num_warps, num_stages=current.num_stages)
        except OutOfResources:  # raised by a first compile only; the fast path never does
            nxt = current.smaller()
            if nxt is None:
                raise
            current = nxt
            continue
        _FITS[key] = current
        return current
    raise AssertionError("unreachable")


# (kernel, requested config, constexprs) -> the configuration that fitted, so that a step-down
# happens once per process, not at every call
_FITS: dict = {}

__all__ = ["Launch", "PerConfig", "launch", "watch_launches"]
