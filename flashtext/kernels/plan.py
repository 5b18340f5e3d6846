"""Which tiles each program of the kernels visits, and how: the loop bounds of
:mod:`flashtext.kernels.forward` and :mod:`flashtext.kernels.backward`, in plain Python.

Each function repeats, line for line, the integer arithmetic at the top of a kernel, so chapters
can print and draw a kernel's schedule, and tests can check it against
:func:`flashtext.fa2.block_grid` (which classifies tiles from first principles) without reading
the kernel's memory. Query row i sees key j when j < N_k and, if causal, j <= i + (N_k - N_q).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

NOT_VISITED, MASKED_STAGE, UNMASKED_STAGE = 0, 1, 2


@dataclass(frozen=True)
class ForwardProgram:
    """One program of the forward (or dQ) kernel: query rows [start_m, start_m + BLOCK_M).

    Key tiles starting in [0, mid) run without a mask; [mid, hi) with one; the rest are
    never loaded."""

    start_m: int
    mid: int
    hi: int


@dataclass(frozen=True)
class KeyProgram:
    """One program of the dK/dV kernel: keys [start_n, start_n + BLOCK_N).

    Query tiles starting in [lo, mid) run with the causal mask, [mid, N_q) without; rows before
    lo never see these keys."""

    start_n: int
    lo: int
    mid: int


def forward_program(start_m: int, n_q: int, n_k: int, BLOCK_M: int, BLOCK_N: int,  # noqa: N803
                    causal: bool) -> ForwardProgram:
    """The bounds `_attn_fwd` and `_attn_bwd_dq` compute for the program at ``start_m``."""
    offset = n_k - n_q
    if causal:
        hi = max(min(n_k, start_m + BLOCK_M + offset), 0)  # keys the tile's last row sees
        first_row_sees = max(min(n_k, start_m + offset + 1), 0)
        mid = first_row_sees // BLOCK_N * BLOCK_N
    else:
        hi = n_k
        mid = n_k // BLOCK_N * BLOCK_N
    return ForwardProgram(start_m, mid, hi)


def key_program(start_n: int, n_q: int, n_k: int, BLOCK_M: int, BLOCK_N: int,  # noqa: N803
                causal: bool) -> KeyProgram:
    """The bounds `_attn_bwd_dkdv` computes for the program at ``start_n``."""
    offset = n_k - n_q
    if not causal:
        return KeyProgram(start_n, 0, 0)
    lo = max(start_n - offset, 0) // BLOCK_M * BLOCK_M  # first row that sees start_n, floored
    mid = max(min(start_n + BLOCK_N, n_k) - 1 - offset, 0)  # first row seeing the last key
    mid = max((mid + BLOCK_M - 1) // BLOCK_M * BLOCK_M, lo)
    return KeyProgram(start_n, lo, mid)


def forward_stages(n_q: int, n_k: int, BLOCK_M: int, BLOCK_N: int,  # noqa: N803
                   causal: bool) -> np.ndarray:
    """(query tiles, key tiles) array: NOT_VISITED, MASKED_STAGE or UNMASKED_STAGE, as the
    forward kernel (and the dQ kernel) schedules them."""
    grid = np.zeros((-(-n_q // BLOCK_M), -(-n_k // BLOCK_N)), dtype=np.int8)
    for i, start_m in enumerate(range(0, n_q, BLOCK_M)):
        p = forward_program(start_m, n_q, n_k, BLOCK_M, BLOCK_N, causal)
        for j, start_n in enumerate(range(0, n_k, BLOCK_N)):
            if start_n < p.mid:
                grid[i, j] = UNMASKED_STAGE
            elif start_n < p.hi:
                grid[i, j] = MASKED_STAGE
    return grid


def dkdv_stages(n_q: int, n_k: int, BLOCK_M: int, BLOCK_N: int,  # noqa: N803
                causal: bool) -> np.ndarray:
    """(query tiles, key tiles) array of the dK/dV kernel's schedule (one program per column)."""
    grid = np.zeros((-(-n_q // BLOCK_M), -(-n_k // BLOCK_N)), dtype=np.int8)
    for j, start_n in enumerate(range(0, n_k, BLOCK_N)):
        p = key_program(start_n, n_q, n_k, BLOCK_M, BLOCK_N, causal)
        for i, start_m in enumerate(range(0, n_q, BLOCK_M)):
            if start_m >= p.mid:
                grid[i, j] = UNMASKED_STAGE
            elif start_m >= p.lo:
                grid[i, j] = MASKED_STAGE
    return grid


__all__ = ["MASKED_STAGE", "NOT_VISITED", "UNMASKED_STAGE", "ForwardProgram", "KeyProgram",
           "dkdv_stages", "forward_program", "forward_stages", "key_program"]
