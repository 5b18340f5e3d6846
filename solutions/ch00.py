"""Chapter 0 reference solutions."""


def score_matrix_bytes(batch: int, heads: int, n: int, bytes_per_element: int) -> int:
    # one N x N score matrix per (batch element, head)
    return batch * heads * n * n * bytes_per_element
