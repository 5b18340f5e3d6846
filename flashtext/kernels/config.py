"""Launch parameters of the attention kernels, chosen in one place: the searched table.

Every kernel in :mod:`flashtext.kernels.forward` and :mod:`flashtext.kernels.backward` takes
``BLOCK_M``, ``BLOCK_N`` (compile-time constants) and ``num_warps``, ``num_stages`` (launch
options) from :func:`launch_config`; :mod:`flashtext.kernels.launcher` launches them. Under the
CPU interpreter there is exactly one configuration (the interpreter runs a program at a time in
NumPy: bigger tiles mean fewer programs and a faster run, and autotuning with several
configurations fails there). On a GPU this is the hook for tuning:
replace the table, or return the winner of a benchmark; the kernels themselves do not change.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from flashtext import _boot

MAX_HEAD_DIM = 256


@dataclass(frozen=True)
class KernelConfig:
    """One launch configuration: tile sizes (rows of Q x rows of K/V) and launch options."""

    BLOCK_M: int
    BLOCK_N: int
    num_warps: int = 4
    num_stages: int = 2
    # fetch the tiles of the inner loop with the copy engine (TMA tensor descriptors) where
    # the tensors' layout allows it (flashtext.kernels.forward.tma_ok); else plain loads
    tma: bool = False

    def smaller(self) -> KernelConfig | None:
        """The next configuration to try when this one does not fit in shared memory/registers."""
        if self.num_stages > 1:
            return replace(self, num_stages=self.num_stages - 1)
        if self.BLOCK_N > 16:
            return replace(self, BLOCK_N=self.BLOCK_N // 2, num_stages=2)
        if self.BLOCK_M > 16:
            return replace(self, BLOCK_M=self.BLOCK_M // 2, num_stages=2)
        return None


def block_d(head_dim: int) -> int:
    """The head dimension as the kernels tile it: the next power of two, at least 16.

    ``tl.arange`` needs a power of two and ``tl.dot`` needs every side >= 16; the extra columns
    are masked on load (read as 0, which adds nothing to q . k) and never stored.
    """
    return max(16, 1 << (head_dim - 1).bit_length())


def launch_config(kernel: str, head_dim: int, dtype_bytes: int, causal: bool, n_q: int,
            n_k: int) -> KernelConfig:
    """Pick BLOCK_M, BLOCK_N, num_warps, num_stages for ``kernel`` in {"fwd", "bwd_dkdv",
    "bwd_dq", "bwd_pre"}.

    fp16/bf16 with head_dim <= 128 use :data:`TUNED`, the winners of ``scripts/tune_kernels.py``
    on an H200 (``flashtext/data/tune_h200.json``; ``tests/test_kernels_config.py`` checks the
    table against it), except that a short forward takes :data:`FWD_SHORT`
    (:func:`uses_short_forward`). Everything else (fp32, head_dim > 128) keeps a plain,
    conservative table that fits one SM's shared memory; the launcher also steps down through
    :meth:`KernelConfig.smaller` if the compiler reports that a configuration does not fit.
    The backward's winners did not depend on causal or N enough to key on (within 2.1% at
    N = 1k, 2k and 4k).
    """
    del n_q  # which tiles a causal program computes depends on N_k (see uses_short_forward)
    if _boot.INTERPRETING:  # descriptors on: the CPU tests run the code path the H200 runs
        return KernelConfig(BLOCK_M=32, BLOCK_N=32, num_warps=1, num_stages=1, tma=True)
    d = block_d(head_dim)
    if kernel == "bwd_pre":
        return KernelConfig(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=1)
    if dtype_bytes == 2 and d <= 128:
        if kernel == "fwd" and uses_short_forward(d, causal, n_k):
            return FWD_SHORT
        return TUNED[(kernel, 64 if d <= 64 else 128)]
    big = d * dtype_bytes  # bytes of one row of a tile
    if big <= 128:  # d <= 32 in fp32
        blocks = (64, 64) if kernel != "fwd" else (128, 64)
    elif big <= 256:
        blocks = (64, 64) if kernel == "fwd" else (64, 32)
    else:
        blocks = (64, 32) if kernel == "fwd" else (32, 32)
    warps = 8 if blocks[0] * d >= 128 * 64 else 4
    return KernelConfig(BLOCK_M=blocks[0], BLOCK_N=blocks[1], num_warps=warps, num_stages=2)


# (kernel, head_dim rounded up to 64 or 128) -> the fastest configuration measured on an H200,
# fp16, batch * N = 16k tokens, heads * d = 2048, N = 4096 (scripts/tune_kernels.py; tiles first
# searched with plain loads, flashtext/data/tune_h200.json, then with tensor descriptors,
# tune_h200_tma.json, which won everywhere). For the dK/dV kernel BLOCK_N is the key block a
# program owns and BLOCK_M the query rows it loops over.
TUNED: dict[tuple[str, int], KernelConfig] = {
    ("fwd", 64): KernelConfig(128, 128, num_warps=4, num_stages=3, tma=True),
    ("fwd", 128): KernelConfig(128, 128, num_warps=8, num_stages=3, tma=True),
    ("bwd_dkdv", 64): KernelConfig(32, 128, num_warps=4, num_stages=3, tma=True),
    ("bwd_dkdv", 128): KernelConfig(64, 64, num_warps=4, num_stages=2, tma=True),
    ("bwd_dq", 64): KernelConfig(128, 64, num_warps=4, num_stages=3, tma=True),
    ("bwd_dq", 128): KernelConfig(128, 64, num_warps=8, num_stages=3, tma=True),
}


# A short forward runs 64 x 64 tiles. With B x B tiles a causal pass computes
# T(T+1)/2 tiles for T = N/B, 1 + B/N times the work of the triangle, and the diagonal tiles
# pay for the mask besides: halving B from 128 saves 1 - (1 + 64/N)/(1 + 128/N) of the work,
# 10% at N = 512, 6% at 1k, 3% at 2k, 1.5% at 4k. Against that, a 128-row tile reuses each K/V
# tile for twice the rows, which wins 6-20% at 16k. Measured on the H200 (fp16 and bf16,
# tune_h200_fwd_n512 / _n1024 / _n2048 / tune_h200_tma / _fwd_n16384), 64 x 64 wins causal up
# to 2k (by 14-25% at 512, 5-13% at 1k, 0.3-3% at 2k) and loses from 4k (by 1-10%); without the
# mask it wins only at d = 128 and N = 512 (by 9-12%; at 1k the table is within 2% of the best).
FWD_SHORT = KernelConfig(64, 64, num_warps=4, num_stages=3, tma=True)
SHORT_CAUSAL_MAX_N = 2048
SHORT_MAX_N_D128 = 512


def uses_short_forward(d: int, causal: bool, n_k: int) -> bool:
    """Whether a forward over ``n_k`` keys (head dim ``d`` as tiled) takes :data:`FWD_SHORT`."""
    return n_k <= (SHORT_CAUSAL_MAX_N if causal else SHORT_MAX_N_D128 if d > 64 else 0)
