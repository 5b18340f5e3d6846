"""Reusing a compiled kernel on repeated GPU launches, without Triton's argument binding.

``kernel_fn[grid](...)`` binds and specialises every argument in Python at each call; the
compiled kernel's own launcher skips that. A compiled kernel may be reused only for arguments
that Triton would specialise the same way, so the cache key (:func:`arg_key`) is at least as
fine as Triton's rules: two arguments with one key always compile to the same kernel (a finer
key only costs cache entries). Used by :func:`flashtext.kernels.launcher.launch`.
"""

from __future__ import annotations

_NO_KEY = object()
# fast-path key -> (compiled kernel, names of the constexpr parameters after the runtime ones)
COMPILED: dict = {}
COMPILED_MAX = 4096  # distinct shapes/layouts remembered before the cache starts over


def arg_key(a):
    """What Triton may specialise a kernel on, for one runtime argument, or ``_NO_KEY``.

    Triton 3.6/3.7 specialise a tensor on its dtype and on whether its address is a multiple
    of 16, an integer on its width and on being 1 or a multiple of 16, a host tensor
    descriptor on its dtype and block shape (a Gluon one on its shared-memory layout too);
    floats not at all. This key keeps the exact address remainder, the exact integer and the
    descriptor's every field."""
    import torch

    if isinstance(a, torch.Tensor):
        return ("t", a.dtype, a.device, a.data_ptr() % 16)
    if isinstance(a, bool) or a is None:
        return ("b", a)
    if isinstance(a, int):
        return ("i", a)
    if isinstance(a, float):
        return ("f",)
    base = getattr(a, "base", None)
    if isinstance(base, torch.Tensor) and hasattr(a, "block_shape"):
        return ("d", base.dtype, base.device, base.data_ptr() % 16, tuple(a.shape),
                tuple(a.strides), tuple(a.block_shape), getattr(a, "padding", None),
                getattr(a, "layout", None), getattr(a, "round_f32_to_tf32", None))
    return _NO_KEY


def fast_key(key: tuple, config, resolved: list) -> tuple | None:
    """The cache key of one launch, or None when an argument is of a kind not understood."""
    import torch

    parts = tuple(arg_key(a) for a in resolved)
    if _NO_KEY in parts:
        return None
    return (key, config, torch.cuda.current_device(), parts)


def remember(key: tuple, kernel_fn, kernel, n_runtime: int, constexpr_names: set) -> None:
    """Keep ``kernel`` (what ``kernel_fn[grid](...)`` returned) for later launches with ``key``,
    if every parameter after the runtime ones is a constexpr the launcher passes."""
    if not (hasattr(kernel, "run") and hasattr(kernel, "function")):
        return
    order = kernel_fn.arg_names[n_runtime:]
    if set(order) <= constexpr_names:
        if len(COMPILED) >= COMPILED_MAX:
            COMPILED.clear()
        COMPILED[key] = (kernel, tuple(order))


def launch(kernel_fn, grid: tuple, args, constexprs: dict, **options):
    """``kernel_fn[grid](*args, **constexprs, **options)``, through the compiled kernel's own
    launcher once an earlier launch had arguments Triton specialises the same way; returns the
    compiled kernel. A short call is a few microseconds of GPU work, and Triton's argument
    binding costs tens of microseconds a launch. The interpreter always takes Triton's path."""
    from flashtext import _boot

    args = list(args)
    key = None if _boot.INTERPRETING else fast_key(
        (kernel_fn, tuple(sorted(constexprs.items()))), tuple(sorted(options.items())), args)
    compiled = COMPILED.get(key) if key is not None else None
    if compiled is not None:
        kernel, order = compiled
        kernel[tuple(grid) + (1,) * (3 - len(grid))](*args, *(constexprs[n] for n in order))
        return kernel
    kernel = kernel_fn[tuple(grid)](*args, **constexprs, **options)
    if key is not None:
        remember(key, kernel_fn, kernel, len(args), set(constexprs))
    return kernel


__all__ = ["COMPILED", "arg_key", "fast_key", "launch", "remember"]
