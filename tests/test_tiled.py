"""Algorithm 1 in NumPy: exact against the float64 reference, HBM counts equal the formulas in
flashtext.cost, the SRAM refuses to overflow, and the hook sees the line-12 terms."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flashtext import cost, reference, tiled


def qkv(n, d, n_k=None, seed=0, spread=1.0):
    rng = np.random.default_rng(seed)
    n_k = n if n_k is None else n_k
    return (spread * rng.standard_normal((n, d)), rng.standard_normal((n_k, d)),
            rng.standard_normal((n_k, d)))


def roomy(m, d):
    """An SRAM exactly as big as one iteration of Algorithm 1 needs with line 1's block sizes."""
    return sum(cost.fa1_sram_elements(m, d).values())


CASES = [  # (N, Nk, d, M): block multiples, ragged last blocks, Bc <= d, Bc > d, N < block
    (64, 64, 16, 1024), (37, 37, 8, 200), (100, 100, 4, 48), (50, 29, 4, 100),
    (29, 50, 4, 100), (130, 130, 16, 3000), (7, 7, 16, 10_000), (96, 33, 32, 4096),
]


@pytest.mark.parametrize("loop_order", cost.LOOP_ORDERS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n,n_k,d,m", CASES)
def test_matches_reference_and_counts(n, n_k, d, m, causal, loop_order):
    q, k, v = qkv(n, d, n_k)
    run = tiled.algorithm1(q, k, v, m, causal=causal, loop_order=loop_order,
                                sram_elements=roomy(m, d))
    out, lse = reference.attention(q, k, v, causal=causal, return_lse=True)
    np.testing.assert_allclose(run.o, out, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(run.lse, lse, rtol=1e-12, atol=1e-13)
    assert run.hbm.by_tensor() == cost.fa1_hbm_elements(n, d, m, n_k=n_k, loop_order=loop_order)
    grid = cost.fa1_grid(n, d, m, n_k)
    assert (run.bc, run.br, run.tr, run.tc) == (grid["Bc"], grid["Br"], grid["Tr"], grid["Tc"])


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 70), n_k=st.integers(1, 70), d=st.integers(1, 12),
       m=st.integers(1, 600), causal=st.booleans(), seed=st.integers(0, 2**16))
def test_any_shape_any_budget(n, n_k, d, m, causal, seed):
    q, k, v = qkv(n, d, n_k, seed)
    run = tiled.algorithm1(q, k, v, m, causal=causal, sram_elements=roomy(m, d))
    np.testing.assert_allclose(run.o, reference.attention(q, k, v, causal=causal),
                               rtol=1e-11, atol=1e-12)
    assert run.hbm.total == cost.fa1_hbm_total(n, d, m, n_k=n_k)
    assert run.sram.peak <= roomy(m, d)


def test_huge_scores_do_not_overflow():
    q, k, v = qkv(48, 8, spread=400.0)  # scores in the thousands: exp would overflow unshifted
    run = tiled.algorithm1(q, k, v, 256, sram_elements=roomy(256, 8))
    assert np.all(np.isfinite(run.o))
    np.testing.assert_allclose(run.o, reference.attention(q, k, v), rtol=1e-10, atol=1e-12)


def test_explicit_block_sizes():
    q, k, v = qkv(45, 8)
    run = tiled.algorithm1(q, k, v, 10_000, bc=7, br=5)
    assert (run.bc, run.br, run.tr, run.tc) == (7, 5, 9, 7)
    np.testing.assert_allclose(run.o, reference.attention(q, k, v), rtol=1e-12, atol=1e-13)
    assert run.hbm.by_tensor() == cost.fa1_hbm_elements(45, 8, 10_000, bc=7, br=5)


def test_peak_sram_is_the_itemised_budget():
    m, d = 3000, 16  # Bc = 47 > d: Br = 16
    q, k, v = qkv(200, d)
    run = tiled.algorithm1(q, k, v, m, sram_elements=roomy(m, d))
    assert run.sram.peak == roomy(m, d)
    assert run.sram.peak_contents == {"K_j": 47 * 16, "V_j": 47 * 16, "Q_i": 256, "O_i": 256,
                                      "l_i": 16, "m_i": 16, "S_ij": 16 * 47, "m~_ij": 16,
                                      "l~_ij": 16, "m_new": 16, "l_new": 16}
    assert run.sram.used == 0  # everything freed at the end


def test_sram_refuses_the_papers_budget_when_bc_le_d():
    q, k, v = qkv(64, 32)
    with pytest.raises(tiled.SRAMOverflow, match="M = 4,096"):
        tiled.algorithm1(q, k, v, 4096)  # Bc = Br = 32 = d: Q, K, V, O alone fill M
    with pytest.raises(tiled.SRAMOverflow):
        tiled.algorithm1(q, k, v, 4096, sram_elements=roomy(4096, 32) - 1)
    tiled.algorithm1(q, k, v, 4096, sram_elements=roomy(4096, 32))


def test_sram_object():
    sram = tiled.SRAM(10)
    sram.put("a", np.zeros(6))
    with pytest.raises(tiled.SRAMOverflow, match="Already on chip: a 6"):
        sram.put("b", np.zeros((2, 3)))
    with pytest.raises(ValueError, match="already on chip"):
        sram.put("a", np.zeros(1))
    sram.free("a")
    sram.put("b", np.zeros((2, 5)))
    assert (sram.used, sram.peak, sram.peak_contents) == (10, 10, {"b": 10})
    with pytest.raises(ValueError, match="capacity"):
        tiled.SRAM(0)


def test_hbm_by_line():
    n, d, m = 40, 4, 64  # Bc = 4, Br = 4: Tc = 10
    q, k, v = qkv(n, d)
    lines = tiled.algorithm1(q, k, v, m, sram_elements=roomy(m, d)).hbm.by_line()
    tc = 10
    assert lines == {2: {"reads": 0, "writes": n * d + 2 * n},
                     6: {"reads": 2 * n * d, "writes": 0},
                     8: {"reads": tc * (2 * n * d + 2 * n), "writes": 0},
                     12: {"reads": 0, "writes": tc * n * d},
                     13: {"reads": 0, "writes": tc * 2 * n}}


def test_hook_sees_every_iteration_in_order_and_line12_terms():
    q, k, v = qkv(23, 4, 31)
    m = 40  # Bc = 3 > d? no: Bc = ceil(40/16) = 3 <= d = 4, so Br = 3
    seen = []
    run = tiled.algorithm1(q, k, v, m, sram_elements=roomy(m, 4), hook=seen.append,
                                trace=True)
    assert [(s.i, s.j) for s in seen] == [(i, j) for j in range(run.tc) for i in range(run.tr)]
    assert len(run.steps) == run.tr * run.tc
    scale = reference.default_scale(4)
    for step in seen:
        s_all = scale * q[step.rows] @ k.T
        e = np.exp(s_all - step.m_new[:, None])
        past = slice(0, step.cols.start)
        np.testing.assert_allclose(step.green, e[:, past] @ v[past], rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(step.yellow, e[:, step.cols] @ v[step.cols], rtol=1e-12,
                                   atol=1e-14)
        np.testing.assert_allclose(step.o_new, reference.attention(
            q[step.rows], k[step.keys_seen], v[step.keys_seen]), rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(step.s, s_all[:, step.cols], rtol=1e-13, atol=1e-14)


def test_swapped_loops_reread_kv():
    q, k, v = qkv(60, 4)
    runs = {lo: tiled.algorithm1(q, k, v, 64, loop_order=lo, sram_elements=roomy(64, 4))
            for lo in cost.LOOP_ORDERS}
    a, b = runs["kv_outer"], runs["q_outer"]
    np.testing.assert_array_equal(a.o, b.o)  # same per-row order of blocks: same rounding too
    assert a.hbm.by_tensor()["reads"]["K"] == 60 * 4
    assert b.hbm.by_tensor()["reads"]["K"] == a.tr * 60 * 4


def test_standard_attention_counts():
    for n, d in [(16, 4), (33, 8)]:
        q, k, v = qkv(n, d)
        out, hbm = tiled.standard_attention(q, k, v)
        np.testing.assert_allclose(out, reference.attention(q, k, v), rtol=1e-13, atol=1e-14)
        steps = cost.standard_attention_hbm_elements(n, d)
        by_line = hbm.by_line()
        assert [by_line[i]["reads"] + by_line[i]["writes"] for i in (1, 2, 3)] == \
            list(steps.values())
    out, _ = tiled.standard_attention(q, k, v, causal=True)
    np.testing.assert_allclose(out, reference.attention(q, k, v, causal=True), atol=1e-14)


@pytest.mark.parametrize("bad,match", [
    (dict(q=np.zeros((1, 4, 3))), "2-D"),
    (dict(k=np.zeros((4, 2))), "head dimension"),
    (dict(v=np.zeros((5, 3))), "shape of k"),
    (dict(q=np.full((4, 3), np.nan)), "NaN"),
    (dict(loop_order="j_inner"), "loop_order"),
    (dict(m_elements=0), "positive"),
    (dict(bc=0), "positive"),
])
def test_bad_input(bad, match):
    args = dict(q=np.zeros((4, 3)), k=np.zeros((4, 3)), v=np.zeros((4, 3)), m_elements=100)
    args.update(bad)
    with pytest.raises(ValueError, match=match):
        tiled.algorithm1(**args)


@pytest.mark.parametrize("causal", [False, True])
def test_line12_paper_is_the_default(causal):
    q, k, v = qkv(40, 4, 33, seed=3)
    a = tiled.algorithm1(q, k, v, 48, causal=causal, sram_elements=roomy(48, 4))
    b = tiled.algorithm1(q, k, v, 48, causal=causal, sram_elements=roomy(48, 4),
                              line12=tiled.line12_paper)
    np.testing.assert_allclose(b.o, a.o, rtol=1e-14, atol=1e-15)


def test_line12_without_rescale_is_wrong_when_the_max_moves():
    q = np.ones((6, 1))
    k = np.arange(12.0)[:, None]  # scores rise: every key block raises the max
    v = np.random.default_rng(0).standard_normal((12, 1))

    def dropped(o_i, l_i, m_i, p_t, m_t, v_j, l_new, m_new):
        return (l_i[:, None] * o_i + p_t @ v_j) / l_new[:, None]

    run = tiled.algorithm1(q, k, v, 8, line12=dropped, sram_elements=100, scale=1.0)
    assert np.abs(run.o - reference.attention(q, k, v, scale=1.0)).max() > 0.1


def test_l_init_one_is_harmless_but_not_with_a_finite_m():
    q, k, v = qkv(30, 4, seed=5)
    base = tiled.algorithm1(q, k, v, 48, sram_elements=roomy(48, 4))
    one = tiled.algorithm1(q, k, v, 48, sram_elements=roomy(48, 4), l_init=1.0)
    np.testing.assert_array_equal(one.o, base.o)
    np.testing.assert_array_equal(one.l, base.l)
    sink = tiled.algorithm1(q, k, v, 48, sram_elements=roomy(48, 4), l_init=1.0, m_init=0.0)
    # l = 1 at m = 0 is a phantom key with score 0 and value 0 ("softmax plus one")
    k0, v0 = np.vstack([k, np.zeros((1, 4))]), np.vstack([v, np.zeros((1, 4))])
    np.testing.assert_allclose(sink.o, reference.attention(q, k0, v0), rtol=1e-12, atol=1e-14)
    assert np.abs(sink.o - base.o).max() > 1e-3
