"""Ring attention's bookkeeping: layouts, the causal work table, communication volume, the
overlap condition, and the process launcher's checks (the runs themselves:
tests/test_ring_attention.py)."""

import numpy as np
import pytest

from flashtext import ring


@pytest.mark.parametrize("layout", ring.LAYOUTS)
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_layouts_partition_the_sequence(layout, world):
    n = 8 * world
    pos = np.concatenate([ring.shard_positions(n, world, r, layout) for r in range(world)])
    np.testing.assert_array_equal(np.sort(pos), np.arange(n))


def test_layout_examples_and_errors():
    np.testing.assert_array_equal(ring.shard_positions(8, 2, 1, "contiguous"), [4, 5, 6, 7])
    np.testing.assert_array_equal(ring.shard_positions(8, 2, 1, "striped"), [1, 3, 5, 7])
    np.testing.assert_array_equal(ring.shard_positions(8, 2, 0, "zigzag"), [0, 1, 6, 7])
    with pytest.raises(ValueError, match="multiple of 4"):
        ring.shard_positions(6, 2, 0, "zigzag")
    with pytest.raises(ValueError, match="rank"):
        ring.shard_positions(8, 2, 2)
    with pytest.raises(ValueError, match="layout"):
        ring.shard_positions(8, 2, 0, "random")


@pytest.mark.parametrize("world", [2, 4, 8])
def test_causal_imbalance(world):
    n = 64 * world
    contiguous = ring.causal_work(n, world, "contiguous")
    total = n * (n + 1) // 2
    for layout in ring.LAYOUTS:
        assert ring.causal_work(n, world, layout).sum() == total  # same work, moved around
    # contiguous: rank r's queries see r whole shards and the diagonal one
    shard = n // world
    diag = shard * (shard + 1) // 2
    np.testing.assert_array_equal(contiguous.sum(axis=1),
                                  [r * shard * shard + diag for r in range(world)])
    t = ring.ring_time(contiguous)
    # every step but the first costs a full shard x shard block: time ~ (W - 1/2) blocks
    assert t["time"] == diag + (world - 1) * shard * shard
    assert t["efficiency"] < 0.5 + 1 / world
    zig = ring.ring_time(ring.causal_work(n, world, "zigzag"))
    assert zig["efficiency"] == pytest.approx(1.0)
    assert ring.ring_time(ring.causal_work(n, world, "striped"))["efficiency"] > 0.98


def test_ring_bytes_and_overlap():
    b = ring.ring_bytes(n=8192, d=128, world=4, batch=2, heads=8, bytes_per_element=2)
    shard = 2 * 2048 * 128 * 2 * 8 * 2
    assert b == {"per_step_per_rank": shard, "per_rank": 3 * shard, "total": 12 * shard}
    assert ring.ring_bytes(64, 16, 1)["total"] == 0  # one rank: nothing to send
    # 989 TFLOP/s against a 450 GB/s link in fp16: ~2.2k tokens per rank hide the transfer
    assert ring.overlap_tokens(989e12, 450e9) == pytest.approx(989e12 * 2 / (2 * 450e9))
    with pytest.raises(ValueError, match="world"):
        ring.ring_bytes(64, 16, 0)
    with pytest.raises(ValueError, match="positive"):
        ring.overlap_tokens(0, 1e9)
    with pytest.raises(ValueError, match="square"):
        ring.ring_time(np.ones((2, 3)))


def test_launch_validates():
    with pytest.raises(ValueError, match="backend"):
        ring.launch(print, world=2, backend="mpi")
    with pytest.raises(ValueError, match="world"):
        ring.launch(print, world=0, backend="gloo")
    with pytest.raises(ValueError, match="one GPU per rank"):
        ring.launch(print, world=64, backend="nccl")
    with pytest.raises(ValueError, match="fn must be a function"):
        ring.launch("print", world=2, backend="gloo")
