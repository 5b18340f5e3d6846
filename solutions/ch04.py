"""Chapter 4 reference solutions."""

import math


def block_sizes_for_gpu(smem_bytes: int, d: int, bytes_per_element: int) -> tuple[int, int]:
    m = smem_bytes // bytes_per_element  # line 1 counts elements
    bc = math.ceil(m / (4 * d))
    return bc, min(bc, d)


def largest_head_dim(m_elements: int) -> int:
    best = 0
    for d in range(1, m_elements // 4 + 2):  # at d >= M/4 the four d-wide tiles alone overflow
        bc = math.ceil(m_elements / (4 * d))
        br = min(bc, d)
        if 2 * br * d + 2 * bc * d + br * bc + 2 * br <= m_elements:
            best = d
    return best


def swapped_loops(n: int, d: int, m_elements: int) -> dict[str, int]:
    bc = math.ceil(m_elements / (4 * d))
    br = min(bc, d)
    tr, tc = math.ceil(n / br), math.ceil(n / bc)
    # line 6 now runs once per (i, j): K and V are read Tr times; line 8 is unchanged
    return {"Q": tc * n * d, "K": tr * n * d, "V": tr * n * d, "O": tc * n * d,
            "l": tc * n, "m": tc * n}
