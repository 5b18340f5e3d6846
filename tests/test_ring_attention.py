"""flashtext.ring_attention: the block plan is exact for every layout, the lse merge, sharding,
and real rings of spawned processes (2 and 3 ranks; one process group per test, shared by its
cases), forward and backward against float64 attention on the full sequence.

On a CPU the rings are CPU processes over gloo (the kernels under Triton's interpreter); where
Triton compiles for a GPU they are one process per GPU over NCCL, skipped when there are fewer
GPUs than ranks."""

import datetime
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist

import flashtext
from flashtext import context_parallel as cp
from flashtext import online, reference, ring

ON_GPU = flashtext.on_gpu()
DEVICE = flashtext.torch_device()
BACKEND = "nccl" if ON_GPU else "gloo"


def _ranks(world: int):
    """Skip where this machine cannot give every rank a device the kernels run on."""
    if ON_GPU and torch.cuda.device_count() < world:
        pytest.skip(f"a ring of {world} NCCL ranks needs {world} GPUs; "
                    f"{torch.cuda.device_count()} here")
    return world


def _kernel_mask(block: cp.Block | None, n_local: int) -> np.ndarray:
    """The (query, key) pairs the ring lets the kernel see for one block: its sub-block, with
    the kernel's bottom-right causal mask when the block is causal."""
    seen = np.zeros((n_local, n_local), dtype=bool)
    if block is None:
        return seen
    rows = np.arange(n_local)[block.q_rows]
    cols = np.arange(n_local)[block.k_rows]
    sub = (reference.causal_mask(len(rows), len(cols)) if block.causal
           else np.ones((len(rows), len(cols)), dtype=bool))
    seen[np.ix_(rows, cols)] = sub
    return seen


@pytest.mark.parametrize("layout", ring.LAYOUTS)
@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("causal", [False, True])
def test_block_plan_is_exactly_the_mask(layout, world, causal):
    # every (query shard, key shard) block the ring hands the kernel sees exactly the pairs the
    # full-sequence mask allows, and costs what causal_work counts
    n = 4 * world * 3
    pos = [ring.shard_positions(n, world, r, layout) for r in range(world)]
    n_local = n // world
    work = np.zeros((world, world), dtype=np.int64)
    for r in range(world):
        for t in range(world):
            s = (r - t) % world
            block = cp.block_plan(r, s, world, n_local, causal, layout)
            want = (pos[s][None, :] <= pos[r][:, None]) if causal else np.ones((n_local,) * 2,
                                                                               dtype=bool)
            np.testing.assert_array_equal(_kernel_mask(block, n_local), want,
                                          err_msg=f"rank {r}, source {s}")
            work[r, t] = 0 if block is None else block.pairs(n_local)
    expected = (ring.causal_work(n, world, layout) if causal
                else np.full((world, world), n_local**2))
    np.testing.assert_array_equal(work, expected)
    if causal and layout == "zigzag" and world > 1:  # the point: the same work every step
        assert (work[:, 1:] == work[0, 1]).all()


def test_merge_partial_is_the_combine():
    rng = np.random.default_rng(1)
    o = rng.standard_normal((3, 5, 4))
    lse = rng.standard_normal((3, 5)) * 30
    lse[1, 2] = lse[2, 2] = -np.inf  # splits that saw no key
    lse[:, 4] = -np.inf  # a row that saw no key anywhere
    o[:, 4] = 0.0
    want_o, want_lse = online.combine_partials(o, lse)
    acc = torch.zeros(5, 4)
    acc_lse = torch.full((5,), -math.inf)
    for s in range(3):
        acc, acc_lse = cp.merge_partial(acc, acc_lse, torch.tensor(o[s], dtype=torch.float32),
                                        torch.tensor(lse[s], dtype=torch.float32))
    assert torch.isfinite(acc).all()
    np.testing.assert_allclose(acc.numpy(), want_o, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(acc_lse.numpy(), want_lse, rtol=1e-6)
    assert np.isneginf(acc_lse[4].item()) and (acc[4] == 0).all()


@pytest.mark.parametrize("layout", ring.LAYOUTS)
def test_shard_unshard(layout):
    x = torch.arange(2 * 3 * 24 * 2, dtype=torch.float32).reshape(2, 3, 24, 2)
    parts = [cp.shard(x, r, 3, layout) for r in range(3)]
    for r, part in enumerate(parts):
        rows = ring.shard_positions(24, 3, r, layout)
        torch.testing.assert_close(part, x[:, :, rows])
    torch.testing.assert_close(cp.unshard(parts, layout), x, rtol=0, atol=0)
    torch.testing.assert_close(cp.unshard([p[..., 0] for p in parts], layout), x[..., 0],
                               rtol=0, atol=0)


# ------------------------------------------------------------------------ one rank, in process

@pytest.fixture
def group_of_one():
    store = dist.HashStore()
    dist.init_process_group(BACKEND, store=store, rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=30),
                            **({"device_id": torch.device(DEVICE, 0)} if ON_GPU else {}))
    try:
        yield
    finally:
        dist.destroy_process_group()


def _qkv(shape, seed=0, dtype=torch.float32):
    """Four seeded CPU tensors (q, k, v, do)."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=g).to(dtype) for _ in range(4)]


@pytest.mark.parametrize("causal", [False, True])
def test_world_of_one_is_attention(group_of_one, causal):
    q, k, v, do = _qkv((1, 2, 12, 16))
    qg, kg, vg = (t.to(DEVICE).requires_grad_(True) for t in (q, k, v))
    o, lse = cp.ring_attention(qg, kg, vg, causal, 0.5, return_lse=True, check_ranks=causal)
    o.backward(do.to(DEVICE))
    want_o, want_lse = reference.attention(q, k, v, causal=causal, scale=0.5, return_lse=True)
    grads = reference.attention_backward(q, k, v, do, causal=causal, scale=0.5)
    np.testing.assert_allclose(o.detach().cpu().numpy(), want_o, atol=2e-5, rtol=2e-5)
    np.testing.assert_allclose(lse.cpu().numpy(), want_lse, atol=2e-5, rtol=2e-5)
    for got, want in zip((qg.grad, kg.grad, vg.grad), grads, strict=True):
        np.testing.assert_allclose(got.cpu().numpy(), want, atol=2e-5, rtol=2e-5)


def test_validation_names_the_argument(group_of_one):
    q, k, v, _ = (t.to(DEVICE) for t in _qkv((1, 2, 6, 16)))
    bad = [
        ((q.cpu().numpy(), k, v), {}, "q must be a 4-d torch.Tensor"),
        ((q, k[0], v), {}, "k must be a 4-d"),
        ((q, k[:, :, :4], v), {}, "one shape"),
        ((q, k, v), {"layout": "random"}, "layout must be one of"),
        ((q[:, :, :5], k[:, :, :5], v[:, :, :5]), {"layout": "zigzag"}, "must be even"),
        ((q, k, v), {"causal": 1}, "causal must be True or False"),
        ((q, k, v), {"sm_scale": math.nan}, "sm_scale must be a finite number"),
        ((q.double(), k.double(), v.double()), {}, "dtype"),
        ((q, k, v.half()), {}, "one dtype"),
        ((q, k, v), {"check_ranks": 1}, "check_ranks must be True or False"),
    ]
    for args, kwargs, message in bad:
        with pytest.raises(ValueError, match=message):
            cp.ring_attention(*args, **kwargs)


def test_profile_ring_validates(group_of_one):
    q, k, v, _ = (t.to(DEVICE) for t in _qkv((1, 1, 4, 16)))
    with pytest.raises(ValueError, match="repeats must be a positive integer"):
        cp.profile_ring(q, k, v, repeats=0)
    with pytest.raises(ValueError, match="profile: a ring of one rank sends nothing"):
        cp.overlap_summary(cp.profile_ring(q, k, v, repeats=1))


def test_needs_a_process_group():
    q, k, v, _ = _qkv((1, 1, 4, 16))
    assert not dist.is_initialized()
    with pytest.raises(ValueError, match="group: ring_attention needs an initialised"):
        cp.ring_attention(q, k, v)


# ------------------------------------------------------------------------ real rings over gloo

def _case(n, causal, layout, seed, dtype=torch.float32, sm_scale=None, huge_row=None, heads=2):
    q, k, v, do = _qkv((1, heads, n, 16), seed)
    if huge_row is not None:  # a row of huge scores: the merge must rescale, not overflow
        q[0, -1, huge_row] *= 40.0
    return {"q": q.to(dtype), "k": k.to(dtype), "v": v.to(dtype), "do": do.to(dtype),
            "causal": causal, "layout": layout, "sm_scale": sm_scale}


def _kernel_on_full_sequence(case):
    """The single-process kernel (flashtext.kernels.flash_attention) on the whole sequence."""
    from flashtext.kernels import attention_forward, flash_attention

    q, k, v = (case[x].to(DEVICE).requires_grad_(True) for x in ("q", "k", "v"))
    o = flash_attention(q, k, v, case["causal"], case["sm_scale"])
    o.backward(case["do"].to(DEVICE))
    _, lse = attention_forward(q.detach(), k.detach(), v.detach(), case["causal"],
                               case["sm_scale"])
    return {name: t.detach().cpu() for name, t in
            (("o", o), ("lse", lse), ("dq", q.grad), ("dk", k.grad), ("dv", v.grad))}


def _check(case, per_rank, floor):
    """The ring on W ranks is as close to float64 attention as the kernel on the full sequence
    is (within twice its error, plus ``floor``): a huge row's fp32 rounding is the kernel's,
    not the ring's."""
    layout = case["layout"]
    got = {name: cp.unshard([r[name] for r in per_rank], layout).double().numpy()
           for name in ("o", "lse", "dq", "dk", "dv")}
    q, k, v, do = (case[x] for x in ("q", "k", "v", "do"))
    want_o, want_lse = reference.attention(q, k, v, causal=case["causal"],
                                           scale=case["sm_scale"], return_lse=True)
    want = dict(zip(("dq", "dk", "dv"),
                    reference.attention_backward(q, k, v, do, causal=case["causal"],
                                                 scale=case["sm_scale"]), strict=True))
    want.update(o=want_o, lse=want_lse)
    single = _kernel_on_full_sequence(case)
    for name in got:
        ring_err = np.abs(got[name] - want[name]).max()
        kernel_err = np.abs(single[name].double().numpy() - want[name]).max()
        assert ring_err <= 2 * kernel_err + floor, (name, case["causal"], layout, ring_err,
                                                    kernel_err)


def test_ring_of_two_forward_and_backward():
    cases = [_case(16, False, "contiguous", 1),
             _case(16, True, "zigzag", 2, sm_scale=0.3, huge_row=11),
             _case(16, True, "striped", 3),
             _case(16, True, "contiguous", 4)]
    results = ring.launch(cp.run_cases, _ranks(2), (cases,), backend=BACKEND, timeout=60)
    for i, case in enumerate(cases):
        _check(case, [r[i] for r in results], floor=2e-6)
        work = np.array([r[i]["pairs"] for r in results])
        want = ring.causal_work(16, 2, case["layout"]) if case["causal"] else np.full((2, 2), 64)
        np.testing.assert_array_equal(work, want)


def test_ring_of_three_forward_backward_and_checks():
    cases = [_case(18, True, "striped", 5, huge_row=4, heads=1),
             _case(24, True, "zigzag", 6, heads=1),
             {**_case(18, True, "striped", 7, heads=1), "mismatch_rank": 1},
             _case(24, False, "zigzag", 8, dtype=torch.float16, heads=1)]
    results = ring.launch(cp.run_cases, _ranks(3), (cases,), backend=BACKEND, timeout=60)
    _check(cases[0], [r[0] for r in results], floor=2e-6)
    _check(cases[1], [r[1] for r in results], floor=2e-6)
    # one rank's shards too short: every rank gets the ValueError, none hangs
    for rank, r in enumerate(results):
        assert "every rank must pass shards of one shape" in r[2]["error"], rank
        assert "ranks [1] differ" in r[2]["error"] or rank == 1
    # and the group still works afterwards, in fp16
    assert all(r[3]["o"].dtype == torch.float16 for r in results)
    _check(cases[3], [r[3] for r in results], floor=1e-3)


def test_profile_ring_times_every_step():
    results = ring.launch(cp.profile_worker, _ranks(2), (8,), backend=BACKEND, timeout=60)
    for rank, prof in enumerate(results):
        assert prof["world"] == 2 and prof["n_local"] == 8, rank
        for key in ("compute", "communicate", "ring"):
            assert len(prof[key]) == 2 and all(t > 0 for t in prof[key]), (rank, key)
        # overlap is what the docstring says, from the step times returned (world 2, forward:
        # the first step sends). How the three times compare is a measurement, left to
        # scripts/record_ring_nccl.py: on a loaded 2-core machine any ratio is noise.
        c, m, r = prof["compute"][0], prof["communicate"][0], prof["ring"][0]
        assert prof["overlap"] == pytest.approx(max(0.0, min(1.0, (c + m - r) / min(c, m))))


_GLOO_UNDER_GPU_COMPILE = """
import os
import flashtext
from flashtext import context_parallel, ring
if __name__ == "__main__":
    assert not flashtext._boot.INTERPRETING  # this process compiles Triton for a GPU
    profiles = ring.launch(context_parallel.profile_worker, 2, (8,), backend="gloo", timeout=60)
    assert [p["world"] for p in profiles] == [2, 2]
    assert os.environ["TRITON_INTERPRET"] == "0"  # put back after the launch
    print("ok")
"""


@pytest.mark.skipif(not flashtext.interpreter_usable(),
                    reason="this Triton's interpreter cannot run with this NumPy")
def test_gloo_ranks_run_under_the_interpreter_where_triton_compiles_for_a_gpu(tmp_path):
    """gloo ranks hold CPU tensors. Where Triton compiles for a GPU (a GPU machine; forced here
    with TRITON_INTERPRET=0), ring.launch must still run them, under the interpreter: chapter
    14's two-rank ring on a one-GPU machine."""
    script = tmp_path / "gloo_ring.py"
    script.write_text(_GLOO_UNDER_GPU_COMPILE)
    env = dict(os.environ, TRITON_INTERPRET="0")
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True,
                         timeout=240, cwd=Path(__file__).resolve().parents[1])
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]


def test_gloo_where_the_interpreter_cannot_run_is_refused_by_name(monkeypatch):
    monkeypatch.setattr(ring, "interpreter_usable", lambda: False)
    with pytest.raises(ValueError, match="backend 'gloo'.*interpreter"):
        ring.launch(cp.run_cases, 2, ([],), backend="gloo")
