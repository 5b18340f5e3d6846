"""The launch configurations worth trying for each attention kernel: the search space of
``scripts/tune_kernels.py`` (which times them) and ``scripts/spill_report.py`` (which compiles
them and counts registers and spills). The winners become the table in
:mod:`flashtext.kernels.config`."""

from __future__ import annotations

import itertools

KERNELS = ("fwd", "bwd_dkdv", "bwd_dq")
TMA_CHOICES = ("off", "on", "both")


def candidates(kernel: str, d: int) -> list[tuple[int, int, int, int]]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages) worth trying for ``kernel`` at head dim ``d``."""
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
    if not isinstance(d, int) or d <= 0:
        raise ValueError(f"d must be a positive int, got {d!r}")
    if kernel == "fwd":
        blocks = [(64, 64), (128, 64), (128, 128), (64, 128)]
    elif kernel == "bwd_dkdv":  # BLOCK_N keys per program, loop over BLOCK_M query rows
        blocks = [(32, 128), (64, 128), (64, 64), (32, 64)]
    else:  # bwd_dq: BLOCK_M query rows per program, loop over BLOCK_N keys
        blocks = [(128, 32), (128, 64), (64, 64), (64, 32)]
    out = []
    for (bm, bn), warps, stages in itertools.product(blocks, (4, 8), (2, 3, 4)):
        if bm * bn < 64 * 128 and warps == 8 and not (kernel == "bwd_dkdv" and bn == 64):
            continue  # small tiles cannot feed 8 warps; but a dK/dV program holds two
            # BLOCK_N x d accumulators, and 8 warps halve the registers each thread needs for
            # them (scripts/spill_report.py: 64 x 64 tiles spill 1.7 KB with 4 warps, 0.2 with 8)
        if d >= 128 and stages == 4 and bm * bn >= 128 * 128:
            continue  # does not fit in shared memory
        out.append((bm, bn, warps, stages))
    return out


def with_tma(configs: list[tuple], tma: str) -> list[tuple]:
    """Each candidate with the tensor-descriptor flag (``KernelConfig.tma``) appended: "on"
    (True), "both" (False and True), or "off" (the candidates unchanged, four fields)."""
    if tma not in TMA_CHOICES:
        raise ValueError(f"tma must be one of {TMA_CHOICES}, got {tma!r}")
    if tma == "off":
        return configs
    flags = {"on": (True,), "both": (False, True)}[tma]
    return [(*c, flag) for c in configs for flag in flags]
