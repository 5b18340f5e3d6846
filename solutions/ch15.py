"""Chapter 15 reference solutions."""

import numpy as np


def window_keys(i: int, n_q: int, n_k: int, left: int, right: int, causal: bool) -> range:
    diag = i + n_k - n_q  # bottom-right alignment: query i sits at key i + off
    if causal:
        right = 0
    first = 0 if left < 0 else max(diag - left, 0)
    last = n_k - 1 if right < 0 else min(diag + right, n_k - 1)
    return range(first, max(last + 1, first))


def gqa_head_map(heads: int, heads_kv: int) -> list[int]:
    if heads_kv < 1 or heads % heads_kv:
        raise ValueError(f"heads ({heads}) must be a multiple of heads_kv ({heads_kv}) >= 1")
    group = heads // heads_kv
    return [h // group for h in range(heads)]


def varlen_rows(cu_seqlens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    rows = np.arange(cu_seqlens[-1])
    seq = np.searchsorted(cu_seqlens, rows, side="right") - 1  # empty sequences own no row
    return seq, rows - cu_seqlens[seq]


def paged_gather(pages: np.ndarray, block_table: np.ndarray, seqlen: int) -> np.ndarray:
    block_size = pages.shape[1]
    t = np.arange(seqlen)
    return pages[block_table[t // block_size], t % block_size]
