"""The launch configuration: one config under the interpreter, a table on a GPU, and a
step-down when the compiler says a configuration does not fit."""

from __future__ import annotations

import pytest
import torch
from triton.runtime.errors import OutOfResources

from flashtext import _boot
from flashtext.kernels import config as cfg
from flashtext.kernels import fastpath
from flashtext.kernels.config import KernelConfig, block_d, launch_config
from flashtext.kernels.launcher import launch
from tests.kernel_helpers import FakeCompiled, _rand, gpu


@pytest.mark.parametrize("d,want", [(1, 16), (16, 16), (17, 32), (40, 64), (64, 64), (80, 128),
                                    (128, 128), (200, 256), (256, 256)])
def test_block_d(d, want):
    assert block_d(d) == want


def test_smaller_steps_down_to_the_minimum():
    c, seen = KernelConfig(64, 64, 8, 3), []
    while c is not None:
        seen.append(c)
        c = c.smaller()
    assert seen[1] == KernelConfig(64, 64, 8, 2) and seen[-1] == KernelConfig(16, 16, 8, 1)
    assert all(s.BLOCK_M >= 16 and s.BLOCK_N >= 16 for s in seen)


def test_one_config_under_the_interpreter(monkeypatch):
    monkeypatch.setattr(cfg._boot, "INTERPRETING", True)
    configs = {launch_config(k, d, b, c, 100, 100) for k in ("fwd", "bwd_dkdv", "bwd_dq", "bwd_pre")
               for d in (16, 64, 256) for b in (2, 4) for c in (False, True)}
    assert configs == {KernelConfig(32, 32, num_warps=1, num_stages=1, tma=True)}


def test_gpu_table(monkeypatch):
    monkeypatch.setattr(_boot, "INTERPRETING", False)
    for kernel in ("fwd", "bwd_dkdv", "bwd_dq", "bwd_pre"):
        for d in (16, 40, 64, 128, 256):
            for size in (2, 4):
                c = launch_config(kernel, d, size, True, 4096, 4096)
                assert c.BLOCK_M >= 16 and c.BLOCK_N >= 16 and c.num_warps in (4, 8)
    assert launch_config("fwd", 64, 2, False, 1, 1) == cfg.TUNED[("fwd", 64)]
    # fp32: the plain table
    assert launch_config("fwd", 64, 4, False, 1, 1) == KernelConfig(64, 64, 4, 2)


@pytest.mark.parametrize("kernel", ["fwd", "bwd_dkdv", "bwd_dq"])
@pytest.mark.parametrize("d", [64, 128])
def test_tuned_table_is_what_the_h200_measured(kernel, d):
    """Each tuned entry is within 3% of the fastest configuration the H200 search timed, for
    both causal and non-causal attention (flashtext/data/tune_h200.json for plain loads,
    tune_h200_tma.json for tensor-descriptor loads, the search that matches the entry)."""
    from flashtext import recorded

    chosen = cfg.TUNED[(kernel, d)]
    source = "tune_h200_tma" if chosen.tma else "tune_h200"
    rows = [r for r in recorded.load(source)["rows"]
            if r["kernel"] == kernel and r["d"] == d and r["ms"] is not None]
    key = (chosen.BLOCK_M, chosen.BLOCK_N, chosen.num_warps, chosen.num_stages)
    for causal in (False, True):
        times = {tuple(r["config"][:4]): r["ms"] for r in rows if r["causal"] == causal}
        mine = times[key]
        assert mine <= 1.03 * min(times.values()), (kernel, d, causal, mine, min(times.values()))


# every search recorded on the H200 (scripts/tune_kernels.py --tma on) -> the kernels it timed
SEARCHES = {"tune_h200_fwd_n512": ("fwd",), "tune_h200_fwd_n1024": ("fwd",),
            "tune_h200_fwd_n2048": ("fwd",), "tune_h200_fwd_n16384": ("fwd",),
            "tune_h200_bwd_n1024": ("bwd_dkdv", "bwd_dq"),
            "tune_h200_bwd_n2048": ("bwd_dkdv", "bwd_dq"),
            "tune_h200_tma": ("fwd", "bwd_dkdv", "bwd_dq")}  # N = 4096


@pytest.mark.parametrize("source", SEARCHES)
def test_chosen_configs_are_what_each_search_measured(source, monkeypatch):
    """At every N the H200 searched (512 to 16k), for fp16 and bf16, causal and not, the
    configuration _config picks there is within 3% of the fastest one timed: the N- and
    causal-keyed forward (FWD_SHORT) as much as the table."""
    from flashtext import recorded

    monkeypatch.setattr(_boot, "INTERPRETING", False)
    data, kernels = recorded.load(source), SEARCHES[source]
    groups: dict = {}
    for r in data["rows"]:
        if r["ms"] is not None and r["kernel"] in kernels:
            key = (r["kernel"], r["dtype"], r["d"], r["causal"])
            groups.setdefault(key, {})[tuple(r["config"])] = r["ms"]
    assert {k[0] for k in groups} == set(kernels) and len(groups) >= 4 * len(kernels)
    for (kernel, dtype, d, causal), times in groups.items():
        c = launch_config(kernel, d, 2, causal, data["n"], data["n"])
        mine = times[(c.BLOCK_M, c.BLOCK_N, c.num_warps, c.num_stages, c.tma)]
        assert mine <= 1.03 * min(times.values()), (kernel, dtype, d, causal, data["n"], c)


def test_short_forward_is_keyed_on_causal_n_k_and_d(monkeypatch):
    monkeypatch.setattr(_boot, "INTERPRETING", False)
    short, table64, table128 = cfg.FWD_SHORT, cfg.TUNED[("fwd", 64)], cfg.TUNED[("fwd", 128)]
    assert launch_config("fwd", 64, 2, True, 4096, 2048) == short  # keyed on N_k, not N_q
    assert launch_config("fwd", 64, 2, True, 2048, 2049) == table64
    assert launch_config("fwd", 100, 2, True, 16, 100) == short
    assert launch_config("fwd", 64, 2, False, 512, 512) == table64
    assert launch_config("fwd", 128, 2, False, 512, 512) == short
    assert launch_config("fwd", 128, 2, False, 513, 513) == table128
    assert launch_config("fwd", 128, 4, True, 512, 512) != short  # fp32 keeps its own table
    assert launch_config("bwd_dq", 128, 2, True, 512, 512) == cfg.TUNED[("bwd_dq", 128)]


@pytest.mark.parametrize("n,block", [(512, 128), (1024, 64), (2048, 128), (4096, 64)])
def test_causal_tile_work_is_one_plus_block_over_n(n, block):
    """The reason for FWD_SHORT: a causal pass with B x B tiles computes 1 + B/N times the
    N^2/2 scores the FLOP count credits it with (tiles counted from the kernel's own plan)."""
    from flashtext.kernels import plan

    tiles = int((plan.forward_stages(n, n, block, block, causal=True) != plan.NOT_VISITED).sum())
    assert tiles * block * block == n * n / 2 * (1 + block / n)


class FakeKernel:
    """Raises OutOfResources for tiles with BLOCK_N > 16, like a compiler out of shared memory."""

    def __init__(self):
        self.launched = []

    def __getitem__(self, grid):
        def run(*args, BLOCK_M, BLOCK_N, num_warps, num_stages, **constexprs):
            if BLOCK_N > 16:
                raise OutOfResources(300_000, 232_448, "shared memory")
            self.launched.append((grid, BLOCK_M, BLOCK_N, num_stages))
        return run


def test_launch_steps_down_and_remembers():
    k = FakeKernel()
    got = launch(k, lambda c: (c.BLOCK_M,), KernelConfig(64, 64, 4, 2), 1, 2, X=3)
    assert got == KernelConfig(64, 16, 4, 2) and k.launched == [((64,), 64, 16, 2)]
    # the second call goes straight to the configuration that fitted
    assert launch(k, lambda c: (c.BLOCK_M,), KernelConfig(64, 64, 4, 2), 1, 2, X=3) == got
    assert len(k.launched) == 2


def test_launch_gives_up_when_nothing_fits():
    class NeverFits(FakeKernel):
        def __getitem__(self, grid):
            def run(*args, **kwargs):
                raise OutOfResources(1, 0, "shared memory")
            return run

    with pytest.raises(OutOfResources):
        launch(NeverFits(), lambda c: (1,), KernelConfig(16, 16, 4, 1))


# --- the fast path: a repeated GPU launch reuses the compiled kernel ---------------------------

def test_arg_key_is_at_least_as_fine_as_tritons_specialisation():
    from flashtext.kernels.fastpath import _NO_KEY, arg_key

    buf = torch.zeros(64, dtype=torch.float16)
    aligned, shifted = buf[:32], buf[1:33]  # addresses 16-byte aligned and 2 bytes past it
    assert arg_key(aligned) != arg_key(shifted)
    assert arg_key(aligned) == arg_key(buf[8:40])  # 16 bytes further: Triton sees the same
    assert arg_key(aligned) != arg_key(aligned.float())  # dtype
    assert arg_key(16) != arg_key(17) != arg_key(1)  # every integer value
    assert arg_key(True) != arg_key(1)  # bool is an int subclass, but not the same argument
    assert arg_key(0.5) == arg_key(-3.0)  # floats are never specialised on
    assert arg_key(object()) is _NO_KEY  # unknown kinds of argument: no fast path

    class Desc:  # the fields of triton.tools.tensor_descriptor.TensorDescriptor
        def __init__(self, base, block):
            self.base, self.shape, self.strides = base, [32], [1]
            self.block_shape, self.padding = block, "zero"

    assert arg_key(Desc(aligned, [16])) != arg_key(Desc(aligned, [32]))
    assert arg_key(Desc(aligned, [16])) != arg_key(Desc(shifted, [16]))
    gluon_a, gluon_b = Desc(aligned, [16]), Desc(aligned, [16])  # a Gluon descriptor's layout
    gluon_a.layout, gluon_b.layout = ("swizzle", 128), ("swizzle", 64)
    assert arg_key(gluon_a) != arg_key(gluon_b) != arg_key(Desc(aligned, [16]))


class FakeJit:
    """A JIT function with parameters (A, B, N, X, BLOCK_M, BLOCK_N)."""

    arg_names = ["A", "B", "N", "X", "BLOCK_M", "BLOCK_N"]

    def __init__(self):
        self.slow = []
        self.compiled = FakeCompiled()

    def __getitem__(self, grid):
        def run(*args, BLOCK_M, BLOCK_N, num_warps, num_stages, **constexprs):
            self.slow.append((grid, args))
            return self.compiled
        return run


def test_a_repeated_launch_takes_the_compiled_kernel(monkeypatch):
    monkeypatch.setattr(_boot, "INTERPRETING", False)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(fastpath, "COMPILED", {})
    k, c = FakeJit(), KernelConfig(64, 32, 4, 2)
    a, b = torch.zeros(8), torch.zeros(8)
    launch(k, lambda c: (2, 3), c, a, b, 100, X=7)
    assert len(k.slow) == 1 and not k.compiled.calls
    launch(k, lambda c: (2, 3), c, a, b, 100, X=7)
    # runtime arguments, then the constexprs in the kernel's parameter order; grid made 3-D
    assert k.compiled.calls == [((2, 3, 1), (a, b, 100, 7, 64, 32))] and len(k.slow) == 1
    launch(k, lambda c: (2, 3), c, a, b, 101, X=7)  # another integer: Triton's path again
    launch(k, lambda c: (2, 3), c, a, b[1:], 100, X=7)  # another alignment: again
    assert len(k.slow) == 3 and len(k.compiled.calls) == 1


class FakeJitTwoConstexprs:
    """A JIT function with parameters (A, N, C, D): two runtime, two constexpr."""

    arg_names = ["A", "N", "C", "D"]

    def __init__(self):
        self.slow, self.compiled = [], FakeCompiled()

    def __getitem__(self, grid):
        def run(*args, num_warps, **constexprs):
            self.slow.append((grid, args, constexprs, num_warps))
            return self.compiled
        return run


def test_fastpath_launch_reuses_a_kernel_only_for_what_triton_specialises_alike(monkeypatch):
    """The one launch every kernel of the library goes through on a GPU (the Triton kernels'
    launcher, the decode kernels, the Gluon ones): any difference goes back to Triton."""
    monkeypatch.setattr(_boot, "INTERPRETING", False)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(fastpath, "COMPILED", {})
    k, a = FakeJitTwoConstexprs(), torch.zeros(8)
    assert fastpath.launch(k, (2, 3), (a, 100), dict(D=5, C=7), num_warps=4) is k.compiled
    assert len(k.slow) == 1 and not k.compiled.calls
    assert fastpath.launch(k, (2, 3), (a, 100), dict(D=5, C=7), num_warps=4) is k.compiled
    # runtime arguments, then the constexprs in the kernel's parameter order; grid made 3-D
    assert k.compiled.calls == [((2, 3, 1), (a, 100, 7, 5))] and len(k.slow) == 1
    fastpath.launch(k, (2, 3), (a, 101), dict(D=5, C=7), num_warps=4)  # another integer
    fastpath.launch(k, (2, 3), (a[1:], 100), dict(D=5, C=7), num_warps=4)  # another alignment
    fastpath.launch(k, (2, 3), (a, 100), dict(D=6, C=7), num_warps=4)  # another constexpr
    fastpath.launch(k, (2, 3), (a, 100), dict(D=5, C=7), num_warps=8)  # another launch option
    assert len(k.slow) == 5 and len(k.compiled.calls) == 1
    monkeypatch.setattr(_boot, "INTERPRETING", True)  # the interpreter: Triton's path
    fastpath.launch(k, (2, 3), (a, 100), dict(D=5, C=7), num_warps=4)
    assert len(k.slow) == 6 and len(k.compiled.calls) == 1


@gpu
def test_fast_path_matches_tritons_own_launch_and_follows_alignment():
    from flashtext.kernels.forward import forward

    q, k, v = (_rand(2, 3, 200, 64, dtype=torch.float16, seed=s) for s in range(3))
    fastpath.COMPILED.clear()
    first = forward(q, k, v, True, 0.125)  # Triton's launch path; remembers the kernel
    assert fastpath.COMPILED
    second = forward(q, k, v, True, 0.125)  # the fast path
    assert all(torch.equal(x, y) for x, y in zip(first, second, strict=True))
    # a view 2 bytes off alignment must not reuse the aligned kernel: compare to the reference
    buf = torch.empty(q.numel() + 1, dtype=q.dtype, device=q.device)
    q_odd = buf[1:].view_as(q)
    q_odd.copy_(q)
    entries = len(fastpath.COMPILED)
    for _ in range(2):
        o_odd, _ = forward(q_odd, k, v, True, 0.125)
    assert len(fastpath.COMPILED) == entries + 1
    assert torch.allclose(o_odd.float(), first[0].float(), atol=2e-3, rtol=0)
