"""Chapter 9's three kernels, each a step toward attention: vector add (programs, offsets, masks),
fused row softmax (a reduction in one program, -inf padding), tiled matmul (2-D tiles, a loop over
K, ``tl.dot``) — the matmul twice, with pointer arithmetic and with a tensor descriptor.

Every launcher checks its inputs (``ValueError`` naming the argument) and runs compiled on a GPU
or under Triton's interpreter on a CPU.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flashtext import _boot
from flashtext.kernels.forward import input_precision


def _check_device(name: str, t: torch.Tensor) -> None:
    if not _boot.INTERPRETING and t.device.type != "cuda":
        raise ValueError(f"{name} is on {t.device}; Triton compiles for the GPU here: expected "
                         "a CUDA tensor")


def _check_block(name: str, block: int, lowest: int = 1) -> None:
    if not isinstance(block, int) or block < lowest or block & (block - 1):
        raise ValueError(f"{name} must be a power of two >= {lowest} (tl.arange needs one), "
                         f"got {block!r}")


# ------------------------------------------------------------------------------ vector add

@triton.jit
def add_kernel(X, Y, OUT, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)  # which block of BLOCK elements this program owns
    offs = pid * BLOCK + tl.arange(0, BLOCK)  # the element indices of that block
    mask = offs < n  # the last block may stick out past the end
    x = tl.load(X + offs, mask=mask)
    y = tl.load(Y + offs, mask=mask)
    tl.store(OUT + offs, x + y, mask=mask)


def add(x: torch.Tensor, y: torch.Tensor, block: int = 256) -> torch.Tensor:
    """x + y for two 1-D tensors of the same length and dtype: ceil(n / block) programs."""
    for name, t in (("x", x), ("y", y)):
        if not isinstance(t, torch.Tensor) or t.dim() != 1:
            raise ValueError(f"{name} must be a 1-D torch.Tensor")
        _check_device(name, t)
    if x.shape != y.shape or x.dtype != y.dtype or x.device != y.device:
        raise ValueError(f"x and y must match in length, dtype and device, got x {x.shape[0]} "
                         f"{x.dtype} {x.device}, y {y.shape[0]} {y.dtype} {y.device}")
    _check_block("block", block)
    x, y = x.contiguous(), y.contiguous()
    out = torch.empty_like(x)
    if x.numel():
        add_kernel[(triton.cdiv(x.numel(), block),)](x, y, out, x.numel(), BLOCK=block)
    return out


# ------------------------------------------------------------------------ fused row softmax

@triton.jit
def softmax_kernel(X, OUT, stride_xr, stride_xc, stride_out, n_cols, BLOCK: tl.constexpr):
    # one program per row; the whole row fits in one block. The row's offset in 64 bits: rows
    # times row stride passes 2**31 elements (4 GiB of fp16) long before the grid runs out
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    # padding reads as -inf: it cannot win the max, and exp(-inf) = 0 adds nothing to the sum
    x = tl.load(X + row * stride_xr + cols * stride_xc, mask=mask,
                other=float("-inf")).to(tl.float32)
    x = x - tl.max(x, axis=0)  # safe softmax: every exponent <= 0
    num = tl.exp(x)
    out = num / tl.sum(num, axis=0)
    tl.store(OUT + row * stride_out + cols, out.to(OUT.dtype.element_ty), mask=mask)


def softmax(x: torch.Tensor) -> torch.Tensor:
    """Row-wise softmax of a 2-D tensor in one pass over memory: each row is read once and
    written once (PyTorch's unfused version reads and writes it several times). Rows of any
    length up to 2**16; a row of only -inf gives NaN, as torch.softmax does."""
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        raise ValueError("x must be a 2-D torch.Tensor (rows, cols)")
    if x.dtype not in (torch.float16, torch.float32):
        raise ValueError(f"x has dtype {x.dtype}; expected torch.float16 or torch.float32")
    if x.shape[1] > 2**16:
        raise ValueError(f"x has {x.shape[1]} columns; one program holds a row: at most 2**16")
    _check_device("x", x)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if x.numel():
        block = triton.next_power_of_2(x.shape[1])
        softmax_kernel[(x.shape[0],)](x, out, *x.stride(), out.stride(0), x.shape[1],
                                      BLOCK=block)
    return out


# ------------------------------------------------------------ tiled matmul, pointer arithmetic

@triton.jit
def matmul_kernel(A, B, C, M, N, K,
                  stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                  INPUT_PRECISION: tl.constexpr):
    # program (i, j) computes the (BLOCK_M x BLOCK_N) tile C[i*BLOCK_M:, j*BLOCK_N:]
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for start_k in range(0, K, BLOCK_K):
        k = start_k + offs_k
        # a 2-D tile of addresses: row index times row stride plus column index times column
        # stride. Strides, not shapes, make a transposed or sliced input work unchanged.
        a = tl.load(A + offs_m[:, None] * stride_am + k[None, :] * stride_ak,
                    mask=(offs_m[:, None] < M) & (k[None, :] < K), other=0.0)
        b = tl.load(B + k[:, None] * stride_bk + offs_n[None, :] * stride_bn,
                    mask=(k[:, None] < K) & (offs_n[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)  # zero padding adds nothing
    tl.store(C + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn,
             acc.to(C.dtype.element_ty), mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


def _check_matmul(a, b, blocks) -> None:
    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor) or t.dim() != 2:
            raise ValueError(f"{name} must be a 2-D torch.Tensor")
        if t.dtype not in (torch.float16, torch.float32) and not (
                t.dtype == torch.bfloat16 and not _boot.INTERPRETING):
            raise ValueError(f"{name} has dtype {t.dtype}; expected torch.float16 or "
                             "torch.float32 (torch.bfloat16 on a GPU)")
        _check_device(name, t)
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"a's columns ({a.shape[1]}) must equal b's rows ({b.shape[0]})")
    if a.dtype != b.dtype or a.device != b.device:
        raise ValueError(f"a and b must share dtype and device, got a {a.dtype} {a.device}, "
                         f"b {b.dtype} {b.device}")
    for name, block in blocks.items():
        _check_block(name, block, lowest=16)  # tl.dot needs every side >= 16


def matmul(a: torch.Tensor, b: torch.Tensor, block_m: int = 32, block_n: int = 32,
           block_k: int = 32) -> torch.Tensor:
    """a @ b (M x K times K x N), any strides, fp32 accumulation, result in a's dtype."""
    _check_matmul(a, b, {"block_m": block_m, "block_n": block_n, "block_k": block_k})
    (m, k), n = a.shape, b.shape[1]
    c = torch.empty((m, n), dtype=a.dtype, device=a.device)
    if c.numel():
        grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n))
        matmul_kernel[grid](a, b, c, m, n, k, *a.stride(), *b.stride(), *c.stride(),
                            BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
                            INPUT_PRECISION=input_precision(a.dtype))
    return c


# ------------------------------------------------------------ tiled matmul, tensor descriptors

@triton.jit
def matmul_descriptor_kernel(A, B, C, M, N, K, stride_am, stride_bk, stride_cm,
                             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                             BLOCK_K: tl.constexpr, INPUT_PRECISION: tl.constexpr):
    # A descriptor is (base, shape, strides, tile shape): the hardware (Hopper's TMA) or the
    # compiler works out the addresses and the bounds; tiles past the edge read as zero and
    # stores past the edge are dropped. The innermost stride must be 1.
    a_desc = tl.make_tensor_descriptor(A, shape=[M, K], strides=[stride_am, 1],
                                       block_shape=[BLOCK_M, BLOCK_K])
    b_desc = tl.make_tensor_descriptor(B, shape=[K, N], strides=[stride_bk, 1],
                                       block_shape=[BLOCK_K, BLOCK_N])
    c_desc = tl.make_tensor_descriptor(C, shape=[M, N], strides=[stride_cm, 1],
                                       block_shape=[BLOCK_M, BLOCK_N])
    start_m = tl.program_id(0) * BLOCK_M
    start_n = tl.program_id(1) * BLOCK_N
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for start_k in range(0, K, BLOCK_K):
        a = a_desc.load([start_m, start_k])  # a tile, by its top-left corner
        b = b_desc.load([start_k, start_n])
        acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)
    c_desc.store([start_m, start_n], acc.to(C.dtype.element_ty))


_ALLOCATOR_SET = False


def _ensure_allocator() -> None:
    """Descriptors made inside a kernel need global scratch memory on the GPU, which Triton
    asks the host for through ``triton.set_allocator``. The interpreter needs none."""
    global _ALLOCATOR_SET
    if _ALLOCATOR_SET or _boot.INTERPRETING:
        return

    def alloc(size: int, alignment: int, stream):
        return torch.empty(size, dtype=torch.int8, device="cuda")

    triton.set_allocator(alloc)
    _ALLOCATOR_SET = True


def matmul_descriptor(a: torch.Tensor, b: torch.Tensor, block_m: int = 32, block_n: int = 32,
                      block_k: int = 32) -> torch.Tensor:
    """a @ b like :func:`matmul`, with tensor descriptors instead of pointer arithmetic.

    The price of letting the hardware address memory: each row must be contiguous (column
    stride 1) and row strides a multiple of 16 bytes (e.g. a K that is a multiple of 8 in fp16).
    """
    _check_matmul(a, b, {"block_m": block_m, "block_n": block_n, "block_k": block_k})
    for name, t in (("a", a), ("b", b)):
        if t.stride(1) != 1 or (t.stride(0) * t.element_size()) % 16:
            raise ValueError(f"{name} needs column stride 1 and a row stride of a multiple of "
                             f"16 bytes for a tensor descriptor, got strides {t.stride()} "
                             f"({t.element_size()}-byte elements)")
    (m, k), n = a.shape, b.shape[1]
    if (n * a.element_size()) % 16:
        raise ValueError(f"the output's rows must be a multiple of 16 bytes: N={n} is not")
    c = torch.empty((m, n), dtype=a.dtype, device=a.device)
    if c.numel():
        _ensure_allocator()
        grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n))
        matmul_descriptor_kernel[grid](a, b, c, m, n, k, a.stride(0), b.stride(0), c.stride(0),
                                       BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
                                       INPUT_PRECISION=input_precision(a.dtype))
    return c


__all__ = ["add", "add_kernel", "matmul", "matmul_descriptor", "matmul_descriptor_kernel",
           "matmul_kernel", "softmax", "softmax_kernel"]
