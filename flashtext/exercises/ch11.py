"""Chapter 11's exercises: the query range of a dK/dV program, and a dQ kernel of your own."""

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
    tf32_tolerance,
)
from flashtext.exercises.core import ExerciseFailed, describe, exercise, expect
from flashtext.kernels.plan import key_program
from flashtext.reference import causal_mask

# ---------------------------------------------------------------------------- 11.1 query range


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
    cases = [(256, 256, 64, 64), (256, 256, 64, 32), (256, 256, 32, 64), (100, 300, 32, 32),
             (300, 100, 32, 16), (1, 1000, 64, 64), (1000, 1, 16, 16), (17, 17, 16, 16),
             (129, 129, 64, 32), (40, 9, 16, 16)]
    for n_q, n_k, bm, bn in cases:
        vis = causal_mask(n_q, n_k)
        for start_n in range(0, n_k, bn):
            case = (f"start_n={start_n}, n_q={n_q}, n_k={n_k}, BLOCK_M={bm}, BLOCK_N={bn}, "
                    "causal")
            got = fn(start_n, n_q, n_k, bm, bn)
            expect(isinstance(got, tuple) and len(got) == 2,
                   f"{case}: return a pair (lo, mid), got {describe(got)}")
            lo, mid = (int(x) for x in got)
            cols = vis[:, start_n:min(start_n + bn, n_k)]
            want = key_program(start_n, n_q, n_k, bm, bn, True)
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
            expect(lo == want.lo, f"{case}: lo={lo} is correct but visits query tiles that see "
                   f"none of these keys; the tight bound is {want.lo}.")
            expect(mid == want.mid, f"{case}: mid={mid} is correct but masks tiles that need no "
                   f"mask; the smallest valid mid is {want.mid}.")


# ------------------------------------------------------------------------------ 11.2 dQ kernel


def dq_spec(q, k, v, do, causal: bool, sm_scale: float) -> np.ndarray:
    """dQ of sum(O * dO), O = softmax(sm_scale q k^T [causal, bottom-right]) v."""
    return ref.attention_backward(q, k, v, do, causal=causal, scale=sm_scale)[0]


def _dq_cases(g: torch.Generator):
    def r(*shape):
        return torch.randn(*shape, generator=g)

    yield "N_q = N_k = 64, d=16, BLOCK 16 x 16", 64, 64, 16, False, 16, 16
    yield "ragged: N_q=17, N_k=100, d=32, BLOCK 16 x 32", 17, 100, 32, False, 16, 32
    yield "ragged: N_q=100, N_k=17, d=16, BLOCK 32 x 16", 100, 17, 16, False, 32, 16
    yield "causal, N_q = N_k = 70, BLOCK 32 x 16", 70, 70, 16, True, 32, 16
    yield "causal, N_q=20 < N_k=90", 20, 90, 16, True, 16, 32
    yield ("causal, N_q=45 > N_k=12 (the first 33 queries see no key: lse = -inf, dQ = 0)",
           45, 12, 16, True, 16, 16)


@exercise(
    "ch11.dq_kernel",
    "The dQ kernel: one program per query block, P rebuilt from lse",
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
    _require_kernel(kernel)
    import triton

    g = torch.Generator().manual_seed(11)
    dev = _device()
    for case, n_q, n_k, d, causal, bm, bn in _dq_cases(g):
        h = 2
        q, do = torch.randn(h, n_q, d, generator=g), torch.randn(h, n_q, d, generator=g)
        k, v = torch.randn(h, n_k, d, generator=g), torch.randn(h, n_k, d, generator=g)
        sm_scale = 1.0 / math.sqrt(d)
        o, lse = ref.attention(q, k, v, causal=causal, scale=sm_scale, return_lse=True)
        delta = (o * do.double().numpy()).sum(-1)
        q, k, v, do = (t.to(dev) for t in (q, k, v, do))
        lse_t = torch.tensor(lse, dtype=torch.float32, device=dev)
        delta_t = torch.tensor(delta, dtype=torch.float32, device=dev)
        dq_buf = torch.full((h, n_q + 5, d), SENTINEL, device=dev)
        dq = dq_buf[:, :n_q]
        _launch(kernel, (triton.cdiv(n_q, bm), h), q, k, v, do, lse_t, delta_t, dq, sm_scale,
                q.stride(0), k.stride(0), dq.stride(0), n_q, n_k, HEAD_DIM=d, BLOCK_M=bm,
                BLOCK_N=bn, CAUSAL=causal)
        want = dq_spec(q, k, v, do, causal, sm_scale)
        _yours_vs_expected(dq.cpu().numpy().astype(np.float64), want, case, "dQ",
                           rtol=tf32_tolerance(1e-4), atol=tf32_tolerance(2e-5))
        if not bool((dq_buf[:, n_q:] == SENTINEL).all()):
            raise ExerciseFailed(f"{case}: your kernel wrote dQ rows past N_Q={n_q}: mask the "
                                 "store with offs_m < N_Q.")
