"""Chapter 10's exercises: the key range of a causal query block, and a FlashAttention forward
kernel of your own, launched on ragged shapes under the interpreter (compiled on a GPU)."""

from __future__ import annotations

import math

import numpy as np
import torch

from flashtext import reference as ref
from flashtext.exercises.core import ExerciseFailed, describe, exercise, expect
from flashtext.exercises.kernel_checks import (
    Sandbox,
    compare,
    exact_fp32_dots,
    require_kernel,
    tf32_tolerance,
)
from flashtext.kernels.plan import forward_program
from flashtext.reference import causal_mask

# ------------------------------------------------------------------------------ 10.1 key range


def _visible(start_m: int, n_q: int, n_k: int, block_m: int) -> np.ndarray:
    """(rows of the block, n_k) visibility of the real rows of one query block (causal)."""
    rows = slice(start_m, min(start_m + block_m, n_q))
    return causal_mask(n_q, n_k)[rows]


# (n_q, n_k, BLOCK_M, BLOCK_N). The last five put the block boundaries on the diagonal's edges:
# the first row of a block sees exactly a multiple of BLOCK_N keys ((64, 79), (48, 95)), and a
# block's first row sees all n_k keys with n_k a multiple of BLOCK_N ((17, 64), (33, 96)), so
# an off-by-one in "keys the first row sees" (i + offset, not i + offset + 1) shows.
KEY_RANGE_CASES = [(256, 256, 64, 64), (256, 256, 64, 32), (256, 256, 32, 64), (100, 300, 32, 32),
                   (300, 100, 32, 16), (1, 1000, 64, 64), (1000, 1, 16, 16), (17, 17, 16, 16),
                   (129, 129, 64, 32), (40, 9, 16, 16), (64, 79, 16, 16), (48, 95, 16, 16),
                   (17, 64, 16, 16), (33, 96, 32, 32), (40, 72, 8, 8)]


@exercise(
    "ch10.key_range",
    "The key tiles one causal query block needs: (mid, hi)",
    hints=(
        "Query i sees key j when j <= i + (n_k - n_q) and j < n_k. The block's rows are "
        "start_m ... start_m + BLOCK_M - 1.",
        "hi: one past the last key the block's LAST row sees, clamped to [0, n_k].",
        "mid: the keys the block's FIRST row sees, min(n_k, start_m + offset + 1) clamped at 0, "
        "rounded DOWN to a multiple of BLOCK_N: every tile before it is seen in full by every "
        "row, and is fully inside K.",
        "Check a block whose rows see no key at all (n_q > n_k): both are 0.",
    ),
)
def check_key_range(fn) -> None:
    for n_q, n_k, bm, bn in KEY_RANGE_CASES:
        for start_m in range(0, n_q, bm):
            case = (f"start_m={start_m}, n_q={n_q}, n_k={n_k}, BLOCK_M={bm}, BLOCK_N={bn}, "
                    "causal")
            got = fn(start_m, n_q, n_k, bm, bn)
            expect(isinstance(got, tuple) and len(got) == 2,
                   f"{case}: return a pair (mid, hi), got {describe(got)}")
            mid, hi = (int(x) for x in got)
            vis = _visible(start_m, n_q, n_k, bm)
            last_needed = int(np.max(np.nonzero(vis.any(axis=0))[0], initial=-1)) + 1
            want = forward_program(start_m, n_q, n_k, bm, bn, True)
            expect(mid % bn == 0, f"{case}: mid={mid} is not a multiple of BLOCK_N={bn}; the "
                                  "unmasked loop steps over whole tiles.")
            expect(0 <= mid <= hi <= n_k, f"{case}: expected 0 <= mid <= hi <= n_k, got "
                                          f"mid={mid}, hi={hi}.")
            if hi < last_needed:
                raise ExerciseFailed(f"{case}: hi={hi} skips key {hi}, which row "
                                     f"{start_m + int(np.argmax(vis[:, hi]))} sees (keys up to "
                                     f"{last_needed - 1} are needed).")
            if mid:
                full = vis[:, :mid].all()
                expect(bool(full), f"{case}: mid={mid} puts a tile that needs the mask in the "
                       f"unmasked loop: row {start_m} sees only keys < "
                       f"{int(vis[0].sum())}.")
            expect(hi == want.hi, f"{case}: hi={hi} is correct but loads key tiles nobody in "
                   f"the block sees; the tight bound is {want.hi}.")
            expect(mid == want.mid, f"{case}: mid={mid} is correct but masks tiles that need no "
                   f"mask; the largest valid mid is {want.mid}.")


# ------------------------------------------------------------------ 10.2 the forward kernel


def attention_spec(q, k, v, causal: bool, sm_scale: float):
    """(O, lse) of softmax(sm_scale q k^T [causal, bottom-right]) v, lse in natural log."""
    o, lse = ref.attention(q, k, v, causal=causal, scale=sm_scale, return_lse=True)
    return o, lse


def _fwd_cases(g: torch.Generator):
    """(description, q, k, v, causal, BLOCK_M, BLOCK_N, sm_scale); tensors (heads, N, d) fp32.
    The tests of the checker assert that every case has the property its description names."""
    def r(*shape, scale=1.0):
        return torch.randn(*shape, generator=g) * scale

    def tau(d):
        return 1.0 / math.sqrt(d)

    yield "N_q = N_k = 64, d=16, BLOCK 16 x 16", r(2, 64, 16), r(2, 64, 16), r(2, 64, 16), \
        False, 16, 16, tau(16)
    yield "ragged: N_q=17, N_k=100, d=32, BLOCK 16 x 32", r(2, 17, 32), r(2, 100, 32), \
        r(2, 100, 32), False, 16, 32, tau(32)
    yield "ragged: N_q=100, N_k=17, d=16, BLOCK 32 x 16", r(2, 100, 16), r(2, 17, 16), \
        r(2, 17, 16), False, 32, 16, tau(16)
    yield "N=1 (one query, one key)", r(1, 1, 16), r(1, 1, 16), r(1, 1, 16), False, 16, 16, \
        tau(16)
    yield ("scores in the hundreds (q scaled by 60, k by 3; exp(s) overflows fp32), N=50",
           r(2, 50, 16, scale=60.0), r(2, 50, 16, scale=3.0), r(2, 50, 16), False, 16, 16,
           tau(16))
    yield ("every score below -150 (q near +7, k near -7): exp(s) is 0 in fp32 for every key, "
           "so the running max must start at -inf, not 0; N=40, BLOCK 16 x 16",
           7 + r(2, 40, 16, scale=0.2), -7 + r(2, 40, 16, scale=0.2), r(2, 40, 16), False, 16,
           16, tau(16))
    levels = torch.tensor([40.0, -40.0, 0.0, 25.0, -30.0]).repeat(8)[:, None]
    yield ("rows hundreds apart in one query block (scores near +160 and -160): each row needs "
           "its own running max, not one per tile; N_q=40, N_k=24, BLOCK 16 x 16",
           (levels + r(40, 16, scale=0.2)).expand(2, 40, 16).contiguous(),
           1 + r(2, 24, 16, scale=0.2), r(2, 24, 16), False, 16, 16, tau(16))
    yield ("sm_scale=0.3 (not 1/sqrt(HEAD_DIM)): use the sm_scale you are given; N=33",
           r(2, 33, 16), r(2, 33, 16), r(2, 33, 16), False, 16, 16, 0.3)
    yield "causal, N_q = N_k = 70, BLOCK 32 x 16", r(2, 70, 16), r(2, 70, 16), r(2, 70, 16), \
        True, 32, 16, tau(16)
    yield "causal, N_q=20 < N_k=90 (bottom-right: the last query sees every key)", \
        r(2, 20, 16), r(2, 90, 16), r(2, 90, 16), True, 16, 32, tau(16)
    yield "causal, N_q=40 < N_k=96 (N_k a multiple of BLOCK_N=32), BLOCK 16 x 32", \
        r(2, 40, 16), r(2, 96, 16), r(2, 96, 16), True, 16, 32, tau(16)
    yield ("causal, N_q=45 > N_k=12 (the first 33 queries see no key: O = 0, lse = -inf)",
           r(2, 45, 16), r(2, 12, 16), r(2, 12, 16), True, 16, 16, tau(16))


@exercise(
    "ch10.attention_kernel",
    "A FlashAttention forward kernel: O and lse, ragged, causal bottom-right",
    kernel=True,
    time_limit=180.0,
    hints=(
        "start_m = tl.program_id(0) * BLOCK_M; head = tl.program_id(1); move every pointer by "
        "head * stride_h. Load the Q tile once (mask rows >= N_Q, other=0).",
        "m_i = -inf, l_i = 0, acc = 0 (BLOCK_M x HEAD_DIM, fp32). Loop start_n over range(0, "
        "N_K, BLOCK_N): load K and V tiles with the mask offs_n < N_K (other=0).",
        "qk = tl.dot(q, tl.trans(k)) * sm_scale; set hidden scores to -inf with tl.where: keys "
        ">= N_K, and if CAUSAL keys j > i + (N_K - N_Q).",
        "m_new = max(m_i, rowmax(qk)); m_safe = where(m_new == -inf, 0, m_new); p = exp(qk - "
        "m_safe); alpha = exp(m_i - m_safe); l_i = l_i * alpha + rowsum(p); acc = acc * alpha "
        "+ p @ v; m_i = m_new.",
        "After the loop: O = acc / l_i and lse = m_i + log(l_i) for rows with l_i > 0; O = 0 "
        "and lse = -inf where l_i == 0. Store both with the row mask.",
        "On a GPU, tl.dot rounds fp32 inputs to TF32 unless you pass input_precision='ieee'; "
        "the checker compiles your kernel with exact fp32 dots (TRITON_F32_DEFAULT=ieee), "
        "because TF32 moves a score near 1000 by about 0.5.",
    ),
)
def check_attention_kernel(kernel) -> None:
    require_kernel(kernel)
    with exact_fp32_dots(kernel):
        _check_attention_kernel(kernel)


def _check_attention_kernel(kernel) -> None:
    import triton

    g = torch.Generator().manual_seed(10)
    heads = ("head", "row", "feature")
    for case, q, k, v, causal, bm, bn, sm_scale in _fwd_cases(g):
        h, n_q, d = q.shape
        n_k = k.shape[1]
        want_o, want_lse = attention_spec(q, k, v, causal, sm_scale)
        # fp32 rounds a score s to within ~u|s|, so P (and O) carry a relative error of a few
        # u * max|s|: 2e-4 at scores of 1000, 1e-6 at scores of 10
        s_max = float(np.abs(ref.scores(q, k, scale=sm_scale)).max())
        # every tensor's head stride is longer than its rows (a block of poison between heads),
        # and each one's differs: a kernel that uses N * HEAD_DIM, or another tensor's stride,
        # reads poison or writes out of bounds
        box = Sandbox(case)
        q_in = box.input("Q", q, pad=(0, bm, 0), dims=heads)
        k_in = box.input("K", k, pad=(0, bn + 2, 0), dims=heads)
        v_in = box.input("V", v, pad=(0, bn + 2, 0), dims=heads)  # V shares K's stride
        o = box.output("O", (h, n_q, d), pad=(0, bm + 3, 0), dims=heads)
        lse = box.output("LSE", (h, n_q), pad=(0, bm + 5), dims=("head", "row"))
        case = (f"{case} (head strides Q {q_in.stride(0)}, K and V {k_in.stride(0)}, O "
                f"{o.stride(0)}, LSE {lse.stride(0)})")
        box.case = case
        box.launch(kernel, (triton.cdiv(n_q, bm), h), q_in, k_in, v_in, o, lse, sm_scale,
                   q_in.stride(0), k_in.stride(0), o.stride(0), lse.stride(0), n_q, n_k,
                   HEAD_DIM=d, BLOCK_M=bm, BLOCK_N=bn, CAUSAL=causal)
        compare(o, want_o, case, "O", rtol=tf32_tolerance(1e-4),
                atol=tf32_tolerance(1e-5 + 2e-7 * s_max))
        compare(lse, want_lse, case, "lse (natural log)", rtol=tf32_tolerance(1e-5),
                atol=tf32_tolerance(1e-5))
