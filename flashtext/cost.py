"""Counting formulas: FLOPs, HBM traffic, block sizes, arithmetic intensity.

Counts are in *elements* unless a name says bytes; multiply by the dtype size (2 for fp16/bf16).
"""

from __future__ import annotations

import math


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


def arithmetic_intensity(flops: float, bytes_moved: float) -> float:
    """FLOPs per byte of memory traffic."""
    return flops / bytes_moved
