"""Counting formulas: block sizes, the SRAM budget, Algorithm 1's exact IO count and its
Theta(N^2 d^2 / M) growth, standard attention's Theta(N d + N^2)."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flashtext import cost


def test_attention_flops():
    assert cost.attention_flops(1, 1, 1024, 64) == 4 * 1024 * 1024 * 64
    assert cost.attention_flops(2, 3, 10, 8, causal=True, mode="fwd_bwd") == \
        4 * 2 * 3 * 100 * 8 * 0.5 * 3.5
    with pytest.raises(ValueError, match="mode"):
        cost.attention_flops(1, 1, 8, 8, mode="back")


@pytest.mark.parametrize("m,d,expected", [
    (4096, 64, (16, 16)),     # Bc = 16 <= d: the min collapses, Br = Bc
    (49152, 64, (192, 64)),   # ~100 KB of fp16: Bc > d, Br capped at d
    (1000, 64, (4, 4)),       # ceil: 1000 / 256 = 3.9 -> 4
    (100, 64, (1, 1)),        # M < 4d still gives one row
    (116736, 128, (228, 128)),  # an H100's 228 KB of fp16
])
def test_block_sizes(m, d, expected):
    assert cost.block_sizes(m, d) == expected


@given(m=st.integers(1, 10**6), d=st.integers(1, 512))
def test_block_size_laws(m, d):
    bc, br = cost.block_sizes(m, d)
    assert bc == math.ceil(m / (4 * d)) and br == min(bc, d)
    assert (br == bc) == (bc <= d)
    # what Theorem 2's proof needs: every tile is O(M)
    assert bc * d <= m / 4 + d and br * bc <= m / 4 + d


@given(m=st.integers(1, 10**6), d=st.integers(1, 512))
def test_paper_budget_exceeds_m_whenever_bc_le_d(m, d):
    bc, _ = cost.block_sizes(m, d)
    if bc <= d:  # Q, K, V, O alone take 4 Bc d >= M, and S_ij comes on top
        assert cost.fa1_paper_budget(m, d) > m


def test_paper_budget_fits_with_room():
    assert cost.fa1_paper_budget(49152, 64) == 2 * 192 * 64 + 2 * 64 * 64 + 64 * 192 + 2 * 64
    assert cost.fa1_paper_budget(49152, 64) <= 49152
    assert cost.fa1_paper_budget(116736, 128) > 116736  # d = 128 does not fit an H100's SMEM


def test_grid():
    assert cost.fa1_grid(1000, 64, 4096) == {"Bc": 16, "Br": 16, "Tr": 63, "Tc": 63}
    assert cost.fa1_grid(100, 8, 400, n_k=30) == {"Bc": 13, "Br": 8, "Tr": 13, "Tc": 3}
    with pytest.raises(ValueError, match="n must be a positive integer"):
        cost.fa1_grid(0, 8, 400)


@given(n=st.integers(1, 5000), d=st.integers(1, 256), m=st.integers(1, 10**6))
def test_closed_form(n, d, m):
    tc = cost.fa1_grid(n, d, m)["Tc"]
    assert cost.fa1_hbm_total(n, d, m) == n * d + 2 * n + 2 * n * d + tc * (3 * n * d + 4 * n)


@given(n=st.integers(16, 20000), d=st.integers(1, 256), frac=st.floats(0, 1))
def test_theta_constant_is_bounded(n, d, frac):
    # Theorem 2 for M in [d, N d]: count / (N^2 d^2 / M) stays between two constants
    m = int(round(d * (n ** frac)))
    m = min(max(m, d), n * d)
    ratio = cost.fa1_hbm_total(n, d, m) / cost.fa1_hbm_theta(n, d, m)
    assert 2.4 <= ratio <= 40


def test_q_outer_rereads_kv():
    a = cost.fa1_hbm_elements(1024, 64, 49152)
    b = cost.fa1_hbm_elements(1024, 64, 49152, loop_order="q_outer")
    assert a["reads"]["K"] == 1024 * 64 and b["reads"]["K"] == 16 * 1024 * 64  # Tr = 1024/64
    assert a["writes"] == b["writes"]
    with pytest.raises(ValueError, match="loop_order"):
        cost.fa1_hbm_elements(8, 8, 64, loop_order="sideways")


def test_standard_and_compulsory():
    assert cost.standard_attention_hbm_total(1024, 64) == 4 * 1024 * 64 + 4 * 1024**2
    assert cost.compulsory_hbm_elements(1024, 64) == 4 * 1024 * 64
    assert cost.compulsory_hbm_elements(10, 4, n_k=30) == 2 * 40 + 2 * 120
    assert cost.fa1_hbm_four_step(1024, 64, 49152) == 16 * 1024**2 * 64**2 / 49152


def test_more_sram_fewer_accesses():
    counts = [cost.fa1_hbm_total(4096, 64, m) for m in (2**k for k in range(8, 19))]
    assert all(a >= b for a, b in zip(counts, counts[1:], strict=False))
    assert counts[0] > 10 * counts[-1]


def test_sram_elements_itemised():
    tiles = cost.fa1_sram_elements(3000, 16)
    assert tiles == {"K_j": 752, "V_j": 752, "Q_i": 256, "O_i": 256, "S_ij": 752,
                     "l_i, m_i": 32, "line 10-11 row stats": 64}
    assert cost.fa1_sram_elements(3000, 16, bc=10, br=2)["S_ij"] == 20
    with pytest.raises(ValueError, match="bc"):
        cost.fa1_sram_elements(3000, 16, bc=-1)


def test_fa2_schedule_count_matches_the_fa2_simulator():
    import numpy as np

    from flashtext import fa2

    rng = np.random.default_rng(0)
    for n, n_k, d, bm, bn in [(100, 100, 8, 32, 16), (64, 33, 4, 16, 16)]:
        q, k, v = rng.standard_normal((n, d)), rng.standard_normal((n_k, d)), \
            rng.standard_normal((n_k, d))
        _, _, tally = fa2.schedule_forward(q, k, v, BLOCK_M=bm, BLOCK_N=bn)
        ours = cost.fa2_hbm_elements(n, d, bm, n_k=n_k)
        assert dict(tally.reads) == ours["reads"] and dict(tally.writes) == ours["writes"]


def test_attention_bytes():
    assert cost.attention_bytes("standard", 4096, 64, batch=4, heads=16) == \
        (4 * 4096 * 64 + 4 * 4096**2) * 64 * 2
    assert cost.attention_bytes("compulsory", 1024, 128, bytes_per_element=4) == 4 * 1024 * 128 * 4
    assert cost.attention_bytes("fa1", 512, 64, m_elements=49152) == \
        cost.fa1_hbm_total(512, 64, 49152) * 2
    with pytest.raises(ValueError, match="m_elements"):
        cost.attention_bytes("fa1", 512, 64)
    with pytest.raises(ValueError, match="kind"):
        cost.attention_bytes("flash", 512, 64)


@given(n=st.integers(1, 3000), d=st.integers(1, 200))
def test_crossover_is_the_first_m_that_wins(n, d):
    m = cost.fa1_crossover_m(n, d)
    target = cost.standard_attention_hbm_total(n, d)
    if m is None:
        assert cost.fa1_hbm_total(n, d, 4 * n * d) >= target
        return
    assert cost.fa1_hbm_total(n, d, m) < target
    assert m == 1 or cost.fa1_hbm_total(n, d, m - 1) >= target


def test_crossover_is_about_3_d_squared():
    for d in (32, 64, 128):
        assert 3 * d * d <= cost.fa1_crossover_m(8192, d) <= 3.2 * d * d
    assert cost.fa1_crossover_m(1, 64) is None
