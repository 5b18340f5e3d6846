"""Which tiles each program of the kernels visits, and how: the loop bounds of
:mod:`flashtext.kernels.forward` and :mod:`flashtext.kernels.backward`, in plain Python.

The kernels take their bounds from :func:`flashtext.kernels.masks.key_tiles` and
:func:`~flashtext.kernels.masks.query_tiles`; the functions here run the same integer
arithmetic on Python ints, so chapters can print and draw a kernel's schedule, and tests check
both that the kernels run exactly these bounds (by spying on them under the interpreter) and
that the bounds are right and tight (against :func:`flashtext.fa2.block_grid` and a brute-force
classification of every tile). Query row i sees key j when j < N_k and
i + off - left <= j <= i + off + right, off = N_k - N_q (``causal`` is right = 0).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from flashtext.kernels.masks import UNBOUNDED, window_bounds

NOT_VISITED, MASKED_STAGE, UNMASKED_STAGE = 0, 1, 2


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class ForwardProgram:
    """One program of the forward (or dQ) kernel: query rows [start_m, start_m + BLOCK_M).

    Key tiles starting in [lo, full_lo) and [mid, hi) run with a mask, [full_lo, mid) without;
    the rest are never loaded. (``mid`` is where the unmasked stretch ends; with a causal or no
    mask lo = full_lo = 0: no mask [0, mid), masked [mid, hi).)"""

    start_m: int
    mid: int
    hi: int
    lo: int = 0
    full_lo: int = 0


@dataclass(frozen=True)
class KeyProgram:
    """One program of the dK/dV kernel: keys [start_n, start_n + BLOCK_N).

    Query tiles starting in [lo, mid) and [full_hi, hi) run with a mask, [mid, full_hi) without;
    rows outside [lo, hi) never see these keys. (With a causal or no mask: masked [lo, mid), no
    mask [mid, N_q).)"""

    start_n: int
    lo: int
    mid: int
    full_hi: int = 0
    hi: int = 0


def forward_program(start_m: int, n_q: int, n_k: int, BLOCK_M: int, BLOCK_N: int,  # noqa: N803
                    causal: bool, window: tuple[int, int] = (-1, -1)) -> ForwardProgram:
    """The bounds `_attn_fwd` and `_attn_bwd_dq` compute (``masks.key_tiles``) for the program
    at ``start_m``."""
    left, right = window_bounds(causal, window)
    off = n_k - n_q
    last_row = min(start_m + BLOCK_M, n_q) - 1
    lo = max(start_m + off - left, 0) // BLOCK_N * BLOCK_N
    hi = max(min(last_row + off + right + 1, n_k), 0)
    full_lo = _cdiv(max(last_row + off - left, 0), BLOCK_N) * BLOCK_N
    full_hi = max(min(start_m + off + right + 1, n_k), 0) // BLOCK_N * BLOCK_N
    if full_hi <= full_lo:
        full_hi = min(max(full_hi, lo), hi)
        full_lo = full_hi
    return ForwardProgram(start_m, full_hi, hi, lo, full_lo)


def key_program(start_n: int, n_q: int, n_k: int, BLOCK_M: int, BLOCK_N: int,  # noqa: N803
                causal: bool, window: tuple[int, int] = (-1, -1)) -> KeyProgram:
    """The bounds `_attn_bwd_dkdv` computes (``masks.query_tiles``) for the program at
    ``start_n``."""
    left, right = window_bounds(causal, window)
    off = n_k - n_q
    last_key = min(start_n + BLOCK_N, n_k) - 1
    end = _cdiv(n_q, BLOCK_M) * BLOCK_M
    lo = max(start_n - off - right, 0) // BLOCK_M * BLOCK_M
    hi = max(min(last_key - off + left + 1, n_q), 0)
    full_lo = _cdiv(max(last_key - off - right, 0), BLOCK_M) * BLOCK_M
    full_hi = max(min(start_n - off + left + 1, n_q), 0)
    full_hi = end if full_hi >= n_q else full_hi // BLOCK_M * BLOCK_M
    if full_hi <= full_lo:
        full_lo = min(max(full_lo, lo), _cdiv(hi, BLOCK_M) * BLOCK_M)
        full_hi = full_lo
    return KeyProgram(start_n, lo, full_lo, full_hi, hi)


def forward_stages(n_q: int, n_k: int, BLOCK_M: int, BLOCK_N: int,  # noqa: N803
                   causal: bool, window: tuple[int, int] = (-1, -1)) -> np.ndarray:
    """(query tiles, key tiles) array: NOT_VISITED, MASKED_STAGE or UNMASKED_STAGE, as the
    forward kernel (and the dQ kernel) schedules them."""
    grid = np.zeros((_cdiv(n_q, BLOCK_M), _cdiv(n_k, BLOCK_N)), dtype=np.int8)
    for i, start_m in enumerate(range(0, n_q, BLOCK_M)):
        p = forward_program(start_m, n_q, n_k, BLOCK_M, BLOCK_N, causal, window)
        for j, start_n in enumerate(range(0, n_k, BLOCK_N)):
            if p.full_lo <= start_n < p.mid:
                grid[i, j] = UNMASKED_STAGE
            elif p.lo <= start_n < p.hi:
                grid[i, j] = MASKED_STAGE
    return grid


def dkdv_stages(n_q: int, n_k: int, BLOCK_M: int, BLOCK_N: int,  # noqa: N803
                causal: bool, window: tuple[int, int] = (-1, -1)) -> np.ndarray:
    """(query tiles, key tiles) array of the dK/dV kernel's schedule (one program per column)."""
    grid = np.zeros((_cdiv(n_q, BLOCK_M), _cdiv(n_k, BLOCK_N)), dtype=np.int8)
    for j, start_n in enumerate(range(0, n_k, BLOCK_N)):
        p = key_program(start_n, n_q, n_k, BLOCK_M, BLOCK_N, causal, window)
        for i, start_m in enumerate(range(0, n_q, BLOCK_M)):
            if p.mid <= start_m < p.full_hi:
                grid[i, j] = UNMASKED_STAGE
            elif p.lo <= start_m < p.hi:
                grid[i, j] = MASKED_STAGE
    return grid


def visible_pairs(n_q: int, n_k: int, causal: bool, window: tuple[int, int] = (-1, -1)) -> int:
    """How many (query, key) pairs the mask lets through: the work a window makes linear in N."""
    left, right = window_bounds(causal, window)
    off = n_k - n_q
    rows = np.arange(n_q) + off
    first = np.maximum(rows - min(left, UNBOUNDED), 0)
    last = np.minimum(rows + min(right, UNBOUNDED), n_k - 1)
    return int(np.maximum(last - first + 1, 0).sum())


__all__ = ["MASKED_STAGE", "NOT_VISITED", "UNMASKED_STAGE", "ForwardProgram", "KeyProgram",
           "dkdv_stages", "forward_program", "forward_stages", "key_program", "visible_pairs"]
