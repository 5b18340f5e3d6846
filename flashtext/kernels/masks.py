"""Which tiles a program visits, with or without a mask: written once for every kernel.

Query row i sees key j when j < N_k and i + off - left <= j <= i + off + right, with
off = N_k - N_q (masks aligned bottom-right, as FlashAttention 2.1+ and a KV cache decode).
A plain mask is left = right = unbounded; ``causal=True`` is (unbounded, 0); a sliding window is
``window_size=(left, right)`` (flash-attn's convention, -1 unbounded). The kernels receive the
two bounds as integers, an unbounded side as :data:`UNBOUNDED` (larger than any offset), so one
code path serves all masks.

For a tile of rows (or of keys) the visible partners form one contiguous range, and the tiles
they fall in split three ways: tiles every row sees in full (no mask computed), tiles some rows
see in part (masked), and tiles no row sees (never loaded). :func:`key_tiles` gives that split
for a query tile (the forward and dQ kernels), :func:`query_tiles` for a key tile (the dK/dV
kernel); :mod:`flashtext.kernels.plan` runs the same arithmetic in Python for the chapters.
"""

from __future__ import annotations

import triton
import triton.language as tl  # noqa: F401 (triton: for @triton.jit)

# an unbounded side of the window: larger than any N, small enough that i + off + UNBOUNDED
# stays inside int32 for every sequence the kernels accept
UNBOUNDED = 2**30


def window_bounds(causal: bool, window_size: tuple[int, int]) -> tuple[int, int]:
    """The kernels' (left, right) for a validated ``causal`` and ``window_size``."""
    left, right = window_size
    if causal:
        right = 0
    return (UNBOUNDED if left < 0 else left), (UNBOUNDED if right < 0 else right)


def is_masked(left: int, right: int) -> bool:
    """Whether (left, right) from :func:`window_bounds` hides any (query, key) pair."""
    return left < UNBOUNDED or right < UNBOUNDED


@triton.jit
def key_tiles(start_m, N_Q, N_K, LEFT, RIGHT, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Key-tile starts for the query tile at ``start_m``: masked ``[lo, full_lo)``, unmasked
    ``[full_lo, full_hi)``, masked ``[full_hi, hi)``; tiles outside ``[lo, hi)`` are skipped.

    Unmasked tiles hold only keys every real row of the tile sees, and no key past N_K (a
    ragged last tile is masked: its padding must not count in the softmax)."""
    off = N_K - N_Q
    last_row = tl.minimum(start_m + BLOCK_M, N_Q) - 1
    lo = tl.maximum(start_m + off - LEFT, 0) // BLOCK_N * BLOCK_N
    hi = tl.maximum(tl.minimum(last_row + off + RIGHT + 1, N_K), 0)
    full_lo = tl.cdiv(tl.maximum(last_row + off - LEFT, 0), BLOCK_N) * BLOCK_N
    full_hi = tl.maximum(tl.minimum(start_m + off + RIGHT + 1, N_K), 0) // BLOCK_N * BLOCK_N
    if full_hi <= full_lo:  # no tile every row sees in full: one masked stretch [lo, hi),
        full_hi = tl.minimum(tl.maximum(full_hi, lo), hi)  # split anywhere inside it
        full_lo = full_hi
    return lo, full_lo, full_hi, hi


@triton.jit
def query_tiles(start_n, N_Q, N_K, LEFT, RIGHT, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Query-tile starts for the key tile at ``start_n``, split like :func:`key_tiles`.

    Rows past N_Q may sit in an unmasked tile: the dK/dV kernel reads them as q = dO = 0 with
    lse = +inf, so they add exactly 0 (keys past N_K are computed and never stored)."""
    off = N_K - N_Q
    last_key = tl.minimum(start_n + BLOCK_N, N_K) - 1
    end = tl.cdiv(N_Q, BLOCK_M) * BLOCK_M
    lo = tl.maximum(start_n - off - RIGHT, 0) // BLOCK_M * BLOCK_M
    hi = tl.maximum(tl.minimum(last_key - off + LEFT + 1, N_Q), 0)
    full_lo = tl.cdiv(tl.maximum(last_key - off - RIGHT, 0), BLOCK_M) * BLOCK_M
    full_hi = tl.maximum(tl.minimum(start_n - off + LEFT + 1, N_Q), 0)
    if full_hi >= N_Q:
        full_hi = end
    else:
        full_hi = full_hi // BLOCK_M * BLOCK_M
    if full_hi <= full_lo:  # one masked stretch: the query tiles that start in [lo, hi)
        full_lo = tl.minimum(tl.maximum(full_lo, lo), tl.cdiv(hi, BLOCK_M) * BLOCK_M)
        full_hi = full_lo
    return lo, full_lo, full_hi, hi


@triton.jit
def visible(offs_m, offs_n, N_Q, N_K, LEFT, RIGHT):
    """(rows, keys) mask of the window for row indices ``offs_m`` and key indices ``offs_n``
    (keys past N_K hidden)."""
    diag = offs_m[:, None] + (N_K - N_Q)
    key = offs_n[None, :]
    return (key < N_K) & (key >= diag - LEFT) & (key <= diag + RIGHT)


__all__ = ["UNBOUNDED", "is_masked", "key_tiles", "query_tiles", "visible", "window_bounds"]
