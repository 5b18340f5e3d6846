"""Chapter 8's exercises: D = rowsum(dO * O), and the inner step of the tiled backward.

The second checker runs the reader's step inside :func:`flashtext.tiled_backward.tiled_backward` and
compares dQ, dK and dV with ``torch.autograd`` on standard attention in float64, naming which
gradient is off.
"""

from __future__ import annotations

import numpy as np

from flashtext import reference as ref
from flashtext.exercises.core import ExerciseFailed, describe, exercise, expect, expect_close
from flashtext.fa2 import flash2_forward
from flashtext.tiled_backward import tiled_backward


@exercise(
    "ch08.delta",
    "D = rowsum(dO * O), one number per query row",
    hints=(
        "D_i = sum over the feature axis of dO[i, :] * O[i, :]: a dot product per row.",
        "The feature axis is the LAST one: o has shape (..., N, d) and D has shape (..., N).",
        "np.sum(do * o, axis=-1). (The FA2 paper types D as R^d; it is R^N: flash-attention "
        "#2555.)",
    ),
)
def check_delta(fn) -> None:
    rng = np.random.default_rng(11)
    shapes = [(37, 8), (5, 64), (64, 64), (2, 3, 10, 4), (1, 16)]
    for shape in shapes:
        o, do = rng.standard_normal(shape), rng.standard_normal(shape)
        case = f"o and do of shape {shape} (N={shape[-2]}, d={shape[-1]})"
        got = fn(o.copy(), do.copy())
        want = np.sum(do * o, axis=-1)
        if got is not None and np.shape(got) == (shape[-1],) and shape[-1] != shape[-2]:
            raise ExerciseFailed(
                f"{case}: D has shape {np.shape(got)}, one number per FEATURE. D needs one "
                f"number per query ROW, shape {want.shape} (the FA2 paper's 'D in R^d' is a "
                f"typo for R^N: flash-attention #2555). Sum over the last axis.")
        expect_close(got, want, what="D", case=case)


def _autograd(q, k, v, do, causal: bool, sm_scale: float):
    """dQ, dK, dV of sum(O * dO) by torch.autograd on standard attention, float64,
    bottom-right causal mask; rows that see no key get zero output and zero gradients."""
    import torch

    qt, kt, vt = (torch.tensor(x, dtype=torch.float64, requires_grad=True) for x in (q, k, v))
    s = (qt @ kt.T) * sm_scale
    if causal:
        mask = torch.from_numpy(ref.causal_mask(q.shape[0], k.shape[0]))
        empty = ~mask.any(dim=1, keepdim=True)
        s = s.masked_fill(~mask, float("-inf")).masked_fill(empty, 0.0)
        p = torch.softmax(s, dim=-1).masked_fill(empty, 0.0)
    else:
        p = torch.softmax(s, dim=-1)
    (p @ vt).backward(torch.from_numpy(do))
    return qt.grad.numpy(), kt.grad.numpy(), vt.grad.numpy()


def _step_cases(rng: np.random.Generator):
    """(description, (q, k, v, do), causal, BLOCK_M, BLOCK_N, sm_scale)."""
    def make(n_q, n_k, q_scale=1.0, d=8):
        return (q_scale * rng.standard_normal((n_q, d)), rng.standard_normal((n_k, d)),
                rng.standard_normal((n_k, 6)), rng.standard_normal((n_q, 6)))

    tau = ref.default_scale(8)
    yield "not causal, Nq = Nk = 40, blocks 16 x 16 (40 is not a multiple of 16)", \
        make(40, 40), False, 16, 16, tau
    yield "not causal, Nq=30, Nk=50, BLOCK_M=8, BLOCK_N=16 (tiles are not square)", \
        make(30, 50), False, 8, 16, tau
    yield "not causal, scores in the thousands (q scaled by 400): exp(s) alone overflows", \
        make(24, 24, 400.0), False, 8, 8, tau
    yield "not causal, d=5, sm_scale=0.3 (not 1/sqrt(d)): use the sm_scale you are given", \
        make(19, 21, d=5), False, 8, 8, 0.3
    yield "causal, Nq = Nk = 37, blocks 8 x 8 (diagonal tiles get a mask)", \
        make(37, 37), True, 8, 8, tau
    yield "causal bottom-right, Nq=20 < Nk=45, BLOCK_M=16, BLOCK_N=8", make(20, 45), True, 16, 8, \
        tau
    yield ("causal bottom-right, Nq=45 > Nk=20: the first 25 queries see no key "
           "(lse = -inf, zero gradients), blocks 8 x 8"), make(45, 20), True, 8, 8, tau


@exercise(
    "ch08.bwd_block",
    "The inner step of the tiled backward: one tile's dK, dV and dQ",
    hints=(
        "Rebuild the tile's probabilities from the saved log-sum-exp: s = (q_blk @ k_blk.T) * "
        "sm_scale; where mask is not None, set masked scores to -inf; p = exp(s - lse_blk[:, "
        "None]). No max, no division: lse already holds both.",
        "dv = p.T @ do_blk (shape BLOCK_N x d); dp = do_blk @ v_blk.T; ds = p * (dp - "
        "delta_blk[:, None]).",
        "dk = (ds.T @ q_blk) * sm_scale and dq = (ds @ k_blk) * sm_scale: S = sm_scale * Q K^T, "
        "so the scale comes back in both.",
        "A row that sees no key has lse = -inf, and -inf - (-inf) is NaN: subtract +inf "
        "instead for such rows (np.where(np.isneginf(lse_blk), np.inf, lse_blk)), which gives "
        "p = 0.",
    ),
)
def check_bwd_block(fn) -> None:
    rng = np.random.default_rng(12)

    for case, (q, k, v, do), causal, bm, bn, sm_scale in _step_cases(rng):

        def step(q_blk, k_blk, v_blk, do_blk, lse_blk, delta_blk, mask, scale, case=case):
            out = fn(q_blk.copy(), k_blk.copy(), v_blk.copy(), do_blk.copy(), lse_blk.copy(),
                     delta_blk.copy(), None if mask is None else mask.copy(), scale)
            expect(isinstance(out, tuple) and len(out) == 3,
                   f"{case}: return a triple (dk, dv, dq), got {describe(out)}")
            for name, got, want in zip(("dk", "dv", "dq"), out,
                                       (k_blk.shape, v_blk.shape, q_blk.shape), strict=True):
                expect(np.shape(got) == want,
                       f"{case}: {name} for one tile must have shape {want} (rows of "
                       f"{'the query' if name == 'dq' else 'the key/value'} tile x features), "
                       f"got {np.shape(got)}")
            return out

        o, lse = flash2_forward(q, k, v, causal, sm_scale)
        delta = np.sum(do * o, axis=-1)
        with np.errstate(all="ignore"):  # the reader's NaNs are reported below, not warned
            got = tiled_backward(step, q, k, v, do, lse, delta, causal, sm_scale,
                                 BLOCK_M=bm, BLOCK_N=bn)
        want = _autograd(q, k, v, do, causal, sm_scale)
        failures = {}
        for name, g, w in zip(("dQ", "dK", "dV"), got, want, strict=True):
            try:
                expect_close(g, w, what=name, case=case, rtol=1e-9, atol=1e-11)
            except ExerciseFailed as e:
                failures[name] = str(e)
        if failures:
            ok = [n for n in ("dQ", "dK", "dV") if n not in failures]
            verb = "agrees" if len(ok) == 1 else "agree"
            agree = f" ({' and '.join(ok)} {verb} with torch.autograd)" if ok else \
                " (all three disagree with torch.autograd)"
            first = next(iter(failures.values()))
            raise ExerciseFailed(f"{_listing(list(failures))} wrong{agree}. {first}")


def _listing(names: list[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
