"""The sandbox kernel checkers run readers' kernels in: poisoned inputs, guarded outputs, and
(under the interpreter) every access checked before it happens, so no wrong kernel can take the
process down."""

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import triton
import triton.language as tl

from flashtext.exercises import ExerciseFailed, kernel_checks
from flashtext.exercises.kernel_checks import CANARY, Sandbox
from tests.exercises.harness import needs_interpreter

ROOT = Path(__file__).resolve().parents[2]


@triton.jit
def copy_kernel(X, OUT, n, SHIFT: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(OUT + offs + SHIFT, tl.load(X + offs, mask=mask), mask=mask)


@triton.jit
def into_input(X, OUT, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(X + offs, tl.zeros([BLOCK], dtype=tl.float32), mask=offs < n)


@triton.jit
def row_reader(X, OUT, stride, n_cols, BLOCK: tl.constexpr):
    cols = tl.arange(0, BLOCK)
    x = tl.load(X + tl.program_id(0) * stride + cols, mask=cols < n_cols + 1, other=0.0)
    tl.store(OUT + tl.program_id(0), tl.sum(x, axis=0))


def _box(n=100):
    box = Sandbox("a test case")
    x = box.input("X", torch.arange(n, dtype=torch.float32))
    out = box.output("OUT", (n,))
    return box, x, out


@needs_interpreter
def test_a_right_kernel_runs_and_leaves_no_patch_behind():
    from triton.runtime import interpreter

    box, x, out = _box()
    box.launch(copy_kernel, (2,), x, out, 100, SHIFT=0, BLOCK=64)
    assert torch.equal(out, x)
    assert "create_masked_store" not in vars(interpreter.interpreter_builder)


@needs_interpreter
@pytest.mark.parametrize("shift, where", [(1, "OUT[100], past the end of OUT (100 elements)"),
                                          (-1, "OUT[-1], before the start of OUT")])
def test_a_store_just_outside_is_stopped_before_it_happens(shift, where):
    box, x, out = _box()
    with pytest.raises(ExerciseFailed, match=r"a test case: your kernel wrote") as failure:
        box.launch(copy_kernel, (2,), x, out, 100, SHIFT=shift, BLOCK=64)
    assert where in str(failure.value)
    guard = box.regions[1].buffer.cpu()
    assert guard[box.guard + 100] == CANARY and guard[box.guard - 1] == CANARY  # never written


@needs_interpreter
def test_a_store_far_away_is_stopped_and_named():
    box, x, out = _box()
    with pytest.raises(ExerciseFailed, match=r"wrote an address that belongs to none of its "
                                             r"tensors.*elements away"):
        box.launch(copy_kernel, (2,), x, out, 100, SHIFT=10_000_000, BLOCK=64)


def test_without_the_monitor_the_guards_still_catch_a_store_past_the_end(monkeypatch):
    """What a GPU run relies on: the canaries around an output."""
    monkeypatch.setattr(kernel_checks, "interpreting", lambda: False)
    box, x, out = _box()
    with pytest.raises(ExerciseFailed, match=r"wrote outside OUT \(1 element\(s\); the first "
                                             r"is OUT\[100\], past the end"):
        box.launch(copy_kernel, (2,), x, out, 100, SHIFT=1, BLOCK=64)


def test_without_the_monitor_a_write_into_an_input_is_caught(monkeypatch):
    monkeypatch.setattr(kernel_checks, "interpreting", lambda: False)
    box, x, out = _box()
    with pytest.raises(ExerciseFailed, match=r"wrote into X .*inputs are read-only"):
        box.launch(into_input, (1,), x, out, 100, BLOCK=128)


@needs_interpreter
def test_a_read_into_the_row_padding_names_the_row_and_column():
    box = Sandbox("rows of 5 with a row stride of 8")
    x = box.input("X", torch.ones(3, 5), pad=(0, 3), dims=("row", "column"))
    out = box.output("OUT", (3,), dims=("row",))
    assert x.stride() == (8, 1)
    with pytest.raises(ExerciseFailed, match=r"read X\[0, 5\], past the last column of X "
                                             r"\(X has 5 columns"):
        box.launch(row_reader, (3,), x, out, 8, 5, BLOCK=8)


def test_layouts_put_views_where_they_say():
    box = Sandbox("layouts")
    t = box.input("T", torch.arange(6.0).reshape(2, 3), order=(1, 0))
    p = box.output("P", (2, 3), pad=(1, 2))
    want = torch.arange(6.0).reshape(2, 3).to(t.device)  # the sandbox's device (GPU or CPU)
    assert t.stride() == (1, 2) and torch.equal(t, want)
    assert p.stride() == (5, 1) and bool((p == CANARY).all())
    region = box.regions[0]
    outside = ~torch.from_numpy(region.valid).to(region.buffer.device)
    assert int(region.valid.sum()) == 6 and torch.isnan(region.buffer[outside]).all()
    # everything around the view is poison


@needs_interpreter
def test_far_out_of_bounds_kernels_cannot_crash_a_notebook():
    """The two kinds of kernel that used to kill Python ("double free or corruption"): an
    unmasked store of a small output (LSE) and a store with a wild offset, run through check()
    in a fresh interpreter, end in a message and exit code 0."""
    script = textwrap.dedent('''
        import triton
        import triton.language as tl
        from flashtext.exercises import ExerciseFailed, check

        @triton.jit
        def far_store(X, Y, OUT, n, alpha, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            tl.store(OUT + offs * 123_456_789, tl.load(X + offs, mask=offs < n), mask=offs < n)

        @triton.jit
        def lse_unmasked(X, OUT, stride_row, n_cols, BLOCK: tl.constexpr):
            cols = tl.arange(0, BLOCK)
            x = tl.load(X + tl.program_id(0) * stride_row + cols, mask=cols < n_cols,
                        other=float("-inf"))
            tl.store(OUT + tl.program_id(0) * 1000 + cols, x)  # every lane, far past OUT

        for name, kernel in (("ch09.axpy", far_store), ("ch09.row_logsumexp", lse_unmasked)):
            try:
                check(name, kernel)
            except ExerciseFailed as failure:
                print("REJECTED", name, str(failure).splitlines()[0][:200])
        print("ALIVE")
    ''')
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                          text=True, timeout=300,
                          env={**__import__("os").environ, "FLASHTEXT_PROGRESS_FILE": "off"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.count("REJECTED") == 2 and "ALIVE" in done.stdout, done.stdout
    assert "your kernel wrote" in done.stdout
