"""The float64 references, checked against independent computations (torch autograd, loops)."""

import numpy as np
import pytest
import torch

from flashtext import reference as ref


def test_softmax_is_exact_and_safe():
    x = np.array([[1000.0, 1001.0, 999.0], [-1000.0, -1001.0, -999.0], [0.0, 0.0, 0.0]])
    p = ref.softmax(x)
    expected = np.exp([-1.0, 0.0, -2.0]) / np.exp([-1.0, 0.0, -2.0]).sum()
    np.testing.assert_allclose(p[0], expected, rtol=1e-15)
    shifted = np.exp([-1.0, -2.0, 0.0])
    np.testing.assert_allclose(p[1], shifted / shifted.sum(), rtol=1e-15)
    np.testing.assert_allclose(p[2], [1 / 3] * 3, rtol=1e-15)


def test_fully_masked_row_is_zero_not_nan():
    p = ref.softmax(np.array([[-np.inf, -np.inf], [0.0, -np.inf]]))
    assert np.array_equal(p, [[0.0, 0.0], [1.0, 0.0]])
    assert ref.logsumexp(np.array([-np.inf, -np.inf])) == -np.inf


def test_causal_mask_alignments():
    br = ref.causal_mask(2, 4)  # the last query sees every key
    assert br.tolist() == [[True, True, True, False], [True, True, True, True]]
    tl = ref.causal_mask(2, 4, "top_left")
    assert tl.tolist() == [[True, False, False, False], [True, True, False, False]]
    with pytest.raises(ValueError, match="align"):
        ref.causal_mask(2, 2, "diagonal")


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("nq,nk", [(5, 5), (3, 7), (7, 3)])
def test_attention_and_gradients_match_torch_autograd(causal, nq, nk):
    g = torch.Generator().manual_seed(nq * 10 + nk)
    q, k, v, do = (torch.randn(2, 3, n, 8, generator=g, dtype=torch.float64)
                   for n in (nq, nk, nk, nq))
    for t in (q, k, v):
        t.requires_grad_(True)
    s = q @ k.transpose(-1, -2) / np.sqrt(8)
    if causal:
        s = s.masked_fill(~torch.from_numpy(ref.causal_mask(nq, nk)), float("-inf"))
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)  # rows with no key: output 0
    o = p @ v
    o.backward(do)
    ours, lse = ref.attention(q, k, v, causal=causal, return_lse=True)
    np.testing.assert_allclose(ours, o.detach().numpy(), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(lse, torch.logsumexp(s, -1).detach().numpy(), rtol=1e-12)
    dq, dk, dv = ref.attention_backward(q, k, v, do, causal=causal)
    for mine, theirs in ((dq, q.grad), (dk, k.grad), (dv, v.grad)):
        np.testing.assert_allclose(mine, theirs.numpy(), rtol=1e-10, atol=1e-12)
