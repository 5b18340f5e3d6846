"""Chapter 9's kernels against PyTorch: ragged lengths, strides, padding that must not leak."""

from __future__ import annotations

import pytest
import torch

import flashtext
from flashtext.kernels import primer

DEVICE = flashtext.torch_device()


def _rand(*shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(device=DEVICE, dtype=dtype)


@pytest.mark.parametrize("n", [1, 255, 256, 257, 1000])
@pytest.mark.parametrize("block", [64, 256])
def test_add(n, block):
    x, y = _rand(n, seed=1), _rand(n, seed=2)
    assert torch.equal(primer.add(x, y, block=block), x + y)


def test_add_does_not_write_past_the_end():
    buf = torch.full((300,), float("nan"), device=DEVICE)
    x, y = _rand(200, seed=1), _rand(200, seed=2)
    primer.add_kernel[(4,)](x, y, buf, 200, BLOCK=64)  # 4 x 64 = 256 lanes for 200 elements
    assert torch.equal(buf[:200], x + y) and torch.isnan(buf[200:]).all()


@pytest.mark.parametrize("shape", [(1, 1), (7, 33), (64, 128), (5, 1000)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_softmax(shape, dtype):
    x = _rand(*shape, dtype=dtype) * 10
    want = torch.softmax(x.float(), dim=1)
    torch.testing.assert_close(primer.softmax(x).float(), want,
                               **({} if dtype == torch.float32 else dict(atol=1e-3, rtol=1e-3)))


def test_softmax_extremes_and_strides():
    x = _rand(6, 50) * 3 + torch.tensor([0.0, 1000.0, -1000.0, 0.0, 0.0, 0.0],
                                        device=DEVICE)[:, None]
    x[3] = 1.0  # ties
    x[4, ::2] = float("-inf")  # masked entries
    torch.testing.assert_close(primer.softmax(x), torch.softmax(x, dim=1))
    wide = _rand(6, 100)
    torch.testing.assert_close(primer.softmax(wide[:, ::2]), torch.softmax(wide[:, ::2], 1))


def test_softmax_rows_past_two_to_the_31_elements():
    """Row r starts r * stride elements in; past 2**31 (4 GiB of fp16, reached by chapter 1's
    S at N = 2048) a 32-bit offset wraps to a negative address. Rows 1 GiB apart in a lazily
    allocated buffer: only the three rows' pages are ever touched."""
    base = torch.empty(2**31 + 64, dtype=torch.float16, device=DEVICE)
    x = base.as_strided((3, 64), (2**30, 1))
    for r in range(3):
        x[r] = torch.linspace(-4, 4, 64, device=DEVICE) * (r + 1)
    torch.testing.assert_close(primer.softmax(x), torch.softmax(x.float(), dim=1).half())


@pytest.mark.parametrize("fn", [primer.matmul, primer.matmul_descriptor],
                         ids=["pointers", "descriptors"])
@pytest.mark.parametrize("m,k,n", [(1, 8, 16), (37, 40, 52), (64, 64, 64), (100, 72, 24)])
def test_matmul(fn, m, k, n):
    a, b = _rand(m, k, seed=1), _rand(k, n, seed=2)
    want = a.double() @ b.double()
    got = fn(a, b, block_m=16, block_n=32, block_k=16)
    # fp32 inputs run "ieee" on a GPU too (not TF32): fp32 rounding of a length-k sum
    torch.testing.assert_close(got.double(), want, atol=1e-5 * k ** 0.5, rtol=0)


def test_matmul_strides_and_fp16():
    a = _rand(48, 64, seed=3, dtype=torch.float16)[:, ::2]  # column stride 2
    b = _rand(40, 32, seed=4, dtype=torch.float16).T  # transposed: (32, 40)
    got = primer.matmul(a, b)
    want = a.double() @ b.double()  # products of fp16 are exact in fp32: only the sum rounds
    torch.testing.assert_close(got.double(), want, atol=1e-2, rtol=1e-3)
    assert got.dtype == torch.float16


def test_bad_inputs():
    x = _rand(10)
    with pytest.raises(ValueError, match="^x and y must match"):
        primer.add(x, _rand(11))
    with pytest.raises(ValueError, match="^block must be a power of two"):
        primer.add(x, x, block=100)
    with pytest.raises(ValueError, match="^x must be a 2-D"):
        primer.softmax(x)
    with pytest.raises(ValueError, match="^a's columns \\(10\\) must equal b's rows \\(9\\)"):
        primer.matmul(_rand(4, 10), _rand(9, 4))
    with pytest.raises(ValueError, match="^block_k must be a power of two >= 16"):
        primer.matmul(_rand(4, 10), _rand(10, 4), block_k=8)
    with pytest.raises(ValueError, match="^a needs column stride 1"):
        primer.matmul_descriptor(_rand(16, 16).T, _rand(16, 16))
    with pytest.raises(ValueError, match="^b needs column stride 1 and a row stride of a"):
        primer.matmul_descriptor(_rand(16, 8), _rand(8, 5))
