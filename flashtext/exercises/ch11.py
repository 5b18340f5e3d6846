"""Chapter 11's exercises: the query range of a dK/dV program, and a dQ kernel of your own."""

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
from flashtext.kernels.plan import key_program
from flashtext.reference import causal_mask

# ---------------------------------------------------------------------------- 11.1 query range


# (n_q, n_k, BLOCK_M, BLOCK_N). The last ones put block boundaries on the diagonal's edges: the
# first row that sees a block's first or last key is a multiple of BLOCK_M ((79, 64), (95, 48),
# (60, 60) with BLOCK_M = BLOCK_N), and a ragged last key block ((50, 37)) must use its last
# real key, not the padded one, so off-by-ones in either bound show.
QUERY_RANGE_CASES = [(256, 256, 64, 64), (256, 256, 64, 32), (256, 256, 32, 64),
                     (100, 300, 32, 32), (300, 100, 32, 16), (1, 1000, 64, 64), (1000, 1, 16, 16),
                     (17, 17, 16, 16), (129, 129, 64, 32), (40, 9, 16, 16), (79, 64, 16, 16),
                     (95, 48, 16, 16), (60, 60, 8, 8), (50, 37, 16, 8), (64, 100, 16, 16)]


@exercise(
    "ch11.query_range",
    "The query tiles one causal key block needs: (lo, mid)",
    hints=(
        "Query i sees key j when j <= i + (n_k - n_q). Turn it around: key j is seen by the "
        "rows i >= j - (n_k - n_q).",
        "lo: the first row that sees the block's FIRST key start_n, clamped at 0 and rounded "
        "DOWN to a multiple of BLOCK_M (tiles before it see none of these keys).",
        "mid: the first row that sees the block's LAST real key, min(start_n + BLOCK_N, n_k) - "
        "1, clamped at 0 and rounded UP to a multiple of BLOCK_M (and never below lo): every "
        "tile from there on sees all the keys.",
    ),
)
def check_query_range(fn) -> None:
    for n_q, n_k, bm, bn in QUERY_RANGE_CASES:
        vis = causal_mask(n_q, n_k)
        for start_n in range(0, n_k, bn):
            case = (f"start_n={start_n}, n_q={n_q}, n_k={n_k}, BLOCK_M={bm}, BLOCK_N={bn}, "
                    "causal")
            got = fn(start_n, n_q, n_k, bm, bn)
            expect(isinstance(got, tuple) and len(got) == 2,
                   f"{case}: return a pair (lo, mid), got {describe(got)}")
            lo, mid = (int(x) for x in got)
            cols = vis[:, start_n:min(start_n + bn, n_k)]
            plan = key_program(start_n, n_q, n_k, bm, bn, True)
            # the kernel's plan may stop mid at N_q when no full tile remains; the exercise
            # asks for whole tiles, which is the same bound rounded up (no rows lie between)
            want_lo, want_mid = plan.lo, -(-plan.mid // bm) * bm
            expect(lo % bm == 0 and mid % bm == 0,
                   f"{case}: lo={lo} and mid={mid} must be multiples of BLOCK_M={bm}.")
            expect(0 <= lo <= mid, f"{case}: expected 0 <= lo <= mid, got lo={lo}, mid={mid}.")
            first_row = int(np.argmax(cols.any(axis=1)))
            if lo > first_row:
                raise ExerciseFailed(f"{case}: lo={lo} skips row {first_row}, which sees key "
                                     f"{start_n + int(np.argmax(cols[first_row]))}.")
            if mid < n_q and not cols[mid:].all():
                row = mid + int(np.argmin(cols[mid:].all(axis=1)))
                raise ExerciseFailed(f"{case}: mid={mid} runs row {row} without the mask, but "
                                     f"it does not see all of keys {start_n}.."
                                     f"{min(start_n + bn, n_k) - 1}.")
            expect(lo == want_lo, f"{case}: lo={lo} is correct but visits query tiles that see "
                   f"none of these keys; the tight bound is {want_lo}.")
            expect(mid == want_mid, f"{case}: mid={mid} is correct but masks tiles that need no "
                   f"mask; the smallest valid mid is {want_mid}.")


# ------------------------------------------------------------------------------ 11.2 dQ kernel


def dq_spec(q, k, v, do, causal: bool, sm_scale: float) -> np.ndarray:
    """dQ of sum(O * dO), O = softmax(sm_scale q k^T [causal, bottom-right]) v."""
    return ref.attention_backward(q, k, v, do, causal=causal, scale=sm_scale)[0]


def _dq_cases(g: torch.Generator):
    """(description, q, k, v, do, causal, BLOCK_M, BLOCK_N, sm_scale); tensors (heads, N, d)
    fp32. The tests of the checker assert that every case has the property its description
    names."""
    def r(*shape, scale=1.0):
        return torch.randn(*shape, generator=g) * scale

    def qkvdo(n_q, n_k, d, q_scale=1.0):
        return r(2, n_q, d, scale=q_scale), r(2, n_k, d), r(2, n_k, d), r(2, n_q, d)

    def tau(d):
        return 1.0 / math.sqrt(d)

    yield "N_q = N_k = 64, d=16, BLOCK 16 x 16", *qkvdo(64, 64, 16), False, 16, 16, tau(16)
    yield "ragged: N_q=17, N_k=100, d=32, BLOCK 16 x 32", *qkvdo(17, 100, 32), False, 16, 32, \
        tau(32)
    yield "ragged: N_q=100, N_k=17, d=16, BLOCK 32 x 16", *qkvdo(100, 17, 16), False, 32, 16, \
        tau(16)
    yield ("scores above 100 (q scaled by 30): exp(s) alone overflows fp32, exp(s - lse) does "
           "not; N=48, BLOCK 16 x 16", *qkvdo(48, 48, 16, q_scale=30.0), False, 16, 16, tau(16))
    # every score near 100: q and k share a large common direction. exp(s) overflows for every
    # key while the softmax stays spread, so dQ is far from 0 (in the case above the rows that
    # overflow are one-hot, and a one-hot softmax has almost no gradient to get wrong)
    common = torch.ones(16) * 5.0
    q, k = common + r(2, 48, 16, scale=0.2), common + r(2, 48, 16, scale=0.3)
    yield ("scores above 100 for every key, close together (q and k share a common direction): "
           "exp(s) overflows everywhere, exp(s - lse) nowhere; N=48, BLOCK 16 x 16",
           q, k, r(2, 48, 16), r(2, 48, 16), False, 16, 16, tau(16))
    yield ("sm_scale=0.3 (not 1/sqrt(HEAD_DIM)): use the sm_scale you are given; N=33",
           *qkvdo(33, 33, 16), False, 16, 16, 0.3)
    yield "causal, N_q = N_k = 70, BLOCK 32 x 16", *qkvdo(70, 70, 16), True, 32, 16, tau(16)
    yield "causal, N_q=20 < N_k=90", *qkvdo(20, 90, 16), True, 16, 32, tau(16)
    yield ("causal, N_q=45 > N_k=12 (the first 33 queries see no key: lse = -inf, dQ = 0)",
           *qkvdo(45, 12, 16), True, 16, 16, tau(16))


@exercise(
    "ch11.dq_kernel",
    "The dQ kernel: one program per query block, P rebuilt from lse",
    kernel=True,
    time_limit=180.0,
    hints=(
        "Load the Q and dO tiles, and lse and delta for the block's rows, once. dq = 0 "
        "(BLOCK_M x HEAD_DIM, fp32). Loop over key tiles like the forward kernel.",
        "P = exp(sm_scale * q k^T - lse[:, None]): lse already normalises, no running max. Hide "
        "what the row cannot see (keys >= N_K; causal keys j > i + N_K - N_Q) by setting the "
        "score to -inf BEFORE the exp.",
        "dP = dO V^T; dS = P * (dP - delta[:, None]); dq += dS K.",
        "After the loop: dQ = sm_scale * dq. A row with lse = -inf saw no key: its dQ must be 0 "
        "(not NaN): with the scores set to -inf first, exp(-inf - (-inf)) is NaN, so use "
        "tl.where(lse == float('-inf'), float('inf'), lse) as the row's normaliser.",
    ),
)
def check_dq_kernel(kernel) -> None:
    require_kernel(kernel)
    with exact_fp32_dots(kernel):
        _check_dq_kernel(kernel)


def _check_dq_kernel(kernel) -> None:
    import triton

    g = torch.Generator().manual_seed(11)
    heads = ("head", "row", "feature")
    for case, q, k, v, do, causal, bm, bn, sm_scale in _dq_cases(g):
        h, n_q, d = q.shape
        n_k = k.shape[1]
        o, lse = ref.attention(q, k, v, causal=causal, scale=sm_scale, return_lse=True)
        delta = (o * do.double().numpy()).sum(-1)
        want = dq_spec(q, k, v, do, causal, sm_scale)
        s_max = float(np.abs(ref.scores(q, k, scale=sm_scale)).max())
        # Q and dO share stride_qh, K and V stride_kh; each head stride is longer than the rows
        # (poison between heads), and dQ's differs from Q's. LSE and DELTA are contiguous, as
        # the stub promises, inside poison.
        box = Sandbox(case)
        q_in = box.input("Q", q, pad=(0, bm, 0), dims=heads)
        do_in = box.input("DO", do, pad=(0, bm, 0), dims=heads)
        k_in = box.input("K", k, pad=(0, bn + 2, 0), dims=heads)
        v_in = box.input("V", v, pad=(0, bn + 2, 0), dims=heads)
        lse_in = box.input("LSE", torch.tensor(lse, dtype=torch.float32), dims=("head", "row"))
        delta_in = box.input("DELTA", torch.tensor(delta, dtype=torch.float32),
                             dims=("head", "row"))
        dq = box.output("DQ", (h, n_q, d), pad=(0, bm + 3, 0), dims=heads)
        case = (f"{case} (head strides Q and DO {q_in.stride(0)}, K and V {k_in.stride(0)}, "
                f"DQ {dq.stride(0)})")
        box.case = case
        box.launch(kernel, (triton.cdiv(n_q, bm), h), q_in, k_in, v_in, do_in, lse_in,
                   delta_in, dq, sm_scale, q_in.stride(0), k_in.stride(0), dq.stride(0), n_q,
                   n_k, HEAD_DIM=d, BLOCK_M=bm, BLOCK_N=bn, CAUSAL=causal)
        compare(dq, want, case, "dQ", rtol=tf32_tolerance(1e-4),
                atol=tf32_tolerance(2e-5 + 2e-7 * s_max))
