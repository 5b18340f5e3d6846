"""Checks of an exercise's stated rules, beyond the values it returns: "no n x n matrix" (peak
memory of one call) and "at most `block` scores at a time" (a row that notes whole-row
arithmetic)."""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable
from typing import Any

import numpy as np


def peak_allocation(fn: Callable[..., Any], *args: Any) -> tuple[Any, int]:
    """``(fn(*args), the peak bytes allocated during the call)``, as tracemalloc sees them
    (NumPy reports its array buffers to it). A tracemalloc session already running is left
    running."""
    was_tracing = tracemalloc.is_tracing()
    if not was_tracing:
        tracemalloc.start()
    tracemalloc.reset_peak()
    base, _ = tracemalloc.get_traced_memory()
    try:
        result = fn(*args)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        if not was_tracing:
            tracemalloc.stop()
    return result, max(peak - base, 0)


# ufuncs that compute with scores (max, sums, exponentials, shifts); comparisons and tests such
# as np.isneginf may look at the whole row
_ARITHMETIC = {"exp", "exp2", "expm1", "log", "log1p", "maximum", "minimum", "fmax", "fmin", "add",
               "subtract", "multiply", "divide", "true_divide", "logaddexp", "logaddexp2"}


class StreamedRow(np.ndarray):
    """A row of scores that notes arithmetic on more than ``block`` of them at once.

    Slicing gives rows of the same kind, so ``x[a:a + block]`` may be used freely; results of
    arithmetic are plain arrays. The stated rule of a streaming pass is that it reads at most
    ``block`` scores at a time: ``np.max(x)`` over the whole row breaks it.
    """

    def __new__(cls, x: np.ndarray, block: int, log: list[str]):
        row = np.asarray(x).view(cls)
        row._block, row._log = block, log
        return row

    def __array_finalize__(self, obj) -> None:
        self._block = getattr(obj, "_block", None)
        self._log = getattr(obj, "_log", None)

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        for x in inputs:
            if isinstance(x, StreamedRow) and x._block is not None and x.size > x._block \
                    and ufunc.__name__ in _ARITHMETIC and x._log is not None:
                call = f"np.{ufunc.__name__}" + (f".{method}" if method != "__call__" else "")
                x._log.append(f"{call} on {x.size} scores at once")
        plain = [np.asarray(x) if isinstance(x, StreamedRow) else x for x in inputs]
        if "out" in kwargs:
            kwargs["out"] = tuple(np.asarray(o) if isinstance(o, StreamedRow) else o
                                  for o in kwargs["out"])
        return getattr(ufunc, method)(*plain, **kwargs)
