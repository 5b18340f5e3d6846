"""Chapter 6 reference solutions."""

import math


def fa1_hbm_bytes(n: int, d: int, m_elements: int, bytes_per_element: int) -> int:
    bc = math.ceil(m_elements / (4 * d))
    tc = math.ceil(n / bc)
    elements = (n * d + 2 * n) + 2 * n * d + tc * (3 * n * d + 4 * n)  # line 2, line 6, lines 8-13
    return elements * bytes_per_element


def predict_dram_bytes(impl: str, n: int, d: int, batch: int, heads: int,
                       bytes_per_element: int) -> float:
    per_head = 4 * n * d + 4 * n * n if impl == "naive" else 4 * n * d
    return per_head * batch * heads * bytes_per_element


def crossover_m(n: int, d: int):
    standard = 4 * n * d + 4 * n * n

    def fa1(m):
        return fa1_hbm_bytes(n, d, m, 1)

    if fa1(4 * n * d) >= standard:
        return None
    lo, hi = 0, 4 * n * d  # fa1(hi) < standard; lo is "before the first M"
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fa1(mid) < standard:
            hi = mid
        else:
            lo = mid
    return hi
