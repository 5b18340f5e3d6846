"""Chapter 9's exercises, in the style of Triton-Puzzles: a spec in PyTorch, a stub kernel, and a
checker that launches *your kernel* (under the interpreter on a CPU, compiled on a GPU) on random
and ragged shapes, with inputs of both signs, and shows yours vs expected.

Each checker takes the ``@triton.jit`` function itself and launches it with the signature the
stub documents. A stub whose body still says ``raise NotImplementedError`` counts as not
attempted. Inputs and outputs live in a :class:`~flashtext.exercises.kernel_checks.Sandbox`:
views inside NaN-poisoned and canary-filled buffers, with strides that are not always the
contiguous ones, and (under the interpreter) every load and store checked before it happens, so
a missing mask is caught whether or not its lanes reach the output, and never crashes Python.
"""

from __future__ import annotations

import numpy as np
import torch

from flashtext import reference as ref
from flashtext.exercises.core import adversarial_rows, exercise
from flashtext.exercises.kernel_checks import Sandbox, compare, require_kernel

# ---------------------------------------------------------------------------------- 9.1 axpy


def axpy_spec(x: torch.Tensor, y: torch.Tensor, alpha: float) -> torch.Tensor:
    return alpha * x + y


@exercise(
    "ch09.axpy",
    "axpy: out = alpha * x + y, one block of BLOCK elements per program",
    kernel=True,
    hints=(
        "pid = tl.program_id(0); offs = pid * BLOCK + tl.arange(0, BLOCK).",
        "The last program's block sticks out past n: mask = offs < n, and pass mask= to both "
        "tl.load and tl.store.",
        "alpha is a plain scalar argument: alpha * x works on the whole block.",
    ),
)
def check_axpy(kernel) -> None:
    require_kernel(kernel)
    import triton

    g = torch.Generator().manual_seed(9)
    for n, block, alpha in ((1, 64, 2.0), (100, 64, -1.5), (128, 128, 0.5), (1000, 256, -3.0),
                            (1537, 128, 1.0)):
        case = f"n={n}, BLOCK={block}, alpha={alpha}"
        x_vals = torch.randn(n, generator=g)  # both signs: no [0, 1) inputs
        y_vals = torch.randn(n, generator=g)
        want = axpy_spec(x_vals, y_vals, alpha).numpy()
        box = Sandbox(case)
        x, y = box.input("X", x_vals), box.input("Y", y_vals)
        out = box.output("OUT", (n,))
        box.launch(kernel, (triton.cdiv(n, block),), x, y, out, n, alpha, BLOCK=block)
        compare(out, want, case, "out", rtol=1e-6, atol=1e-6)


# ------------------------------------------------------------------------ 9.2 row logsumexp

def row_logsumexp_spec(x: torch.Tensor) -> torch.Tensor:
    return torch.logsumexp(x, dim=1)


@exercise(
    "ch09.row_logsumexp",
    "Row log-sum-exp: one program per row, safe against overflow and -inf",
    kernel=True,
    hints=(
        "row = tl.program_id(0); cols = tl.arange(0, BLOCK); load X + row * stride_row + cols "
        "with mask = cols < n_cols.",
        "Padding must not count: load it as -inf (other=float('-inf')), so exp(-inf) = 0.",
        "Subtract the row max before exp, add it back after the log: m + log(sum(exp(x - m))).",
        "A row of only -inf has m = -inf and x - m = NaN: compute with m_safe = 0 for such a row "
        "(tl.where(m == float('-inf'), 0.0, m)); its answer is -inf.",
    ),
)
def check_row_logsumexp(kernel) -> None:
    require_kernel(kernel)
    import triton

    rng = np.random.default_rng(9)
    for n_cols in (1, 5, 33, 100):
        rows = adversarial_rows(rng, n_cols)
        names = list(rows)
        data = np.stack([rows[k] for k in names] + [np.full(n_cols, -np.inf)])
        names.append("a row of only -inf (no key visible)")
        want = ref.logsumexp(data)
        # rows of n_cols stored contiguously, and with 7 poisoned (NaN) entries between rows
        for block, stride_extra in ((triton.next_power_of_2(n_cols), 0),
                                    (2 * triton.next_power_of_2(n_cols), 7)):
            shape = f"n_cols={n_cols}, BLOCK={block}, row stride {n_cols + stride_extra}"
            box = Sandbox(f"{shape}, {len(data)} rows")
            x = box.input("X", torch.tensor(data, dtype=torch.float32), pad=(0, stride_extra),
                          dims=("row", "column"))
            out = box.output("OUT", (len(data),), dims=("row",))
            box.launch(kernel, (len(data),), x, out, x.stride(0), n_cols, BLOCK=block)
            got = out.cpu().numpy().astype(np.float64)
            for i, name in enumerate(names):
                compare(got[i:i + 1], want[i:i + 1], f"{shape}: row {i}, {name}",
                        "the log-sum-exp", rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------ 9.3 matmul

def matmul_spec(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a.float() @ b.float()


# (M, K, N, (BLOCK_M, BLOCK_N, BLOCK_K), layouts of A, B and C): "T" stored transposed
# (column-major), "P" rows padded with poison (a row stride longer than the row), "" plain
MATMUL_CASES = [(16, 16, 16, (16, 16, 16), ("", "", "")),
                (37, 50, 20, (16, 16, 16), ("", "", "")),
                (64, 40, 48, (32, 16, 32), ("", "", "")),
                (33, 70, 45, (16, 32, 16), ("", "T", "")),
                (1, 100, 17, (16, 16, 32), ("", "T", "")),
                (40, 24, 30, (16, 16, 16), ("T", "", "")),
                (29, 33, 18, (16, 16, 16), ("P", "P", "P")),
                (35, 20, 26, (16, 16, 16), ("", "", "T"))]

_LAYOUT_WORDS = {"T": "stored transposed", "P": "rows padded (row stride > row length)"}


def _placed(box: Sandbox, name: str, values: torch.Tensor | None, shape, layout: str,
            dims=("row", "column")) -> torch.Tensor:
    kwargs = {"order": (1, 0)} if layout == "T" else {"pad": (0, 5)} if layout == "P" else {}
    if values is None:
        return box.output(name, shape, dims=dims, **kwargs)
    return box.input(name, values, dims=dims, **kwargs)


@exercise(
    "ch09.matmul",
    "Tiled matmul: C = A @ B, one (BLOCK_M x BLOCK_N) tile of C per program",
    kernel=True,
    hints=(
        "offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M); the same for n with "
        "program_id(1); acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32).",
        "Loop for start_k in range(0, K, BLOCK_K): load an A tile at offs_m[:, None] * stride_am "
        "+ k[None, :] * stride_ak and a B tile at k[:, None] * stride_bk + offs_n[None, :] * "
        "stride_bn, with k = start_k + tl.arange(0, BLOCK_K).",
        "Mask both loads on every index that can run past the edge (rows, columns AND k) with "
        "other=0.0: zeros add nothing to a dot product. acc = tl.dot(a, b, acc).",
        "Use the strides you are given, not K or N: the checker passes A, B and C "
        "transposed, and with padded rows.",
        "Store acc with mask (offs_m[:, None] < M) & (offs_n[None, :] < N).",
    ),
)
def check_matmul(kernel) -> None:
    require_kernel(kernel)
    import triton

    g = torch.Generator().manual_seed(9)
    for m, k, n, (bm, bn, bk), layouts in MATMUL_CASES:
        described = [f"{name} {_LAYOUT_WORDS[lay]}" for name, lay in zip("ABC", layouts,
                                                                         strict=True) if lay]
        a_vals = torch.randn(m, k, generator=g).to(torch.float16)
        b_vals = torch.randn(k, n, generator=g).to(torch.float16)
        # products of fp16 numbers are exact in fp32: only the fp32 sum rounds
        want = a_vals.double().numpy() @ b_vals.double().numpy()
        box = Sandbox("")
        a = _placed(box, "A", a_vals, (m, k), layouts[0])
        b = _placed(box, "B", b_vals, (k, n), layouts[1])
        c = _placed(box, "C", None, (m, n), layouts[2])
        case = (f"M={m}, K={k}, N={n}, BLOCK_M={bm}, BLOCK_N={bn}, BLOCK_K={bk}"
                + "".join(f", {d}" for d in described)
                + f" (strides A {tuple(a.stride())}, B {tuple(b.stride())}, "
                  f"C {tuple(c.stride())})")
        box.case = case
        box.launch(kernel, (triton.cdiv(m, bm), triton.cdiv(n, bn)), a, b, c, m, n, k,
                   *a.stride(), *b.stride(), *c.stride(), BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk)
        compare(c, want, case, "C", rtol=1e-4, atol=1e-4)
