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
from flashtext import _boot, fa2, reference
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


WINDOWS = [(-1, -1), (5, 3), (0, 0), (20, -1), (-1, 7), (33, 0)]


@pytest.mark.skipif(not _boot.INTERPRETING, reason="spies on the interpreter's Python calls")
@pytest.mark.parametrize("n_q,n_k,bm,bn", [(50, 70, 16, 32), (70, 33, 32, 16), (40, 40, 16, 16),
                                           (5, 90, 16, 16)])
@pytest.mark.parametrize("causal,window", [(False, (-1, -1)), (True, (-1, -1)),
                                           (False, (9, 4)), (True, (17, -1))])
def test_the_kernels_run_the_plan(monkeypatch, n_q, n_k, bm, bn, causal, window):
    cfg = KernelConfig(bm, bn)
    q, k = torch.randn(1, 1, n_q, 16), torch.randn(1, 1, n_k, 16)
    fwd_calls, dq_calls, dkdv_calls = [], [], []
    for module, name, calls in ((F, "_fwd_inner", fwd_calls), (B, "_dq_inner", dq_calls),
                                (B, "_dkdv_inner", dkdv_calls)):
        original, spy = _spy(module, name, calls)
        monkeypatch.setattr(module, name, spy)
    o, lse = F.forward(q, k, k, causal, 0.25, cfg, window=window)
    B.backward(q, q, k, k, o, lse, causal, 0.25, {"bwd_pre": cfg, "bwd_dkdv": cfg, "bwd_dq": cfg},
               window=window)

    want_rows = []
    for start_m in range(0, n_q, bm):
        p = plan.forward_program(start_m, n_q, n_k, bm, bn, causal, window)
        want_rows.append([(start_m, p.lo, p.full_lo, True), (start_m, p.full_lo, p.mid, False),
                          (start_m, p.mid, p.hi, True)])
    # the interpreter runs programs in launch order: a forward whose mask bounds the right side
    # hands out its longest (last) query blocks first; the dQ kernel keeps the natural order
    fwd_order = want_rows[::-1] if causal or window[1] >= 0 else want_rows
    assert fwd_calls == [call for program in fwd_order for call in program]
    assert dq_calls == [call for program in want_rows for call in program]
    want_cols = []
    for start_n in range(0, n_k, bn):
        p = plan.key_program(start_n, n_q, n_k, bm, bn, causal, window)
        want_cols += [(start_n, p.lo, p.mid, True), (start_n, p.mid, p.full_hi, False),
                      (start_n, p.full_hi, p.hi, True)]
    assert dkdv_calls == want_cols


def _brute_force(n_q, n_k, bm, bn, causal, window, ragged_keys_masked):
    """Each tile's stage from first principles: which of its real (row, key) pairs are visible."""
    vis = reference.window_mask(n_q, n_k, (window[0], 0 if causal else window[1]))
    grid = np.zeros((-(-n_q // bm), -(-n_k // bn)), dtype=np.int8)
    for i in range(grid.shape[0]):
        for j in range(grid.shape[1]):
            tile = vis[i * bm:(i + 1) * bm, j * bn:(j + 1) * bn]
            ragged = ragged_keys_masked and (j + 1) * bn > n_k
            if not tile.any():
                grid[i, j] = plan.NOT_VISITED
            elif tile.all() and not ragged:
                grid[i, j] = plan.UNMASKED_STAGE
            else:
                grid[i, j] = plan.MASKED_STAGE
    return grid


windows = st.tuples(st.integers(-1, 300), st.integers(-1, 300))


@settings(max_examples=300, deadline=None)
@given(lengths, lengths, blocks, blocks, st.booleans(), windows)
def test_window_plans_are_right_and_tight(n_q, n_k, bm, bn, causal, window):
    # every tile with a visible pair is visited, none without; a mask exactly where some pair is
    # hidden (and, in the forward, on the ragged last key tile, whose padding must not count)
    np.testing.assert_array_equal(plan.forward_stages(n_q, n_k, bm, bn, causal, window),
                                  _brute_force(n_q, n_k, bm, bn, causal, window, True))
    np.testing.assert_array_equal(plan.dkdv_stages(n_q, n_k, bm, bn, causal, window),
                                  _brute_force(n_q, n_k, bm, bn, causal, window, False))


@pytest.mark.parametrize("n,window", [(4096, (1023, 0)), (1000, (100, 100)), (64, (-1, -1))])
def test_visible_pairs_counts_the_mask(n, window):
    want = int(reference.window_mask(n, n, window).sum())
    assert plan.visible_pairs(n, n, False, window) == want
    assert plan.visible_pairs(n, n, True, (window[0], -1)) == \
        int(reference.window_mask(n, n, (window[0], 0)).sum())
