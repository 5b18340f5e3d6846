"""What a checker says to the reader: plain renderings of values, and the comparisons that raise
:class:`ExerciseFailed` with the input, the expected and the actual value and where they differ.

Numbers are written plainly (``2.5``, ``-inf``, ``24,832`` in prose), never as NumPy reprs
(``np.float64(2.5)``); messages are built so that singular and plural quantities both read well
("in the probabilities, entry (3,) is wrong").
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np


class ExerciseFailed(AssertionError):
    """A reader's answer is wrong; the message says how."""


def number(x: Any, digits: int | None = None) -> str:
    """A plain rendering of one number: ``3``, ``24,832``, ``2.5``, ``1e-300``, ``-inf``.

    Integers (and floats that hold one exactly, below 1e15) get thousands separators; other
    floats their shortest exact form, or ``digits`` significant digits when given.
    """
    if isinstance(x, (bool, np.bool_)):
        return str(bool(x))
    if isinstance(x, numbers.Integral):
        return f"{int(x):,}" if abs(int(x)) >= 10_000 else str(int(x))
    if isinstance(x, numbers.Real):
        f = float(x)
        if np.isfinite(f) and f == int(f) and abs(f) < 1e15:
            return number(int(f))
        return repr(f) if digits is None else f"{f:.{digits}g}"
    return repr(x)


def two_numbers(expected: float, got: float) -> tuple[str, str]:
    """The two with as few digits as tell them apart (at most all of them)."""
    for digits in (6, 9, 12, 17):
        e, g = number(expected, digits), number(got, digits)
        if e != g:
            return e, g
    return number(expected), number(got)


def describe(value: Any, limit: int = 6) -> str:
    """A short, readable rendering of an input or output for failure messages."""
    if hasattr(value, "detach"):
        value = value.detach().cpu().numpy()
    if isinstance(value, np.ndarray):
        if value.ndim == 0:
            return number(value.item())
        if value.dtype.kind not in "biuf":
            return f"array(shape={value.shape}, dtype={value.dtype})"
        shown = ", ".join(f"{v:.6g}" if isinstance(v, float) else number(v)
                          for v in value.ravel()[:limit].tolist())
        more = ", ..." if value.size > limit else ""
        return f"array(shape={value.shape}, dtype={value.dtype}, values=[{shown}{more}])"
    if isinstance(value, (numbers.Number, np.generic)) and not isinstance(value, str):
        return number(value)
    if isinstance(value, (tuple, list)):
        items = [describe(v, limit) for v in value[:limit]]
        if len(value) > limit:
            items.append("...")
        if isinstance(value, tuple):
            return f"({items[0]},)" if len(items) == 1 else f"({', '.join(items)})"
        return f"[{', '.join(items)}]"
    if isinstance(value, dict):
        items = [f"{k!r}: {describe(v, limit)}" for k, v in list(value.items())[:limit]]
        return "{" + ", ".join(items) + (", ..." if len(value) > limit else "") + "}"
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def kind_of(value: Any) -> str:
    """'the str 'fast'', 'a dict', ...: what came back, when it is not what was asked for."""
    if isinstance(value, str):
        return f"the str {value!r}"
    name = type(value).__name__
    article = "an" if name[:1].lower() in "aeiou" else "a"
    return f"{article} {name} ({describe(value)})"


def expect(condition: bool, message: str) -> None:
    if not condition:
        raise ExerciseFailed(message)


def _as_numbers(got: Any, what: str, case: str) -> np.ndarray:
    """``got`` as a float64 array, or an ExerciseFailed that says what came back instead."""
    if got is None:
        raise ExerciseFailed(f"{case}: {what} came back as None. Did you forget `return`?")
    if hasattr(got, "detach"):
        got = got.detach().cpu().numpy()
    if isinstance(got, (str, bytes, dict, set)) or callable(got):
        raise ExerciseFailed(f"{case}: {what} should be a number (or an array of numbers), "
                             f"but your function returned {kind_of(got)}.")
    try:
        arr = np.asarray(got, dtype=np.float64)
    except (TypeError, ValueError):
        raise ExerciseFailed(f"{case}: {what} should be a number (or an array of numbers), "
                             f"but your function returned {kind_of(got)}.") from None
    return arr


def expect_close(got: Any, expected: Any, *, what: str, case: str,
                 rtol: float = 1e-9, atol: float = 1e-12) -> None:
    """Raise ExerciseFailed unless ``got`` matches ``expected`` (shape and values).

    ``what`` names the quantity ("the output O"), ``case`` the input it came from.
    """
    got_arr = _as_numbers(got, what, case)
    exp_arr = np.asarray(expected, dtype=np.float64)
    if got_arr.shape != exp_arr.shape:
        raise ExerciseFailed(f"{case}: {what} has shape {got_arr.shape}, expected "
                             f"{exp_arr.shape}.")
    same_inf = np.isinf(exp_arr) & (got_arr == exp_arr)
    ok = same_inf | np.isclose(got_arr, exp_arr, rtol=rtol, atol=atol)
    if np.all(ok):
        return
    if got_arr.ndim == 0:
        e, g = two_numbers(float(exp_arr), float(got_arr))
        hint = " (NaN: an overflow, or inf - inf?)" if np.isnan(float(got_arr)) else ""
        raise ExerciseFailed(f"{case}: {what}: expected {e}, got {g}{hint}.")
    bad = np.argwhere(~ok)
    first = tuple(int(i) for i in bad[0])
    e, g = two_numbers(float(exp_arr[first]), float(got_arr[first]))
    hint = " (NaN: an overflow, or inf - inf?)" if np.isnan(float(got_arr[first])) else ""
    raise ExerciseFailed(
        f"{case}: in {what}, the entry at index {first} is wrong: expected {e}, got {g}{hint}; "
        f"{len(bad)} of {exp_arr.size} entries differ."
    )
