"""Counting formulas: FLOPs, HBM traffic, block sizes, arithmetic intensity.

Counts are in *elements* unless a name says bytes; multiply by the dtype size (2 for fp16/bf16).
"""

from __future__ import annotations

import math
import numbers


def attention_flops(batch: int, heads: int, n_q: int, d: int, n_k: int | None = None,
                    causal: bool = False, mode: str = "fwd") -> float:
    """The standard FLOP count used by every FlashAttention paper and benchmark.

    Forward: two matmuls (Q K^T and P V) of 2*Nq*Nk*d each -> 4*B*H*Nq*Nk*d; causal halves it;
    fwd+bwd counts 3.5x the forward (the backward does 2.5x: five matmuls to the forward's two).
    """
    n_k = n_q if n_k is None else n_k
    flops = 4.0 * batch * heads * n_q * n_k * d
    if causal:
        flops *= 0.5
    factor = {"fwd": 1.0, "bwd": 2.5, "fwd_bwd": 3.5}
    if mode not in factor:
        raise ValueError(f"mode must be one of {sorted(factor)}, got {mode!r}")
    return flops * factor[mode]


def standard_attention_hbm_elements(n: int, d: int) -> dict[str, int]:
    """HBM reads and writes of standard attention (FA1's Algorithm 0), per head, by step.

    1. read Q, K; write S = Q K^T      2. read S; write P = softmax(S)      3. read P, V; write O
    Total 4*N*d + 4*N^2: Theta(N d + N^2).
    """
    return {
        "S = QK^T": 2 * n * d + n * n,
        "P = softmax(S)": 2 * n * n,
        "O = PV": n * n + n * d + n * d,
    }


def block_sizes(m_elements: int, d: int) -> tuple[int, int]:
    """Algorithm 1, line 1: (Bc, Br) = (ceil(M / 4d), min(ceil(M / 4d), d)). M counts elements."""
    if m_elements <= 0 or d <= 0:
        raise ValueError(f"M and d must be positive, got M={m_elements}, d={d}")
    bc = math.ceil(m_elements / (4 * d))
    return bc, min(bc, d)


# ------------------------------------------------------------------ FlashAttention-1 (chapters 4-6)
# Algorithm 1 of arXiv 2205.14135, batch size 1, one head. Everything is counted in elements.

LOOP_ORDERS = ("kv_outer", "q_outer")


def _positive(**values: int) -> None:
    for name, value in values.items():
        if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")


def fa1_grid(n: int, d: int, m_elements: int, n_k: int | None = None) -> dict[str, int]:
    """Lines 1, 3, 4: the block sizes and how many blocks each axis splits into.

    Tr = ceil(Nq / Br) query (row) blocks, Tc = ceil(Nk / Bc) key/value (column) blocks.
    """
    n_k = n if n_k is None else n_k
    _positive(n=n, d=d, m_elements=m_elements, n_k=n_k)
    bc, br = block_sizes(m_elements, d)
    return {"Bc": bc, "Br": br, "Tr": math.ceil(n / br), "Tc": math.ceil(n_k / bc)}


def fa1_sram_elements(m_elements: int, d: int, *, bc: int | None = None,
                      br: int | None = None) -> dict[str, int]:
    """What one iteration of Algorithm 1 holds on chip at once, tile by tile (full-size tiles).

    The paper's budget is K_j, V_j (Bc x d each), Q_i, O_i (Br x d each), S_ij (Br x Bc, which
    P~_ij overwrites in place) and the row statistics l_i, m_i (Br each). Lines 10-11 also need
    m~_ij, l~_ij, m_i^new, l_i^new (Br each); they are listed separately. P~_ij V_j is accumulated
    straight into O_i's tile, as a tensor-core MMA accumulates into its output registers.
    """
    _positive(m_elements=m_elements, d=d)
    default_bc, default_br = block_sizes(m_elements, d)
    bc = default_bc if bc is None else bc
    br = default_br if br is None else br
    _positive(bc=bc, br=br)
    return {"K_j": bc * d, "V_j": bc * d, "Q_i": br * d, "O_i": br * d, "S_ij": br * bc,
            "l_i, m_i": 2 * br, "line 10-11 row stats": 4 * br}


def fa1_paper_budget(m_elements: int, d: int) -> int:
    """One iteration's tiles with line 1's block sizes, added up (chapter 4's "paper's budget"):
    Q_i, O_i (Br d each), K_j, V_j (Bc d each), S_ij (Br Bc), plus l_i and m_i (2 Br)."""
    tiles = fa1_sram_elements(m_elements, d)
    return sum(v for k, v in tiles.items() if k != "line 10-11 row stats")


def fa1_hbm_elements(n: int, d: int, m_elements: int, *, n_k: int | None = None,
                     loop_order: str = "kv_outer", bc: int | None = None,
                     br: int | None = None) -> dict[str, dict[str, int]]:
    """Exact HBM reads and writes of Algorithm 1, by tensor: ``{"reads": {...}, "writes": {...}}``.

    Line 2 writes O, l, m once (initialisation). Line 6 reads K_j, V_j once per outer iteration
    (all of K and V once). Line 8 reads Q_i, O_i, l_i, m_i and lines 12-13 write O_i, l_i, m_i
    back at every (i, j): Tc times each. With ``loop_order="q_outer"`` (loops swapped, line 6
    moved into the inner loop, the rest unchanged) K and V are read Tr times instead.
    This is exactly what :func:`flashtext.tiled.algorithm1` records.
    """
    if loop_order not in LOOP_ORDERS:
        raise ValueError(f"loop_order must be one of {LOOP_ORDERS}, got {loop_order!r}")
    n_k = n if n_k is None else n_k
    grid = fa1_grid(n, d, m_elements, n_k)
    bc = grid["Bc"] if bc is None else bc
    br = grid["Br"] if br is None else br
    _positive(bc=bc, br=br)
    tr, tc = math.ceil(n / br), math.ceil(n_k / bc)
    kv_passes = 1 if loop_order == "kv_outer" else tr
    reads = {"Q": tc * n * d, "K": kv_passes * n_k * d, "V": kv_passes * n_k * d,
             "O": tc * n * d, "l": tc * n, "m": tc * n}
    writes = {"Q": 0, "K": 0, "V": 0, "O": (tc + 1) * n * d, "l": (tc + 1) * n, "m": (tc + 1) * n}
    return {"reads": reads, "writes": writes}


def fa1_hbm_total(n: int, d: int, m_elements: int, **kwargs) -> int:
    """Total HBM accesses (reads + writes, elements) of Algorithm 1; see :func:`fa1_hbm_elements`.

    Closed form (kv_outer, square): N d + 2N  +  2 N d  +  Tc (3 N d + 4 N).
    """
    counts = fa1_hbm_elements(n, d, m_elements, **kwargs)
    return sum(counts["reads"].values()) + sum(counts["writes"].values())


def fa1_hbm_four_step(n: int, d: int, m_elements: int) -> float:
    """A four-step estimate of Theorem 2's count, with Br = Bc = M/4d (line 1 without the cap at
    d): T = 4Nd/M blocks per axis, Tr Tc = 16 N^2 d^2 / M^2 iterations, M elements moved per
    iteration, so 16 N^2 d^2 / M in total."""
    _positive(n=n, d=d, m_elements=m_elements)
    return 16.0 * n * n * d * d / m_elements


def fa1_hbm_theta(n: int, d: int, m_elements: int) -> float:
    """Theorem 2's growth rate for FlashAttention, N^2 d^2 / M (constant factor 1)."""
    _positive(n=n, d=d, m_elements=m_elements)
    return float(n) * n * d * d / m_elements


def standard_attention_hbm_total(n: int, d: int) -> int:
    """Theorem 2's Theta(N d + N^2) for standard attention, exactly: 4 N d + 4 N^2."""
    return sum(standard_attention_hbm_elements(n, d).values())


def compulsory_hbm_elements(n: int, d: int, n_k: int | None = None) -> int:
    """What any exact attention algorithm must move: read Q, K, V once and write O once.

    This is why Proposition 3 holds: at M = N d the FA1 count is Theta(N d), which no algorithm
    can beat, so no algorithm does o(N^2 d^2 / M) accesses for every M in [d, N d].
    """
    n_k = n if n_k is None else n_k
    _positive(n=n, d=d, n_k=n_k)
    return 2 * n * d + 2 * n_k * d


def fa2_hbm_elements(n: int, d: int, block_m: int, n_k: int | None = None) -> dict[str, dict]:
    """HBM traffic of FlashAttention-2's schedule (outer loop over query blocks, O, l, m kept on
    chip): Q read once, K and V read once per query block (Tr = ceil(N / block_m) times), O
    written once, and one log-sum-exp per row written for the backward. No causal skipping.
    """
    n_k = n if n_k is None else n_k
    _positive(n=n, d=d, block_m=block_m, n_k=n_k)
    tr = math.ceil(n / block_m)
    return {"reads": {"Q": n * d, "K": tr * n_k * d, "V": tr * n_k * d},
            "writes": {"O": n * d, "lse": n}}


def attention_bytes(kind: str, n: int, d: int, *, batch: int = 1, heads: int = 1,
                    bytes_per_element: int = 2, m_elements: int | None = None) -> float:
    """Predicted HBM bytes of one forward pass over ``batch * heads`` heads.

    ``kind``: "standard" (Algorithm 0: 4Nd + 4N^2 per head), "compulsory" (read Q, K, V, write O
    once: 4Nd), or "fa1" (Algorithm 1's exact count; needs ``m_elements``).
    """
    _positive(batch=batch, heads=heads, bytes_per_element=bytes_per_element)
    if kind == "standard":
        per_head = standard_attention_hbm_total(n, d)
    elif kind == "compulsory":
        per_head = compulsory_hbm_elements(n, d)
    elif kind == "fa1":
        if m_elements is None:
            raise ValueError("kind='fa1' needs m_elements (the SRAM size M in elements)")
        per_head = fa1_hbm_total(n, d, m_elements)
    else:
        raise ValueError(f"kind must be 'standard', 'compulsory' or 'fa1', got {kind!r}")
    return float(per_head) * batch * heads * bytes_per_element


def fa1_crossover_m(n: int, d: int) -> int | None:
    """The smallest M (elements) at which Algorithm 1 moves fewer HBM elements than standard
    attention, or None if no M does (tiny N: even with one K/V block, Tc = 1, Algorithm 1's
    6Nd + 6N is not below 4Nd + 4N^2). Algorithm 1's count only falls as M grows
    (Tc = ceil(N / ceil(M / 4d)) never rises), so a binary search finds it. Roughly 3 d^2:
    the count is ~12 N^2 d^2 / M against standard attention's ~4 N^2."""
    _positive(n=n, d=d)
    target = standard_attention_hbm_total(n, d)
    lo, hi = 1, 4 * n * d  # from M = 4Nd on, Tc = 1 and the count stops falling
    if fa1_hbm_total(n, d, hi) >= target:
        return None
    if fa1_hbm_total(n, d, lo) < target:
        return lo
    while hi - lo > 1:  # invariant: count(lo) >= target > count(hi)
        mid = (lo + hi) // 2
        if fa1_hbm_total(n, d, mid) < target:
            hi = mid
        else:
            lo = mid
    return hi
