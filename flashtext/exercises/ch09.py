"""Chapter 9's exercises, in the style of Triton-Puzzles: a spec in PyTorch, a stub kernel, and a
checker that launches *your kernel* (under the interpreter on a CPU, compiled on a GPU) on random
and ragged shapes, with inputs of both signs, and shows yours vs expected.

Each checker takes the ``@triton.jit`` function itself and launches it with the signature the
stub documents. A stub whose body still says ``raise NotImplementedError`` counts as not
attempted. Outputs live inside larger buffers filled with a sentinel, so a store past the end
(a missing mask) is caught even where the interpreter would not complain.
"""

from __future__ import annotations

import contextlib
import inspect
import os

import numpy as np
import torch

import flashtext
from flashtext import reference as ref
from flashtext.exercises.core import ExerciseFailed, adversarial_rows, describe, exercise, expect

SENTINEL = -12345.0


def _device() -> str:
    return flashtext.torch_device()


def tf32_tolerance(cpu: float) -> float:
    """A tolerance for checks of fp32 ``tl.dot``: on a GPU, Triton rounds fp32 dot inputs to
    TF32 (10-bit mantissa) unless asked for "ieee", so a correct kernel is only ~1e-3 exact."""
    return max(cpu, 5e-3) if flashtext.on_gpu() else cpu


@contextlib.contextmanager
def exact_fp32_dots(kernel):
    """Compile ``kernel`` with exact fp32 ``tl.dot`` (``TRITON_F32_DEFAULT=ieee``) while checking.

    On a GPU, Triton rounds fp32 dot inputs to TF32 by default: a score near 1000 then moves by
    ~0.5, which no tolerance can tell from a wrong answer. The environment variable is part of
    Triton's compilation cache key; the in-memory cache of this one kernel is cleared so that it
    is compiled again, under the variable and after it. The interpreter ignores it (NumPy fp32).
    """
    old = os.environ.get("TRITON_F32_DEFAULT")
    os.environ["TRITON_F32_DEFAULT"] = "ieee"
    caches = getattr(kernel, "device_caches", None)
    if caches is not None:
        caches.clear()
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("TRITON_F32_DEFAULT", None)
        else:
            os.environ["TRITON_F32_DEFAULT"] = old
        if caches is not None:
            caches.clear()


def _require_kernel(kernel) -> None:
    """Report an untouched stub as not attempted, and refuse what is not a Triton kernel."""
    fn = getattr(kernel, "fn", kernel)
    try:
        source = inspect.getsource(fn)
    except (OSError, TypeError):
        source = ""
    if "raise NotImplementedError" in source:
        raise NotImplementedError
    if not (hasattr(kernel, "fn") and hasattr(kernel, "__getitem__")):
        raise ExerciseFailed(f"expected a @triton.jit function, got {describe(kernel)}; "
                             "put @triton.jit on the line above `def`.")


def _launch(kernel, grid, *args, **kwargs) -> None:
    # under the interpreter a kernel's -inf and log(0) are NumPy operations: keep their
    # RuntimeWarnings out of the reader's notebook (the results are checked, not the warnings)
    with np.errstate(all="ignore"):
        kernel[grid](*args, **kwargs)


def _buffer(n: int, extra: int, dtype=torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """A view of n elements at the start of a sentinel-filled buffer of n + extra."""
    buf = torch.full((n + extra,), SENTINEL, dtype=dtype, device=_device())
    return buf[:n], buf


def _yours_vs_expected(got: np.ndarray, want: np.ndarray, case: str, what: str,
                       rtol: float, atol: float) -> None:
    if got.shape != want.shape:
        raise ExerciseFailed(f"{case}: {what} has shape {got.shape}, expected {want.shape}.")
    both_inf = np.isinf(want) & (got == want)
    ok = both_inf | np.isclose(got, want, rtol=rtol, atol=atol)
    if ok.all():
        return
    bad = np.argwhere(~ok)
    first = tuple(int(i) for i in bad[0])
    g, w = float(got[first]), float(want[first])
    hint = ""
    if np.isnan(g):
        hint = " (NaN: inf - inf, an overflow, or a load past the end without a mask?)"
    elif g == SENTINEL:
        hint = " (never written: is the grid covered, and is your program_id used?)"
    flat = int(np.ravel_multi_index(first, want.shape))
    lo = max(0, flat - 3)
    window = slice(lo, lo + 8)
    raise ExerciseFailed(
        f"{case}: {what} is wrong at index {first}: expected {w:.6g}, got {g:.6g}{hint}; "
        f"{len(bad)} of {want.size} entries differ.\n"
        f"  yours    [{lo}:]: {np.array2string(got.ravel()[window], precision=4)}\n"
        f"  expected [{lo}:]: {np.array2string(want.ravel()[window], precision=4)}")


def _untouched(buf: torch.Tensor, n: int, case: str) -> None:
    tail = buf[n:].cpu()
    written = int((tail != SENTINEL).sum())
    expect(written == 0, f"{case}: your kernel wrote {written} value(s) past the end of the "
                         "output. Masked lanes must not store: tl.store(..., mask=offs < n).")


# ---------------------------------------------------------------------------------- 9.1 axpy

def axpy_spec(x: torch.Tensor, y: torch.Tensor, alpha: float) -> torch.Tensor:
    return alpha * x + y


@exercise(
    "ch09.axpy",
    "axpy: out = alpha * x + y, one block of BLOCK elements per program",
    hints=(
        "pid = tl.program_id(0); offs = pid * BLOCK + tl.arange(0, BLOCK).",
        "The last program's block sticks out past n: mask = offs < n, and pass mask= to both "
        "tl.load and tl.store.",
        "alpha is a plain scalar argument: alpha * x works on the whole block.",
    ),
)
def check_axpy(kernel) -> None:
    _require_kernel(kernel)
    import triton

    g = torch.Generator().manual_seed(9)
    for n, block, alpha in ((1, 64, 2.0), (100, 64, -1.5), (128, 128, 0.5), (1000, 256, -3.0),
                            (1537, 128, 1.0)):
        case = f"n={n}, BLOCK={block}, alpha={alpha}"
        x = torch.randn(n, generator=g).to(_device())  # both signs: no [0, 1) inputs
        y = torch.randn(n, generator=g).to(_device())
        out, buf = _buffer(n, 300)
        _launch(kernel, (triton.cdiv(n, block),), x, y, out, n, alpha, BLOCK=block)
        _yours_vs_expected(out.cpu().numpy(), axpy_spec(x, y, alpha).cpu().numpy(), case,
                           "out", rtol=1e-6, atol=1e-6)
        _untouched(buf, n, case)


# ------------------------------------------------------------------------ 9.2 row logsumexp

def row_logsumexp_spec(x: torch.Tensor) -> torch.Tensor:
    return torch.logsumexp(x, dim=1)


@exercise(
    "ch09.row_logsumexp",
    "Row log-sum-exp: one program per row, safe against overflow and -inf",
    hints=(
        "row = tl.program_id(0); cols = tl.arange(0, BLOCK); load X + row * stride_row + cols "
        "with mask = cols < n_cols.",
        "Padding must not count: load it as -inf (other=float('-inf')), so exp(-inf) = 0.",
        "Subtract the row max before exp, add it back after the log: m + log(sum(exp(x - m))).",
        "A row of only -inf has m = -inf and x - m = NaN: compute with m_safe = 0 for such a row "
        "(tl.where(m == float('-inf'), 0.0, m)); its answer is -inf.",
    ),
)
def check_row_logsumexp(kernel) -> None:
    _require_kernel(kernel)
    import triton

    rng = np.random.default_rng(9)
    for n_cols in (1, 5, 33, 100):
        rows = adversarial_rows(rng, n_cols)
        names = list(rows)
        data = np.stack([rows[k] for k in names] + [np.full(n_cols, -np.inf)])
        names.append("a row of only -inf (no key visible)")
        for block, stride_extra in ((triton.next_power_of_2(n_cols), 0),
                                    (2 * triton.next_power_of_2(n_cols), 7)):
            # rows of length n_cols, stored with a row stride n_cols + stride_extra
            padded = np.full((len(data), n_cols + stride_extra), 3.0e4)  # junk between rows
            padded[:, :n_cols] = data
            x = torch.tensor(padded, dtype=torch.float32, device=_device())
            out, buf = _buffer(len(data), 8)
            _launch(kernel, (len(data),), x, out, x.stride(0), n_cols, BLOCK=block)
            got, want = out.cpu().numpy().astype(np.float64), ref.logsumexp(data)
            for i, name in enumerate(names):
                _yours_vs_expected(got[i:i + 1], want[i:i + 1],
                                   f"n_cols={n_cols}, BLOCK={block}, row stride "
                                   f"{n_cols + stride_extra}: {name}", "the log-sum-exp",
                                   rtol=1e-5, atol=1e-5)
            _untouched(buf, len(data), f"n_cols={n_cols}, BLOCK={block}")


# ------------------------------------------------------------------------------ 9.3 matmul

def matmul_spec(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a.float() @ b.float()


@exercise(
    "ch09.matmul",
    "Tiled matmul: C = A @ B, one (BLOCK_M x BLOCK_N) tile of C per program",
    hints=(
        "offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M); the same for n with "
        "program_id(1); acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32).",
        "Loop for start_k in range(0, K, BLOCK_K): load an A tile at offs_m[:, None] * stride_am "
        "+ k[None, :] * stride_ak and a B tile at k[:, None] * stride_bk + offs_n[None, :] * "
        "stride_bn, with k = start_k + tl.arange(0, BLOCK_K).",
        "Mask both loads on every index that can run past the edge (rows, columns AND k) with "
        "other=0.0: zeros add nothing to a dot product. acc = tl.dot(a, b, acc).",
        "Use the strides you are given, not K or N: the checker passes a transposed B.",
        "Store acc with mask (offs_m[:, None] < M) & (offs_n[None, :] < N).",
    ),
)
def check_matmul(kernel) -> None:
    _require_kernel(kernel)
    import triton

    g = torch.Generator().manual_seed(9)
    dev = _device()
    for m, k, n, blocks, transposed in ((16, 16, 16, (16, 16, 16), False),
                                        (37, 50, 20, (16, 16, 16), False),
                                        (64, 40, 48, (32, 16, 32), False),
                                        (33, 70, 45, (16, 32, 16), True),
                                        (1, 100, 17, (16, 16, 32), True)):
        bm, bn, bk = blocks
        case = (f"M={m}, K={k}, N={n}, BLOCK_M={bm}, BLOCK_N={bn}, BLOCK_K={bk}"
                + (", B transposed (strides (1, K))" if transposed else ""))
        a = torch.randn(m, k, generator=g).to(dev, torch.float16)
        b = (torch.randn(n, k, generator=g).T if transposed
             else torch.randn(k, n, generator=g)).to(dev, torch.float16)
        c_buf = torch.full((m + 3, n), SENTINEL, dtype=torch.float32, device=dev)
        c = c_buf[:m]
        _launch(kernel, (triton.cdiv(m, bm), triton.cdiv(n, bn)), a, b, c, m, n, k,
                *a.stride(), *b.stride(), *c.stride(), BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk)
        # products of fp16 numbers are exact in fp32: only the fp32 sum rounds
        _yours_vs_expected(c.cpu().numpy().astype(np.float64),
                           a.double().cpu().numpy() @ b.double().cpu().numpy(), case, "C",
                           rtol=1e-4, atol=1e-4)
        expect(bool((c_buf[m:] == SENTINEL).all()),
               f"{case}: your kernel wrote past the last row of C: mask the store.")
