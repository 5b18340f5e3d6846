"""Chapter 10's exercises: the key range of a causal query block, and a FlashAttention forward
kernel of your own, launched on ragged shapes under the interpreter (compiled on a GPU)."""

from __future__ import annotations

import math

import numpy as np
import torch

from flashtext import reference as ref
from flashtext.exercises.ch09 import (
    SENTINEL,
    _device,
    _launch,
    _require_kernel,
    _yours_vs_expected,
    exact_fp32_dots,
    tf32_tolerance,
)
from flashtext.exercises.core import ExerciseFailed, describe, exercise, expect
from flashtext.kernels.plan import forward_program
from flashtext.reference import causal_mask

# ------------------------------------------------------------------------------ 10.1 key range


def _visible(start_m: int, n_q: int, n_k: int, block_m: int) -> np.ndarray:
    """(rows of the block, n_k) visibility of the real rows of one query block (causal)."""
    rows = slice(start_m, min(start_m + block_m, n_q))
    return causal_mask(n_q, n_k)[rows]


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
    cases = [(256, 256, 64, 64), (256, 256, 64, 32), (256, 256, 32, 64), (100, 300, 32, 32),
             (300, 100, 32, 16), (1, 1000, 64, 64), (1000, 1, 16, 16), (17, 17, 16, 16),
             (129, 129, 64, 32), (40, 9, 16, 16)]
    for n_q, n_k, bm, bn in cases:
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
    """(description, q, k, v, causal, BLOCK_M, BLOCK_N); tensors (heads, N, d) fp32."""
    def r(*shape, scale=1.0):
        return torch.randn(*shape, generator=g) * scale

    yield "N_q = N_k = 64, d=16, BLOCK 16 x 16", r(2, 64, 16), r(2, 64, 16), r(2, 64, 16), \
        False, 16, 16
    yield "ragged: N_q=17, N_k=100, d=32, BLOCK 16 x 32", r(2, 17, 32), r(2, 100, 32), \
        r(2, 100, 32), False, 16, 32
    yield "ragged: N_q=100, N_k=17, d=16, BLOCK 32 x 16", r(2, 100, 16), r(2, 17, 16), \
        r(2, 17, 16), False, 32, 16
    yield "N=1 (one query, one key)", r(1, 1, 16), r(1, 1, 16), r(1, 1, 16), False, 16, 16
    yield "scores near +-1000 (q scaled by 60), N=50", r(2, 50, 16, scale=60.0), \
        r(2, 50, 16, scale=3.0), r(2, 50, 16), False, 16, 16
    yield "causal, N_q = N_k = 70, BLOCK 32 x 16", r(2, 70, 16), r(2, 70, 16), r(2, 70, 16), \
        True, 32, 16
    yield "causal, N_q=20 < N_k=90 (bottom-right: the last query sees every key)", \
        r(2, 20, 16), r(2, 90, 16), r(2, 90, 16), True, 16, 32
    yield ("causal, N_q=45 > N_k=12 (the first 33 queries see no key: O = 0, lse = -inf)",
           r(2, 45, 16), r(2, 12, 16), r(2, 12, 16), True, 16, 16)


@exercise(
    "ch10.attention_kernel",
    "A FlashAttention forward kernel: O and lse, ragged, causal bottom-right",
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
    _require_kernel(kernel)
    with exact_fp32_dots(kernel):
        _check_attention_kernel(kernel)


def _check_attention_kernel(kernel) -> None:
    import triton

    g = torch.Generator().manual_seed(10)
    dev = _device()
    for case, q, k, v, causal, bm, bn in _fwd_cases(g):
        h, n_q, d = q.shape
        n_k = k.shape[1]
        sm_scale = 1.0 / math.sqrt(d)
        q, k, v = (t.to(dev) for t in (q, k, v))
        o_buf = torch.full((h, n_q + 5, d), SENTINEL, device=dev)
        o = o_buf[:, :n_q]
        lse = torch.full((h, n_q), SENTINEL, device=dev)
        _launch(kernel, (triton.cdiv(n_q, bm), h), q, k, v, o, lse, sm_scale,
                q.stride(0), k.stride(0), o.stride(0), lse.stride(0), n_q, n_k,
                HEAD_DIM=d, BLOCK_M=bm, BLOCK_N=bn, CAUSAL=causal)
        want_o, want_lse = attention_spec(q, k, v, causal, sm_scale)
        got_o = o.cpu().numpy().astype(np.float64)
        got_lse = lse.cpu().numpy().astype(np.float64)
        # fp32 rounds a score s to within ~u|s|, so P (and O) carry a relative error of a few
        # u * max|s|: 2e-4 at scores of 1000, 1e-6 at scores of 10
        s_max = float(np.abs(ref.scores(q, k, scale=sm_scale)).max())
        _yours_vs_expected(got_o, want_o, case, "O", rtol=tf32_tolerance(1e-4),
                           atol=tf32_tolerance(1e-5 + 2e-7 * s_max))
        _yours_vs_expected(got_lse, want_lse, case, "lse (natural log)",
                           rtol=tf32_tolerance(1e-5), atol=tf32_tolerance(1e-5))
        if not bool((o_buf[:, n_q:] == SENTINEL).all()):
            raise ExerciseFailed(f"{case}: your kernel wrote O rows past N_Q={n_q}: mask the "
                                 "store with offs_m < N_Q.")
