"""The FA3 cost model: exp vs matmul arithmetic, and the schedule simulator against the closed
forms of each schedule's steady state."""

import dataclasses
import math
from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flashtext import hopper
from flashtext.hardware import A100, H100


def test_softmax_fraction_matches_the_paper():
    # 989 / 3.9 = 253.6 matmul FLOPs per exp; attention has 4d per score
    assert hopper.softmax_fraction(128) == pytest.approx(989 / 3.9 / 512)
    assert 0.49 < hopper.softmax_fraction(128) < 0.50  # "exp ~50% of the matmul at d=128"
    assert 0.98 < hopper.softmax_fraction(64) < 1.0
    assert hopper.softmax_fraction(256) == pytest.approx(hopper.softmax_fraction(128) / 2)


def test_softmax_fraction_bad_input():
    with pytest.raises(ValueError, match="d must be"):
        hopper.softmax_fraction(0)
    with pytest.raises(ValueError, match="exp rates"):
        hopper.softmax_fraction(64, gpu=A100)  # no exp rate recorded for the A100


def test_tile_times_ratio_and_load():
    t = hopper.tile_times(128, block_m=64, block_n=128)
    assert t.softmax / (2 * t.gemm) == pytest.approx(hopper.softmax_fraction(128))
    assert t.load == 0.0
    # K and V tiles of 128 x 128 fp16 = 64 KiB per block, at the SM's share of the bandwidth
    t2 = hopper.tile_times(128, load_bandwidth=H100.hbm_bandwidth)
    assert t2.load == pytest.approx(2 * 128 * 128 * 2 / (H100.hbm_bandwidth / 132))
    assert hopper.tile_times(128, softmax_cost=2.0).softmax == pytest.approx(2 * t.softmax)
    with pytest.raises(ValueError, match="block_n"):
        hopper.tile_times(128, block_n=0)
    with pytest.raises(ValueError, match="softmax_cost"):
        hopper.tile_times(128, softmax_cost=0)


@settings(max_examples=60, deadline=None)
@given(g=st.floats(0.05, 5.0), ratio=st.floats(0.0, 6.0),
       schedule=st.sampled_from(hopper.SCHEDULES))
def test_simulated_steady_state_matches_closed_form(g, ratio, schedule):
    s = ratio * g
    assert hopper.steady_utilisation(schedule, g, s) == pytest.approx(
        hopper.predicted_utilisation(schedule, g, s), rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("schedule", hopper.SCHEDULES)
def test_timeline_respects_units_and_dependencies(schedule):
    t = hopper.simulate(schedule, 1.0, 1.3, n_iters=5, load=0.8, stages=2)
    for unit in ("tensor", "softmax", "tma"):  # one task at a time per unit
        ops = sorted((op for op in t.ops if op.unit == unit), key=lambda op: op.start)
        assert all(a.end <= b.start + 1e-12 for a, b in pairwise(ops)), unit
    for lane in t.lanes:
        if lane.startswith("producer"):
            continue
        for j in range(5):
            g0, sm, g1 = (t.find(lane, k, j) for k in ("GEMM0", "softmax", "GEMM1"))
            assert g0.end <= sm.start and sm.end <= g1.start
            assert t.find("producer (TMA)", "load K", j).end <= g0.start
            assert t.find("producer (TMA)", "load V", j).end <= g1.start
    assert 0 < t.utilisation <= 1


def test_schedule_orderings():
    # ping-pong: warpgroup 2's first GEMM waits for warpgroup 1's, its softmax runs during
    # warpgroup 1's next GEMMs
    t = hopper.simulate("pingpong", 1.0, 1.0, n_iters=3)
    assert t.find("WG 2", "GEMM0", 0).start == t.find("WG 1", "GEMM0", 0).end
    a_g1 = t.find("WG 1", "GEMM1", 0)
    b_sm = t.find("WG 2", "softmax", 0)
    assert a_g1.start < b_sm.end and b_sm.start < a_g1.end  # they overlap
    # pipelined: the next Q K^T is issued before this block's P V
    p = hopper.simulate("pipelined", 1.0, 1.0, n_iters=3)
    lane = p.lanes[0]
    assert p.find(lane, "GEMM0", 1).start < p.find(lane, "GEMM1", 0).start
    assert p.find(lane, "softmax", 1).start < p.find(lane, "GEMM1", 0).end


def test_model_numbers_at_d128():
    t = hopper.tile_times(128)
    util = {s: hopper.steady_utilisation(s, t.gemm, t.softmax) for s in hopper.SCHEDULES}
    assert util["naive"] == pytest.approx(1 / (1 + hopper.softmax_fraction(128)))
    assert util["pingpong"] == pytest.approx(1.0)
    assert util["pipelined"] == pytest.approx(1.0)  # s <= g: fully hidden behind the other GEMM
    d64 = hopper.tile_times(64)
    assert hopper.steady_utilisation("pipelined", d64.gemm, d64.softmax) < 0.7
    assert hopper.model_tflops("naive", 128) == pytest.approx(989 * util["naive"])


def test_one_stage_ring_limits_overlap():
    # with one slot per tensor, the producer cannot run ahead: slower than with two
    one = hopper.steady_utilisation("pingpong+pipelined", 1.0, 1.0, load=2.0, stages=1)
    two = hopper.steady_utilisation("pingpong+pipelined", 1.0, 1.0, load=2.0, stages=2)
    assert one < two == pytest.approx(1.0)


def test_bad_inputs():
    with pytest.raises(ValueError, match="schedule must be"):
        hopper.simulate("fastest", 1.0, 1.0)
    with pytest.raises(ValueError, match="n_iters"):
        hopper.simulate("naive", 1.0, 1.0, n_iters=0)
    with pytest.raises(ValueError, match="stages"):
        hopper.simulate("naive", 1.0, 1.0, stages=0)
    with pytest.raises(ValueError, match="gemm > 0"):
        hopper.simulate("naive", 0.0, 1.0)
    with pytest.raises(ValueError, match="schedule must be"):
        hopper.predicted_utilisation("x", 1.0, 1.0)


def test_paper_numbers_recorded():
    assert hopper.PAPER["pingpong_before"] == 570
    assert hopper.PAPER["pingpong_after"] == (620, 640)
    assert hopper.PAPER["ablation"]["FlashAttention-3"] == 661
    assert math.isclose(hopper.PAPER["fa2_h100_utilisation"], 0.35)


def test_exponentials_per_clock_give_the_papers_rates():
    # 16 MUFU results per clock per SM at the clock the tensor-core peak is quoted at
    assert hopper.clock_hz(A100) == pytest.approx(1.41e9, rel=1e-3)
    assert hopper.mufu_exp_rate(H100) == pytest.approx(H100.exp_flops, rel=0.02)  # FA3's 3.9 T
    assert hopper.matmul_flops_per_exp(A100) == 128 and hopper.matmul_flops_per_exp(H100) == 256
    assert hopper.mufu_exp_rate(H100) / hopper.mufu_exp_rate(A100) == pytest.approx(1.585, abs=1e-3)
    with pytest.raises(ValueError, match="no tensor-core rate"):
        hopper.clock_hz(dataclasses.replace(H100, name="V100"))
