"""The kernels' loop bounds (mirrored in flashtext.kernels.plan) visit exactly the tiles that
flashtext.fa2.block_grid says can hold a visible score, mask exactly the tiles the diagonal or
the end of K crosses, and nothing else."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import flashtext.kernels.backward as B
import flashtext.kernels.forward as F
from flashtext import _boot, fa2
from flashtext.kernels import plan
from flashtext.kernels.config import KernelConfig

blocks = st.sampled_from([16, 32, 64, 128])
lengths = st.integers(min_value=1, max_value=600)


def _expected_forward(n_q, n_k, bm, bn, causal):
    kinds = fa2.block_grid(n_q, n_k, bm, bn, causal=causal)
    want = np.select([kinds == fa2.SKIPPED, kinds == fa2.MASKED],
                     [plan.NOT_VISITED, plan.MASKED_STAGE], plan.UNMASKED_STAGE)
    if n_k % bn:  # the ragged last key tile needs a bounds mask wherever it is visited
        last = want[:, -1]
        last[last == plan.UNMASKED_STAGE] = plan.MASKED_STAGE
    return want


@settings(max_examples=300, deadline=None)
@given(lengths, lengths, blocks, blocks, st.booleans())
def test_forward_plan_matches_the_tile_classification(n_q, n_k, bm, bn, causal):
    got = plan.forward_stages(n_q, n_k, bm, bn, causal)
    np.testing.assert_array_equal(got, _expected_forward(n_q, n_k, bm, bn, causal))


@settings(max_examples=300, deadline=None)
@given(lengths, lengths, blocks, blocks, st.booleans())
def test_dkdv_plan_matches_the_tile_classification(n_q, n_k, bm, bn, causal):
    # dK/dV rows of keys past N_k are computed but never stored, and rows past N_q read as zero
    # inputs: only the causal diagonal needs a mask here
    kinds = fa2.block_grid(n_q, n_k, bm, bn, causal=causal)
    want = np.select([kinds == fa2.SKIPPED, kinds == fa2.MASKED],
                     [plan.NOT_VISITED, plan.MASKED_STAGE], plan.UNMASKED_STAGE)
    np.testing.assert_array_equal(plan.dkdv_stages(n_q, n_k, bm, bn, causal), want)


def test_a_small_example_by_hand():
    # Nq = Nk = 64, 32 x 32 tiles, causal: the two diagonal tiles masked, the one below full,
    # the one above skipped
    np.testing.assert_array_equal(plan.forward_stages(64, 64, 32, 32, True),
                                  [[plan.MASKED_STAGE, plan.NOT_VISITED],
                                   [plan.UNMASKED_STAGE, plan.MASKED_STAGE]])
    p = plan.forward_program(32, 64, 64, 32, 32, True)
    assert (p.mid, p.hi) == (32, 64)
    k = plan.key_program(0, 64, 64, 32, 32, True)
    assert (k.lo, k.mid) == (0, 32)


# ------------------------------------------------- the kernels themselves follow the plan

def _spy(module, name, calls):
    """Wrap a @triton.jit helper so that, under the interpreter, each call records its bounds.
    (The interpreter runs a kernel as Python and looks helpers up in the module at call time.)"""
    import inspect

    original = getattr(module, name)
    params = inspect.signature(original.fn).parameters

    def value(x):
        x = getattr(x, "value", x)  # constexpr
        h = getattr(x, "handle", None)
        return np.asarray(h.data).reshape(-1)[0].item() if h is not None else x

    def spy(*args):
        bound = dict(zip(params, args, strict=True))
        start = bound.get("start_m", bound.get("start_n"))
        calls.append((value(start), value(bound["lo"]), value(bound["hi"]),
                      bool(value(bound["MASKED"]))))
        return original(*args)

    return original, spy


@pytest.mark.skipif(not _boot.INTERPRETING, reason="spies on the interpreter's Python calls")
@pytest.mark.parametrize("n_q,n_k,bm,bn", [(50, 70, 16, 32), (70, 33, 32, 16), (40, 40, 16, 16),
                                           (5, 90, 16, 16)])
@pytest.mark.parametrize("causal", [False, True])
def test_the_kernels_run_the_plan(monkeypatch, n_q, n_k, bm, bn, causal):
    cfg = KernelConfig(bm, bn)
    q, k = torch.randn(1, 1, n_q, 16), torch.randn(1, 1, n_k, 16)
    fwd_calls, dq_calls, dkdv_calls = [], [], []
    for module, name, calls in ((F, "_fwd_inner", fwd_calls), (B, "_dq_inner", dq_calls),
                                (B, "_dkdv_inner", dkdv_calls)):
        original, spy = _spy(module, name, calls)
        monkeypatch.setattr(module, name, spy)
    o, lse = F.forward(q, k, k, causal, 0.25, cfg)
    B.backward(q, q, k, k, o, lse, causal, 0.25, {"bwd_pre": cfg, "bwd_dkdv": cfg, "bwd_dq": cfg})

    want_rows = []
    for start_m in range(0, n_q, bm):
        p = plan.forward_program(start_m, n_q, n_k, bm, bn, causal)
        want_rows.append([(start_m, 0, p.mid, False), (start_m, p.mid, p.hi, True)])
    # the interpreter runs programs in launch order: the causal forward hands out its longest
    # (last) query blocks first; the dQ kernel keeps the natural order
    fwd_order = want_rows[::-1] if causal else want_rows
    assert fwd_calls == [call for program in fwd_order for call in program]
    assert dq_calls == [call for program in want_rows for call in program]
    want_cols = []
    for start_n in range(0, n_k, bn):
        p = plan.key_program(start_n, n_q, n_k, bm, bn, causal)
        if causal:
            want_cols.append((start_n, p.lo, min(p.mid, n_q), True))
        want_cols.append((start_n, p.mid, n_q, False))
    assert dkdv_calls == want_cols
