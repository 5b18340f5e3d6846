"""The hardware table: levels ordered, ridge points, and numbers as the sources give them."""

import pytest

from flashtext.hardware import A100, GPUS, H100, H200, LEVELS, hierarchy, ridge_points


@pytest.mark.parametrize("key", sorted(GPUS))
def test_hierarchy_levels_grow_and_slow_down(key):
    levels = hierarchy(GPUS[key])
    assert [lv.name for lv in levels] == list(LEVELS)
    sizes = [lv.size for lv in levels[1:] if lv.size is not None]
    assert sizes == sorted(sizes), "below the registers, each level is bigger than the one above"
    # the register file is as big as the on-chip L1 + shared memory in total, or a third bigger
    # (256 KB against 192-256 KB per SM), but private to the threads that own it
    assert 1 <= levels[0].size / levels[1].size <= 4 / 3
    rates = [lv.bandwidth for lv in levels if lv.bandwidth is not None]
    assert rates == sorted(rates, reverse=True), "each level should be slower than the one above"


def test_cited_numbers():
    assert A100.smem_bandwidth / A100.hbm_bandwidth == pytest.approx(19 / 1.5)  # FA1 Fig. 1
    assert A100.host_bandwidth == 12.8e9 and A100.host_memory_bytes == 1e12
    assert round(A100.sram_total / 1e6) == 21  # FA1 says "20 MB" of SRAM: 192 KB x 108 SMs
    assert H100.hbm_bandwidth == 3.35e12 and H100.l2_bytes == 50 * 2**20
    assert H200.hbm_bandwidth == 4.8e12 and H200.hbm_bytes == 141e9
    assert H200.measured_copy_bandwidth < H200.hbm_bandwidth


def test_ridge_points():
    assert ridge_points(A100)["matmul"] == pytest.approx(208.0)
    assert ridge_points(H100)["matmul"] == pytest.approx(295.22, abs=0.01)
    assert ridge_points(H200)["matmul"] == pytest.approx(206.04, abs=0.01)
    assert ridge_points(A100)["fp32 (non-matmul)"] == pytest.approx(13.0)
    # FA2: matmul is 16x the non-matmul throughput on an A100
    assert A100.matmul_flops / A100.fp32_flops == 16


def test_shared_memory_is_the_maximum_a_kernel_can_use():
    """smem_per_sm is the shared-memory maximum per SM (Algorithm 1's M), not the unified
    L1 + shared block it is carved from: 164 of 192 KB on an A100, 228 of 256 KB on Hopper."""
    assert (A100.smem_per_sm, A100.l1_smem_per_sm) == (164 * 1024, 192 * 1024)
    for gpu in (H100, H200):
        assert (gpu.smem_per_sm, gpu.l1_smem_per_sm) == (228 * 1024, 256 * 1024)
    assert all(g.smem_per_sm < g.l1_smem_per_sm for g in GPUS.values())
    # the hierarchy counts the whole on-chip SRAM, and says how much of it can be shared
    level = hierarchy(A100)[1]
    assert level.size == 192 * 1024 * 108 and "164 KB" in level.note


def test_h200_shared_memory_matches_its_driver():
    from flashtext import recorded

    device = recorded.load("h200_memory_wall")["device"]
    assert device["shared_memory_per_multiprocessor"] == H200.smem_per_sm
