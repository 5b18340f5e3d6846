import numpy as np
import pytest

from flashtext import parallelism as par
from flashtext import reference as ref


def test_program_counts():
    assert par.programs("fa1", 2, 16, 8192) == 32
    assert par.programs("fa2", 2, 16, 8192, BLOCK_M=128) == 64 * 32
    assert par.programs("fa2", 1, 1, 129, BLOCK_M=128) == 2  # a ragged last block is a program


def test_fa1_grid_leaves_sms_idle_at_small_batch():
    occ = par.occupancy("fa1", 1, 16, 8192, sms=132)
    assert occ.programs == 16 and occ.sms_used == 16
    assert occ.utilisation == pytest.approx(16 / 132)
    fa2 = par.occupancy("fa2", 1, 16, 8192, sms=132)
    assert fa2.sms_used == 132 and fa2.utilisation > 0.95
    assert fa2.makespan == pytest.approx(occ.makespan / 8)  # 1024 programs of 64 tiles, 8 waves
    assert fa2.waves == 8


def test_simulate_equal_work_fills_waves():
    occ = par.simulate(np.ones(300), sms=100)
    assert occ.waves == 3 and occ.makespan == 3 and occ.utilisation == 1.0
    occ = par.simulate(np.ones(101), sms=100)
    assert occ.makespan == 2 and occ.utilisation == pytest.approx(101 / 200)
    occ, spans = par.simulate([3.0, 1.0, 1.0, 1.0], sms=2, timeline=True)
    assert occ.makespan == 3.0 and [s[0] for s in spans] == [0, 1, 1, 1]


def test_causal_work_is_uneven_across_query_blocks():
    work = par.program_work("fa2", 1, 1, 512, BLOCK_M=128, BLOCK_N=128, causal=True)
    assert list(work) == [1, 2, 3, 4]
    # launch order: the query block varies fastest, as in the grid (query blocks, batch*heads)
    assert par.program_work("fa2", 1, 2, 512, BLOCK_M=128, BLOCK_N=128, causal=True).tolist() \
        == [1, 2, 3, 4, 1, 2, 3, 4]
    assert par.program_work("fa1", 1, 3, 512, BLOCK_M=128, BLOCK_N=128, causal=True).tolist() \
        == [10, 10, 10]
    assert par.occupancy("fa2", 1, 16, 1024, causal=True).utilisation < \
        par.occupancy("fa2", 1, 16, 1024).utilisation


@pytest.mark.parametrize("rows,cols,warps", [(64, 64, 4), (16, 40, 4), (7, 5, 4), (33, 9, 8)])
def test_split_k_and_split_q_are_both_exact(rows, cols, warps):
    rng = np.random.default_rng(rows * cols)
    q, k, v = rng.standard_normal((rows, 16)), rng.standard_normal((cols, 16)), \
        rng.standard_normal((cols, 8))
    expected = ref.attention(q, k, v, scale=0.25)
    ok, smem_k = par.split_k_warps(q, k, v, warps, 0.25)
    oq, smem_q = par.split_q_warps(q, k, v, warps, 0.25)
    np.testing.assert_allclose(ok, expected, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(oq, expected, rtol=1e-12, atol=1e-13)
    assert smem_q == 0
    assert smem_k == 2 * min(warps, cols) * rows * (8 + 2)


def test_figure_draws():
    import matplotlib.pyplot as plt

    fig = par.occupancy_figure(ns=(1024, 4096), timeline_n=2048)
    assert len(fig.axes) == 2
    plt.close(fig)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="schedule"):
        par.programs("fa3", 1, 1, 128)
    with pytest.raises(ValueError, match="batch"):
        par.programs("fa2", 0, 1, 128)
    with pytest.raises(ValueError, match="work"):
        par.simulate([])
    with pytest.raises(ValueError, match="sms"):
        par.simulate([1.0], sms=0)
    with pytest.raises(ValueError, match="n_warps"):
        par.split_q_warps(np.ones((2, 2)), np.ones((2, 2)), np.ones((2, 2)), 0)
