"""Checking a reader's Triton kernel, and never letting a wrong one take the process down.

A kernel exercise hands the checker a ``@triton.jit`` function. The checker lays out every input
and output in a :class:`Sandbox`:

* each **input** is a view inside a larger buffer filled with NaN ("poison"): a guard region on
  both sides, and optionally padding between rows or heads, so that the tensor's strides are
  not the contiguous ones and a kernel that ignores a stride reads poison;
* each **output** is a view inside a larger buffer filled with a canary value, with the same
  guard regions and padding: after the launch, any canary that changed outside the view is a
  store out of bounds, reported with the output's name and the index it hit.

Under Triton's interpreter (the CPU path) a load or store at a stray address is worse than a
wrong number: it reads or writes raw process memory, and a store past the end of a small
buffer corrupts the heap ("double free or corruption", the Jupyter kernel dies). So
:meth:`Sandbox.launch` watches the interpreter: before every ``tl.load``, ``tl.store`` or atomic
it checks each active lane's address against the views it handed out, and stops the kernel
with a message naming the tensor and the index ("your kernel read Q[1, 17, 0], past the last
row of Q") *before* the access happens. A read past the end that never reaches the output, and
a store far out of bounds, are caught the same way. Compiled on a GPU the monitor cannot run;
the poison and canaries still catch what lands near the tensors.
"""

from __future__ import annotations

import contextlib
import inspect
import math
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

import flashtext
from flashtext.exercises.core import ExerciseFailed, NotAttempted, describe

CANARY = -12345.0  # what an output holds before the kernel writes it (exact in fp32)
GUARD = 4096  # elements of guard region on each side of a buffer: more than any block here


def device() -> str:
    return flashtext.torch_device()


def interpreting() -> bool:
    """True where kernels run under Triton's interpreter (no CUDA device, or forced)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def tf32_tolerance(cpu: float) -> float:
    """A tolerance for checks of fp32 ``tl.dot``: on a GPU, Triton rounds fp32 dot inputs to
    TF32 (10-bit mantissa) unless asked for "ieee", so a correct kernel is only ~1e-3 exact."""
    return max(cpu, 5e-3) if flashtext.on_gpu() else cpu


@contextlib.contextmanager
def exact_fp32_dots(kernel) -> Iterator[None]:
    """Compile ``kernel`` with exact fp32 ``tl.dot`` (``TRITON_F32_DEFAULT=ieee``) while checking.

    On a GPU, Triton rounds fp32 dot inputs to TF32 by default: a score near 1000 then moves by
    ~0.5, which no tolerance can tell from a wrong answer. The environment variable is part of
    Triton's compilation cache key; the in-memory cache of this one kernel is cleared so that it
    is compiled again, under the variable and after it. The interpreter ignores it (NumPy fp32).
    """
    old = os.environ.get("TRITON_F32_DEFAULT")
    os.environ["TRITON_F32_DEFAULT"] = "ieee"
    caches = getattr(kernel, "device_caches", None)
    if caches is not None:
        caches.clear()
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("TRITON_F32_DEFAULT", None)
        else:
            os.environ["TRITON_F32_DEFAULT"] = old
        if caches is not None:
            caches.clear()


def require_kernel(kernel) -> None:
    """Report an untouched stub as not attempted, and refuse what is not a Triton kernel."""
    fn = getattr(kernel, "fn", kernel)
    try:
        source = inspect.getsource(fn)
    except (OSError, TypeError):
        source = ""
    if "raise NotImplementedError" in source:
        raise NotAttempted
    if not (hasattr(kernel, "fn") and hasattr(kernel, "__getitem__")):
        what = (f"the plain function {kernel.__name__}" if callable(kernel)
                and hasattr(kernel, "__name__") else describe(kernel))
        raise ExerciseFailed(f"expected a @triton.jit function, got {what}; put @triton.jit on "
                             "the line above `def`.")


# --------------------------------------------------------------------------------- layouts

@dataclass
class _Region:
    """One tensor handed to the kernel: its view, the buffer around it, and which of the
    buffer's elements belong to the view."""
    name: str
    role: str  # "input" (read only) or "output"
    buffer: torch.Tensor  # flat
    view: torch.Tensor
    physical: tuple[int, ...]  # the padded array the view sits in, outermost dimension first
    order: tuple[int, ...]  # logical dimension of each physical one
    dims: tuple[str, ...]  # names of the logical dimensions, for messages
    guard: int
    valid: np.ndarray = field(repr=False)  # bool, one per element of buffer
    lo: int = 0  # byte address of buffer[0]
    before: torch.Tensor | None = field(default=None, repr=False)  # the buffer before launch

    @property
    def itemsize(self) -> int:
        return self.buffer.element_size()

    def place(self, element: int) -> str:
        """Where element ``element`` of the buffer is, relative to the view, in words."""
        shape = tuple(self.view.shape)
        inside = element - self.guard
        size = math.prod(self.physical)
        if inside < 0 or inside >= size:
            if len(shape) == 1 and self.physical == shape:
                side = "before the start" if inside < 0 else "past the end"
                count = f"{shape[0]} element" + ("s" if shape[0] != 1 else "")
                return f"{self.name}[{inside}], {side} of {self.name} ({count})"
            dims = " x ".join(str(s) for s in shape)
            if inside < 0:
                return f"the element {-inside} before the start of {self.name} ({dims})"
            return f"the element {inside - size + 1} past the end of {self.name} ({dims})"
        phys = np.unravel_index(inside, self.physical)
        index = [0] * len(shape)
        for p, d in enumerate(self.order):
            index[d] = int(phys[p])
        over = [d for d in range(len(shape)) if index[d] >= shape[d]]
        at = f"{self.name}[{', '.join(str(i) for i in index)}]"
        if not over:
            return at
        d = over[0]
        plural = "s" if shape[d] != 1 else ""
        return (f"{at}, past the last {self.dims[d]} of {self.name} ({self.name} has "
                f"{shape[d]} {self.dims[d]}{plural} there; the memory after them is not its)")


def _layout(shape: Sequence[int], pad: Sequence[int] | None, order: Sequence[int] | None
            ) -> tuple[tuple[int, ...], tuple[int, ...]]:
    shape = tuple(int(s) for s in shape)
    pad = tuple(pad) if pad is not None else (0,) * len(shape)
    order = tuple(order) if order is not None else tuple(range(len(shape)))
    if len(pad) != len(shape) or sorted(order) != list(range(len(shape))):
        raise ValueError(f"pad {pad} and order {order} must match the shape {shape}")
    padded = tuple(s + p for s, p in zip(shape, pad, strict=True))
    return tuple(padded[d] for d in order), order


class Sandbox:
    """Inputs and outputs for launches of a reader's kernel, laid out so that stray accesses
    are caught (see the module docstring). One sandbox per case; ``launch`` may run once."""

    def __init__(self, case: str, guard: int = GUARD):
        self.case = case  # the input, in words: every message starts with it
        self.guard = guard
        self.regions: list[_Region] = []

    def _region(self, name: str, role: str, shape: Sequence[int], dtype: torch.dtype,
                fill: float, pad, order, dims) -> _Region:
        physical, order = _layout(shape, pad, order)
        size = math.prod(physical)
        buffer = torch.full((size + 2 * self.guard,), fill, dtype=dtype, device=device())
        phys_view = buffer[self.guard:self.guard + size].view(physical)
        inverse = tuple(order.index(d) for d in range(len(order)))
        view = phys_view.permute(inverse)[tuple(slice(0, s) for s in shape)]
        positions = torch.arange(buffer.numel()).as_strided(view.shape, view.stride(),
                                                             view.storage_offset())
        valid = np.zeros(buffer.numel(), dtype=bool)
        valid[positions.reshape(-1).numpy()] = True
        default = {1: ("element",), 2: ("row", "column"), 3: ("head", "row", "column")}
        names = tuple(dims) if dims else default.get(len(shape), tuple(
            f"dimension-{d} index" for d in range(len(shape))))
        region = _Region(name, role, buffer, view, physical, order, names, self.guard, valid,
                         buffer.data_ptr())
        self.regions.append(region)
        return region

    def input(self, name: str, values: torch.Tensor, *, pad: Sequence[int] | None = None,
              order: Sequence[int] | None = None, dims: Sequence[str] | None = None
              ) -> torch.Tensor:
        """``values`` as a view inside a NaN-filled buffer (``pad``: extra elements along each
        dimension; ``order``: the dimensions from outermost to innermost in memory)."""
        region = self._region(name, "input", values.shape, values.dtype, float("nan"), pad,
                              order, dims)
        region.view.copy_(values.to(region.view.device))
        return region.view

    def output(self, name: str, shape: Sequence[int], dtype: torch.dtype = torch.float32, *,
               pad: Sequence[int] | None = None, order: Sequence[int] | None = None,
               dims: Sequence[str] | None = None) -> torch.Tensor:
        """A canary-filled view of ``shape`` for the kernel to write."""
        return self._region(name, "output", shape, dtype, CANARY, pad, order, dims).view

    # ------------------------------------------------------------------------- launching

    def launch(self, kernel, grid, *args, **kwargs) -> None:
        """Run ``kernel[grid](*args, **kwargs)``; raise ExerciseFailed for any access outside
        the views (caught before it happens under the interpreter, after it on a GPU), for a
        write into an input, or for an error inside the kernel."""
        for region in self.regions:
            region.before = region.buffer.clone()
        monitor = _Monitor(self.regions) if interpreting() else None
        try:
            with np.errstate(all="ignore"), (monitor or contextlib.nullcontext()):
                kernel[grid](*args, **kwargs)
        except ExerciseFailed:
            raise
        except Exception as exc:
            if monitor is not None and monitor.violation:
                raise ExerciseFailed(f"{self.case}: {monitor.violation}") from None
            raise ExerciseFailed(f"{self.case}: {_kernel_error(exc)}") from None
        if monitor is not None and monitor.violation:  # raised inside, swallowed by the kernel
            raise ExerciseFailed(f"{self.case}: {monitor.violation}")
        self._check_untouched()

    def _check_untouched(self) -> None:
        for region in self.regions:
            now, before = region.buffer.cpu(), region.before.cpu()
            changed = ~((now == before) | (torch.isnan(now) & torch.isnan(before))).numpy()
            if region.role == "output":
                changed &= ~region.valid
            hits = np.flatnonzero(changed)
            if hits.size:
                what = ("wrote into", "an input: inputs are read-only") \
                    if region.role == "input" else ("wrote outside", "mask the store")
                raise ExerciseFailed(
                    f"{self.case}: your kernel {what[0]} {region.name} ({hits.size} element(s); "
                    f"the first is {region.place(int(hits[0]))}): {what[1]}.")


def _kernel_error(exc: BaseException) -> str:
    cause = exc.__cause__ or exc
    text = f"{type(cause).__name__}: {cause}".strip()
    return f"your kernel raised {text}"


class _Monitor:
    """Patch the interpreter's memory operations to check every active lane's address first."""

    def __init__(self, regions: list[_Region]):
        self.regions = regions
        self.violation: str | None = None

    def __enter__(self):
        from triton.runtime import interpreter

        self.builder = builder = interpreter.interpreter_builder
        load, store = builder.create_masked_load, builder.create_masked_store
        rmw, cas = builder.create_atomic_rmw, builder.create_atomic_cas

        def create_masked_load(ptrs, mask, other, *a, **k):
            self.check(ptrs.data, mask.data, "read")
            return load(ptrs, mask, other, *a, **k)

        def create_masked_store(ptrs, value, mask, *a, **k):
            self.check(ptrs.data, mask.data, "wrote")
            return store(ptrs, value, mask, *a, **k)

        def create_atomic_rmw(op, ptr, val, mask, *a, **k):
            self.check(ptr.data, mask.data, "wrote")
            return rmw(op, ptr, val, mask, *a, **k)

        def create_atomic_cas(ptr, cmp, val, *a, **k):
            self.check(ptr.data, np.ones(np.shape(ptr.data), dtype=bool), "wrote")
            return cas(ptr, cmp, val, *a, **k)

        self.patched = {"create_masked_load": create_masked_load,
                        "create_masked_store": create_masked_store,
                        "create_atomic_rmw": create_atomic_rmw,
                        "create_atomic_cas": create_atomic_cas}
        for name, fn in self.patched.items():
            setattr(builder, name, fn)  # an instance attribute shadows the method
        return self

    def __exit__(self, *exc) -> None:
        for name in self.patched:
            with contextlib.suppress(AttributeError):
                delattr(self.builder, name)

    def check(self, ptrs: np.ndarray, mask: np.ndarray, verb: str) -> None:
        ptrs = np.asarray(ptrs, dtype=np.uint64)
        active = ptrs[np.broadcast_to(np.asarray(mask, dtype=bool), ptrs.shape)].ravel()
        if active.size == 0:
            return
        unmatched = np.ones(active.size, dtype=bool)
        for region in self.regions:
            lo, size = region.lo, region.buffer.numel() * region.itemsize
            inside = (active >= np.uint64(lo)) & (active < np.uint64(lo + size))
            if not inside.any():
                continue
            unmatched &= ~inside
            rel = (active[inside] - np.uint64(lo)).astype(np.int64)
            elements = rel // region.itemsize
            ok = (rel % region.itemsize == 0) & region.valid[elements]
            if verb == "wrote" and region.role == "input":
                ok[:] = False
            if not ok.all():
                self.fail(verb, region, int(elements[np.argmin(ok)]))
        if unmatched.any():
            self.fail_wild(verb, int(active[np.argmax(unmatched)]))

    def _program(self) -> str:
        idx = tuple(int(i) for i in self.builder.grid_idx)
        return f"program {idx}"

    def fail(self, verb: str, region: _Region, element: int) -> None:
        where = region.place(element)
        if verb == "wrote" and region.role == "input":
            advice = f"{region.name} is an input, which a kernel only reads."
        elif verb == "read":
            advice = ("a tl.load without a mask, or with one that lets through lanes past the "
                      "end? (or a stride that is not the one given)")
        else:
            advice = "a tl.store without a mask, or with the wrong one?"
        self.violation = (f"your kernel {verb} {where} ({self._program()}): {advice} The "
                          "checker stopped the kernel before that access.")
        raise ExerciseFailed(self.violation)

    def fail_wild(self, verb: str, address: int) -> None:
        def distance(r: _Region) -> int:
            hi = r.lo + r.buffer.numel() * r.itemsize
            return r.lo - address if address < r.lo else address - hi
        nearest = min(self.regions, key=distance)
        away = distance(nearest) // nearest.itemsize + nearest.guard
        side = "before its start" if address < nearest.lo else "past its end"
        self.violation = (
            f"your kernel {verb} an address that belongs to none of its tensors "
            f"({self._program()}; the nearest, {nearest.name}, is {away:,} elements away, "
            f"{side}): a pointer offset far out of range (a wrong stride or program id, "
            "or a missing mask?). The checker stopped the kernel before that access, which "
            "could have corrupted memory.")
        raise ExerciseFailed(self.violation)


# ----------------------------------------------------------------------------- comparing

def compare(got: torch.Tensor | np.ndarray, want: np.ndarray, case: str, what: str,
            rtol: float, atol: float) -> None:
    """Yours against expected: the first index that differs, and a window of both around it."""
    if hasattr(got, "detach"):
        got = got.detach().cpu().numpy()
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    if got.shape != want.shape:
        raise ExerciseFailed(f"{case}: {what} has shape {got.shape}, expected {want.shape}.")
    both_inf = np.isinf(want) & (got == want)
    ok = both_inf | np.isclose(got, want, rtol=rtol, atol=atol)
    if ok.all():
        return
    bad = np.argwhere(~ok)
    first = tuple(int(i) for i in bad[0])
    g, w = float(got[first]), float(want[first])
    hint = ""
    if np.isnan(g):
        hint = (" (NaN: inf - inf, an overflow, or a load of the NaN the checker puts around "
                "and between its inputs?)")
    elif g == CANARY:
        hint = " (never written: is the grid covered, and is your program_id used?)"
    flat = int(np.ravel_multi_index(first, want.shape))
    lo = max(0, flat - 3)
    window = slice(lo, lo + 8)
    raise ExerciseFailed(
        f"{case}: in {what}, the entry at index {first} is wrong: expected {w:.6g}, got "
        f"{g:.6g}{hint}; {len(bad)} of {want.size} entries differ.\n"
        f"  yours    [{lo}:]: {np.array2string(got.ravel()[window], precision=4)}\n"
        f"  expected [{lo}:]: {np.array2string(want.ravel()[window], precision=4)}")
