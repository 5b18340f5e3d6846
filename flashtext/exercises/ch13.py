"""Chapter 13's exercises: the exponential's share of the matmul time, and the fast
Walsh-Hadamard transform behind FP8 incoherent processing."""

from __future__ import annotations

import numpy as np

from flashtext import fp8
from flashtext.exercises.core import exercise, expect, expect_close
from flashtext.exercises.rules import peak_allocation


@exercise(
    "ch13.exp_time_fraction",
    "How long the exponentials take next to the matmuls",
    hints=(
        "Per score there is one exponential. How many matmul FLOPs per score? Q K^T costs 2d "
        "per score (d multiply-adds), and P V costs as much again.",
        "Time = work / rate, for each unit: exps / exp_flops and matmul FLOPs / matmul_flops.",
        "(1 / exp_flops) / (4 d / matmul_flops) = matmul_flops / (4 d exp_flops).",
    ),
)
def check_exp_time_fraction(fn) -> None:
    cases = [(64, 989e12, 3.9e12), (128, 989e12, 3.9e12), (256, 989e12, 3.9e12),
             (128, 312e12, 19.5e12 / 4), (80, 750e12, 3.9e12), (1, 1.0, 1.0)]
    for d, mm, ex in cases:
        expected = mm / (4 * d * ex)
        expect_close(fn(d, mm, ex), expected, what="the exp / matmul time ratio",
                     case=f"d={d}, matmul_flops={mm:g}, exp_flops={ex:g}", rtol=1e-9, atol=0)


def _inputs(rng: np.random.Generator):
    for n in (1, 2, 4, 8, 64, 128):
        yield f"one vector of length {n}", rng.standard_normal(n)
        yield f"3 rows of length {n}", rng.standard_normal((3, n))
    spike = np.zeros(16)
    spike[3] = 100.0
    yield "a single outlier (100 at index 3) in a length-16 vector", spike
    yield "2 x 5 x 32 (leading batch axes)", rng.standard_normal((2, 5, 32))


RULE_N = 2048  # the length on which "no n x n matrix" is checked


@exercise(
    "ch13.fwht",
    "The fast Walsh-Hadamard transform",
    hints=(
        "Work on the last axis. For h = 1, 2, 4, ... < n: inside every block of 2h entries, pair "
        "entry i with entry i + h and replace them by (a + b, a - b).",
        "With NumPy: reshape to (..., n / (2h), 2, h), take [..., 0, :] and [..., 1, :], stack "
        "their sum and difference on the axis of size 2, reshape back.",
        "log2(n) rounds of butterflies compute x @ H_n for the unnormalised Hadamard matrix; "
        "divide by sqrt(n) at the end so that the transform is orthogonal.",
    ),
)
def check_fwht(fn) -> None:
    rng = np.random.default_rng(13)
    for case, x in _inputs(rng):
        got = fn(x.copy())
        expect(got is not None, f"{case}: your function returned None. Did you forget `return`?")
        expect_close(got, fp8.fwht(x), what="the transform of x", case=case, rtol=1e-9,
                     atol=1e-9)
    # the stated rule: O(n log n) butterflies, no n x n matrix (dense, it would be 32 MB here)
    n = RULE_N
    x = rng.standard_normal(n)
    got, peak = peak_allocation(fn, x.copy())
    expect(peak < n * n * 8 // 32,
           f"a vector of length {n}: your function allocated {peak / 1e6:.1f} MB at its peak, "
           f"on the scale of the {n} x {n} Hadamard matrix ({n * n * 8 / 1e6:.1f} MB in "
           "float64). The fast transform needs no matrix: only log2(n) rounds of butterflies "
           "on the vector itself, O(n log n) work.")
    expect_close(got, fp8.fwht(x), what="the transform of x", case=f"a vector of length {n}",
                 rtol=1e-9, atol=1e-9)
    # the point of the exercise: with the same random signs on Q and K, Q K^T is unchanged
    q, k = rng.standard_normal((6, 64)), rng.standard_normal((9, 64))
    signs = fp8.random_signs(64, rng)
    qr, kr = fn(q * signs), fn(k * signs)
    expect_close(np.asarray(qr) @ np.asarray(kr).T, q @ k.T, what="Q' K'^T after the rotation",
                 case="Q (6 x 64), K (9 x 64), the same random signs on both", rtol=1e-9,
                 atol=1e-9)


class _Barrier:
    """An mbarrier as chapter 13 models it: a phase completes after ``count`` arrivals, and a
    wait for parity p passes once the phase of parity p has completed (a fresh barrier is in
    phase 0, so a wait for parity 1 passes at once)."""

    def __init__(self, count: int):
        self.count, self.arrivals, self.completed = count, 0, 0

    def arrive(self) -> None:
        self.arrivals += 1
        if self.arrivals == self.count:
            self.arrivals, self.completed = 0, self.completed + 1

    def passes(self, parity: int) -> bool:
        return self.completed % 2 != parity


def ds_exchange(waits, n_buffers: int, total: int, seed: int, last_wait: bool = True) -> str:
    """The fused-dQ kernel's dS exchange between its two consumer warpgroups, interleaved at
    random: for tile t each writes its dS half into buffer ``b`` once ``ds_free[b]`` passes
    ``free_parity``, arrives on ``ds_ready[b]``, waits for it to pass ``ready_parity`` (both
    halves written), multiplies the buffer by both halves of K, then arrives on ``ds_free[b]``,
    where ``(b, free_parity, ready_parity) = waits(t, n_buffers)``. After its last tile a
    warpgroup writes dK over its own K half, first waiting (``last_wait``) for ``ds_free`` of
    the last tile's buffer with that tile's ready parity, as the kernel does. Returns "ok" or
    what went wrong."""
    ready = [_Barrier(2) for _ in range(n_buffers)]
    free = [_Barrier(2) for _ in range(n_buffers)]
    halves = [[None, None] for _ in range(n_buffers)]  # the tile each half of a buffer holds
    reading: list[set[int]] = [set() for _ in range(n_buffers)]
    k_reading: set[int] = set()
    k_is_dk = [False, False]
    errors: list[str] = []
    where = ["", ""]

    def warpgroup(w: int):
        other = 1 - w
        for t in range(total):
            b, free_parity, ready_parity = waits(t, n_buffers)
            where[w] = f"warpgroup {w} waits at tile {t} for buffer {b} to be free"
            while not free[b].passes(free_parity):
                yield
            if other in reading[b]:
                errors.append(f"tile {t}: warpgroup {w} wrote its dS half into buffer {b} "
                              f"while warpgroup {other} was still multiplying tile "
                              f"{halves[b][other]}'s from it")
            halves[b][w] = t
            yield
            ready[b].arrive()
            where[w] = f"warpgroup {w} waits at tile {t} for both halves in buffer {b}"
            while not ready[b].passes(ready_parity):
                yield
            if halves[b] != [t, t]:
                errors.append(f"tile {t}: warpgroup {w} multiplied buffer {b} holding the "
                              f"halves of tiles {halves[b]}, not both of tile {t}")
            if any(k_is_dk):
                errors.append(f"tile {t}: warpgroup {w} multiplied by a K half already "
                              "overwritten with dK")
            reading[b].add(w)
            k_reading.add(w)
            yield  # its dQ GEMM reads the buffer and both halves of K meanwhile
            if halves[b] != [t, t]:
                errors.append(f"tile {t}: buffer {b} changed under warpgroup {w}'s dQ GEMM "
                              f"(it now holds tiles {halves[b]})")
            reading[b].discard(w)
            k_reading.discard(w)
            free[b].arrive()
            yield
        if last_wait and total:
            b, _, ready_parity = waits(total - 1, n_buffers)
            where[w] = f"warpgroup {w} waits, after its last tile, for buffer {b} to be free"
            while not free[b].passes(ready_parity):
                yield
        where[w] = ""
        if other in k_reading:
            errors.append(f"warpgroup {w} wrote dK over its K half while warpgroup {other}'s "
                          "last dQ GEMM was still reading it")
        k_is_dk[w] = True
        yield

    order = np.random.default_rng(seed)
    actors = [warpgroup(0), warpgroup(1)]
    for _ in range(100 * (total + 2)):
        if errors or not actors:
            return errors[0] if errors else "ok"
        pick = int(order.integers(len(actors)))
        try:
            next(actors[pick])
        except StopIteration:
            actors.pop(pick)
    return "hangs: " + "; ".join(w for w in where if w)


def _checked_waits(fn):
    """``fn`` wrapped so that a malformed answer fails with a message, not deep in the model."""
    def waits(t: int, n_buffers: int):
        got = fn(t, n_buffers)
        ok = isinstance(got, tuple | list) and len(got) == 3 and all(
            isinstance(x, int | np.integer) and not isinstance(x, bool) for x in got)
        expect(got is not None, f"ds_waits({t}, {n_buffers}) returned None. Did you forget "
                                "`return`?")
        expect(ok and 0 <= got[0] < n_buffers and got[1] in (0, 1) and got[2] in (0, 1),
               f"ds_waits({t}, {n_buffers}) returned {got!r}: expected (buffer, free_parity, "
               f"ready_parity), a buffer in 0..{n_buffers - 1} and two parities, 0 or 1")
        return tuple(int(x) for x in got)
    return waits


@exercise(
    "ch13.ds_waits",
    "The dS exchange of the fused dQ",
    hints=(
        "Tile t uses buffer t % n_buffers, for the (t // n_buffers)-th time. Each use completes "
        "one phase of that buffer's ds_ready (when both halves are in) and one of its ds_free "
        "(when both warpgroups have read it).",
        "Waiting for both halves of use u means waiting for ds_ready's phase u to complete: "
        "parity u & 1.",
        "Before writing use u, use u - 1 must have been read: ds_free's phase u - 1, parity "
        "(u - 1) & 1 = (u & 1) ^ 1. For u = 0 that is parity 1, which a fresh barrier passes "
        "at once.",
    ),
)
def check_ds_waits(fn) -> None:
    waits = _checked_waits(fn)
    for n_buffers in (1, 2, 3):
        for t in range(7):
            waits(t, n_buffers)  # the shape of every answer first
    for n_buffers in (2, 1, 3):
        for total in (1, 2, 3, 5, 9):
            for seed in range(30):
                outcome = ds_exchange(waits, n_buffers, total, seed)
                expect(outcome == "ok", f"{n_buffers} buffer(s), {total} tile(s), "
                                        f"interleaving {seed}: {outcome}")


def _layouts():
    """(name, shape, strides, element_size, offset_bytes) of layouts models hand a kernel."""
    for dtype_name, size in (("fp16", 2), ("fp32", 4)):
        for d in (64, 128, 36, 40, 72):
            b, h, n = 2, 4, 96
            yield (f"{dtype_name} (batch, heads, seq, {d}) contiguous", (b, h, n, d),
                   (h * n * d, n * d, d, 1), size, 0)
            yield (f"{dtype_name} (batch, seq, heads, {d}) storage seen as (batch, heads, seq, "
                   f"{d})", (b, h, n, d), (n * h * d, d, h * d, 1), size, 0)
            yield (f"{dtype_name} d = {d}, rows 5: of the sequence (a slice)", (b, h, n - 5, d),
                   (h * n * d, n * d, d, 1), size, 5 * d * size)
            yield (f"{dtype_name} d = {d}, K/V heads expanded to 4 query heads (stride 0)",
                   (b, h, n, d), (n * d, 0, d, 1), size, 0)
        yield (f"{dtype_name} the first 64 of a 128-wide head dimension (a slice)",
               (2, 4, 96, 64), (4 * 96 * 128, 96 * 128, 128, 1), size, 0)
        yield (f"{dtype_name} the last 64 of a 128-wide head dimension (a slice)",
               (2, 4, 96, 64), (4 * 96 * 128, 96 * 128, 128, 1), size, 64 * size)
        yield (f"{dtype_name} every other element of a 128-wide head dimension (a step-2 slice)",
               (2, 4, 96, 64), (4 * 96 * 128, 96 * 128, 128, 2), size, 0)
        yield (f"{dtype_name} head dimension not innermost (a transposed view)",
               (2, 4, 96, 64), (4 * 96 * 64, 96 * 64, 1, 96), size, 0)
        yield (f"{dtype_name} one element past an aligned base", (2, 4, 96, 64),
               (4 * 96 * 64, 96 * 64, 64, 1), size, size)


def _library_rule(shape, strides, element_size: int, offset_bytes: int) -> bool:
    """``flashtext.kernels.descriptors.tma_ok`` on a real tensor of that layout (a view into
    a CPU buffer, whose base the allocator aligns to 64 bytes)."""
    import torch

    from flashtext.kernels.descriptors import tma_ok

    dtype = {2: torch.float16, 4: torch.float32}[element_size]
    reach = sum((n - 1) * s for n, s in zip(shape, strides, strict=True))
    extent = offset_bytes // element_size + 1 + reach
    base = torch.empty(extent, dtype=dtype)
    assert base.data_ptr() % 64 == 0
    return tma_ok(base.as_strided(shape, strides, offset_bytes // element_size))


@exercise(
    "ch13.copy_engine_ok",
    "Which tiles can the copy engine fetch?",
    hints=(
        "Three conditions, all in bytes: the base address (offset_bytes here) a multiple of 16; "
        "the last stride exactly 1 element; every other stride positive and, times "
        "element_size, a multiple of 16.",
        "A stride of 0 (an expanded head axis) is not positive: a descriptor cannot step by 0 "
        "bytes. A stride of 36 fp16 elements is 72 bytes: not a multiple of 16.",
        "return offset_bytes % 16 == 0 and strides[-1] == 1 and all(s > 0 and s * "
        "element_size % 16 == 0 for s in strides[:-1])",
    ),
)
def check_copy_engine_ok(fn) -> None:
    seen = set()
    for name, shape, strides, size, offset in _layouts():
        want = _library_rule(shape, strides, size, offset)
        seen.add(want)
        got = fn(shape, strides, size, offset)
        expect(got is not None, f"{name}: your function returned None. Did you forget "
                                "`return`?")
        expect(isinstance(got, bool | np.bool_),
               f"{name}: your function returned {got!r}; expected True or False")
        expect(bool(got) == want,
               f"{name} (shape {shape}, strides {strides} elements of {size} bytes, base "
               f"{offset} bytes past an aligned address): you said {bool(got)}, the library's "
               f"rule says {want}: the copy engine {'can' if want else 'cannot'} fetch its "
               "tiles")
    assert seen == {True, False}  # the layouts exercise both answers
