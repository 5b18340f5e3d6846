"""The Gluon kernel's ping-pong order (flashtext.hopper.pingpong_slots) and its checker."""

import dataclasses

import pytest

from flashtext import hopper


@pytest.mark.parametrize("n_blocks", [1, 2, 3, 7])
def test_kernel_order_has_the_overlap_property(n_blocks):
    slots = hopper.pingpong_slots(n_blocks)
    hopper.check_pingpong(slots)
    assert len(slots) == 2 * (n_blocks + 1)  # n + 1 turns per warpgroup
    # in the steady state every slot pairs one warpgroup's two GEMMs with the other's softmax
    for slot in slots[2:-2]:
        assert len(slot.gemms) == 2 and slot.softmax[1 - slot.issuer] is not None
        assert slot.softmax[slot.issuer] is None


def test_kernel_order_is_the_simulated_pingpong_pipelined_order():
    # the event model's tensor-core order for FA3's schedule is the order the kernel issues in
    n = 5
    t = hopper.simulate("pingpong+pipelined", 1.0, 1.0, n_iters=n)
    simulated = [(op.lane, f"{op.kind} {op.iteration}")
                 for op in sorted((o for o in t.ops if o.unit == "tensor"), key=lambda o: o.start)]
    kernel = [(f"WG {s.issuer + 1}", g) for s in hopper.pingpong_slots(n) for g in s.gemms]
    assert simulated == kernel


def test_checker_rejects_broken_orders():
    slots = list(hopper.pingpong_slots(3))
    # two turns of one warpgroup in a row (no hand-over)
    swapped = slots[:2] + [slots[3], slots[2]] + slots[4:]
    with pytest.raises(AssertionError, match="alternate"):
        hopper.check_pingpong(tuple(swapped))
    # a softmax beside its own GEMMs (what two warpgroups in step would do)
    own = [dataclasses.replace(s, softmax=(s.softmax[1], s.softmax[0])) for s in slots]
    with pytest.raises(AssertionError):
        hopper.check_pingpong(tuple(own))
    # GEMM1 of a block issued before that block's softmax (P not ready)
    early = [dataclasses.replace(s, gemms=tuple(g.replace("GEMM1 0", "GEMM1 1") if s.index == 2
                                                else g for g in s.gemms)) for s in slots]
    with pytest.raises(AssertionError):
        hopper.check_pingpong(tuple(early))


def test_bad_input():
    with pytest.raises(ValueError, match="n_blocks"):
        hopper.pingpong_slots(0)
