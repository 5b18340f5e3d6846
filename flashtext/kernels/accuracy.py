"""How accurate is the kernel? Errors against the float64 reference, judged against PyTorch.

A fixed tolerance ("1e-3 for fp16") is arbitrary. The question that matters is whether our
kernel is as accurate as the attention a reader would otherwise run in the same dtype. So each
case computes three things from the same low-precision inputs:

* ``ref``: float64 ground truth (:mod:`flashtext.reference`), from the inputs upcast exactly;
* ``ours``: the Triton kernels (O, lse, dQ, dK, dV);
* ``torch``: plain PyTorch attention in the input dtype (matmul, softmax, matmul; autograd for
  the gradients), the usual "what you had before" baseline;

and the test is ``err(ours) <= FACTOR * err(torch) + floor``, errors being max absolute
differences to ``ref`` (plus, for O and the gradients, an explained allowance for fp32 scores of
size |S|: see ``SCORE_ROUNDING`` and ``RECOMPUTE`` below). This is FlashAttention's own test
criterion (``tests/test_flash_attn.py`` in Dao-AILab/flash-attention compares against twice the
error of PyTorch in the same dtype). The ``floor`` (two unit roundoffs of the largest reference
value: storing the result in the dtype rounds it once) covers cases where PyTorch happens to be
almost exact, e.g. N=1 where the output is just v.

Used by ``tests/test_kernels_*.py`` and ``scripts/record_accuracy.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from flashtext import reference
from flashtext.kernels.api import attention_backward, attention_forward
from flashtext.kernels.dispatch import is_masked

# what a recording of this sweep measures (scripts/record_accuracy.py stores their fingerprint,
# flashtext.recorded.kernel_fingerprint): the public API's kernels, and this module's criterion
MEASURED = ("flashtext.kernels.api", "flashtext.kernels.accuracy")

FACTOR = 2.0  # ours may be at most twice as far from float64 as PyTorch in the same dtype
ULPS = 2.0  # ... plus two unit roundoffs of the largest reference value (its own rounding)
# Scores are computed in fp32 (also by PyTorch in fp32): a score of size |S| is off by ~u32 |S|,
# so every entry of P, an exponential of scores, is off by that much *relative*, and so is O.
# Both implementations pay it, with different random constants, so at large |S| the 2x rule
# becomes a coin toss; this term (|lse| >= max |S| stands in for |S|) keeps it honest there.
SCORE_ROUNDING = 2.0
# The backward also recomputes P = exp(S - lse): S and lse, numbers of size |lse|, are each
# rounded a few more times (the dot, the scale, the stored lse), so P and every gradient linear
# in P carry a few more u32 |lse| relative. PyTorch keeps P and does not pay this; it matters only
# in fp32 and when scores are large (chapter 11).
RECOMPUTE = 4.0
# On a GPU, tl.math.exp2 and log2 compile to the special-function unit's approximations
# (ex2.approx / lg2.approx: relative error about 2**-22, four fp32 unit roundoffs) instead of
# correctly rounded functions, so every entry of P may carry that much relative error whatever
# |lse| is; PyTorch's softmax uses a correctly rounded exp. The interpreter uses NumPy's exp2 and
# pays nothing. An allowance from the instruction's documented accuracy, not from a failure: in
# the H200 sweep (accuracy_h200.json) every case stays within 0.37 of its bound without it.
EXP2_APPROX_ULPS = 4.0
# FlashAttention-2's backward forms dS = P * (dP - D) with dP_ij = dO_i . v_j (a tl.dot) and
# D_i = dO_i . O_i (a row sum in the preprocessing kernel): two fp32 sums of size |dP| that cancel
# exactly when a row attends to one key (N_k = 1, the first causal row), leaving noise of a few
# u32 |dP| where PyTorch, which subtracts sum_j P_ij dP_ij instead, gets exactly 0. That noise
# reaches dQ = scale dS K and dK = scale dS^T Q; independent roundings add like a random walk, so
# its size is u32 * max sqrt(sum_j (scale E_ij k_jl)^2) for dQ (likewise for dK) with
# E = P * (|dP| + |D|), the "cancellation scale". The sum-of-products ordering differs between
# compiled variants (the reduction's layout follows the loads), so on a GPU the noise is real even
# where the interpreter's NumPy order happens to cancel. Measured on the H200 (N_k = 1, d = 40 and
# 16, fp32): 0.6-0.8 of this scale for dQ, 1.0-1.4 for dK; the constant leaves room for the tail.
CANCELLATION = 4.0
UNIT_ROUNDOFF = {torch.float32: 2.0**-24, torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}
QUANTITIES = ("o", "lse", "dq", "dk", "dv")


@dataclass(frozen=True)
class Case:
    """One configuration of the correctness sweep."""

    batch: int
    heads: int
    n_q: int
    n_k: int
    head_dim: int
    causal: bool
    dtype: str  # "float32", "float16", "bfloat16"
    seed: int = 0
    heads_kv: int | None = None  # grouped-query attention: K/V heads (None: as many as q)
    window: tuple[int, int] = (-1, -1)  # sliding window (left, right), -1 unbounded

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)

    def label(self) -> str:
        gqa = f"/{self.heads_kv}" if self.heads_kv not in (None, self.heads) else ""
        win = f" window{self.window}" if self.window != (-1, -1) else ""
        return (f"{self.dtype} B{self.batch} H{self.heads}{gqa} Nq{self.n_q} Nk{self.n_k} "
                f"d{self.head_dim}{' causal' if self.causal else ''}{win}")


def make_inputs(case: Case, device: str | torch.device):
    """Seeded q, k, v, dO: standard normal, rounded to the case's dtype."""
    g = torch.Generator().manual_seed(case.seed)
    shape_q = (case.batch, case.heads, case.n_q, case.head_dim)
    shape_k = (case.batch, case.heads_kv or case.heads, case.n_k, case.head_dim)
    q, do = (torch.randn(shape_q, generator=g) for _ in range(2))
    k, v = (torch.randn(shape_k, generator=g) for _ in range(2))
    return tuple(t.to(device=device, dtype=case.torch_dtype) for t in (q, k, v, do))


def torch_attention(q, k, v, causal: bool, sm_scale: float, window: tuple[int, int] = (-1, -1),
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain PyTorch attention in the inputs' dtype, masks aligned bottom-right, grouped K/V
    heads repeated; returns (O, lse). A query that sees no key gets O = 0 (softmax of an all
    -inf row is NaN)."""
    if k.shape[1] != q.shape[1]:
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    s = (q @ k.transpose(-1, -2)) * sm_scale
    if is_masked(causal, window):
        n_q, n_k = q.shape[-2], k.shape[-2]
        right = 0 if causal else window[1]
        keep = torch.from_numpy(reference.window_mask(n_q, n_k, (window[0], right)))
        s = s.masked_fill(~keep.to(q.device), float("-inf"))
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)
    return p @ v, torch.logsumexp(s.float(), dim=-1)


def _max_abs(a: np.ndarray, b: np.ndarray) -> float:
    """Max |a - b| over entries where b is finite; inf where a and b disagree on +-inf."""
    fin = np.isfinite(b)
    if not np.array_equal(np.isneginf(a), np.isneginf(b)):
        return math.inf
    if not fin.any():
        return 0.0
    return float(np.max(np.abs(a[fin] - b[fin])))


@dataclass(frozen=True)
class Errors:
    """Max absolute error of ours and of PyTorch against float64, per quantity."""

    label: str
    dtype: torch.dtype
    ours: dict[str, float]
    torch: dict[str, float]
    scale: dict[str, float]  # max |reference| per quantity (the floor), + cancellation scales
    approx_exp: bool = False  # ours ran compiled on a GPU (approximate exp2/log2)

    def bound(self, name: str) -> float:
        # lse is computed and stored in fp32 whatever the input dtype
        u = UNIT_ROUNDOFF[torch.float32 if name == "lse" else self.dtype]
        bound = FACTOR * self.torch[name] + ULPS * u * max(self.scale[name], 1.0)
        exponent = self.scale["lse"] + (EXP2_APPROX_ULPS if self.approx_exp else 0.0)
        exponent_error = UNIT_ROUNDOFF[torch.float32] * exponent * self.scale[name]
        if name == "o":
            bound += SCORE_ROUNDING * exponent_error
        elif name in ("dq", "dk", "dv"):
            bound += RECOMPUTE * exponent_error
        if name in ("dq", "dk"):
            bound += CANCELLATION * UNIT_ROUNDOFF[torch.float32] * self.scale.get(
                f"{name}_cancellation", 0.0)
        return bound

    def failures(self) -> list[str]:
        return [f"{name}: ours {self.ours[name]:.3g} > bound {self.bound(name):.3g} "
                f"(torch {self.torch[name]:.3g})"
                for name in self.ours if not self.ours[name] <= self.bound(name)]


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().to("cpu", torch.float64).numpy()


def cancellation_scale(q, k, v, do, causal: bool, sm_scale: float,
                       window: tuple[int, int] = (-1, -1)) -> dict[str, float]:
    """The size of dQ's and dK's share of the dP - D cancellation noise in units of u32 (see
    ``CANCELLATION``): max over entries of |scale| sqrt(sum_j (E_ij k_jl)^2) for dQ and of
    |scale| sqrt(sum_i (E_ij q_il)^2) for dK (summed over the query heads of a K/V head), with
    E = P * (|dP| + |D|), in float64."""
    q, k, v, do = (t if isinstance(t, np.ndarray) else _np(t) for t in (q, k, v, do))
    h_kv = k.shape[1]
    if h_kv != q.shape[1]:
        k, v = (np.repeat(t, q.shape[1] // h_kv, axis=1) for t in (k, v))
    with np.errstate(invalid="ignore"):
        p = np.nan_to_num(reference.softmax(reference.scores(q, k, causal, sm_scale,
                                                             window=window)))
    dp = do @ np.swapaxes(v, -1, -2)
    d_row = np.sum(do * (p @ v), axis=-1, keepdims=True)
    e2 = (p * (np.abs(dp) + np.abs(d_row))) ** 2
    dq = abs(sm_scale) * np.sqrt(e2 @ k**2)
    dk2 = np.swapaxes(e2, -1, -2) @ q**2
    z, h, n, d = dk2.shape
    dk = abs(sm_scale) * np.sqrt(dk2.reshape(z, h_kv, h // h_kv, n, d).sum(axis=2))
    return {"dq_cancellation": float(dq.max(initial=0.0)),
            "dk_cancellation": float(dk.max(initial=0.0))}


def compare(q, k, v, do=None, causal: bool = False, sm_scale: float | None = None,
            label: str = "", window: tuple[int, int] = (-1, -1)) -> Errors:
    """Run ours, PyTorch and the float64 reference on these inputs and compare. With ``do``
    also the gradients dq, dk, dv of sum(O * do)."""
    sm_scale = 1.0 / math.sqrt(q.shape[-1]) if sm_scale is None else sm_scale
    o, lse = attention_forward(q, k, v, causal=causal, sm_scale=sm_scale, window_size=window)
    o_ref, lse_ref = reference.attention(q, k, v, causal=causal, scale=sm_scale,
                                         return_lse=True, window=window)
    leaves = [t.detach().clone().requires_grad_(do is not None) for t in (q, k, v)]
    o_pt, lse_pt = torch_attention(*leaves, causal=causal, sm_scale=sm_scale, window=window)
    ours = {"o": _max_abs(_np(o), o_ref), "lse": _max_abs(_np(lse), lse_ref)}
    theirs = {"o": _max_abs(_np(o_pt), o_ref), "lse": _max_abs(_np(lse_pt), lse_ref)}
    scale = {"o": float(np.max(np.abs(o_ref), initial=0.0)),
             "lse": float(np.max(np.abs(lse_ref[np.isfinite(lse_ref)]), initial=0.0))}
    if do is not None:
        got = attention_backward(do, q, k, v, o, lse, causal=causal, sm_scale=sm_scale,
                                 window_size=window)
        want = reference.attention_backward(q, k, v, do, causal=causal, scale=sm_scale,
                                            window=window)
        pt = torch.autograd.grad(o_pt, leaves, do)
        for name, g, w, p in zip(("dq", "dk", "dv"), got, want, pt, strict=True):
            ours[name] = _max_abs(_np(g), w)
            theirs[name] = _max_abs(_np(p), w)
            scale[name] = float(np.max(np.abs(w), initial=0.0))
        scale.update(cancellation_scale(q, k, v, do, causal, sm_scale, window))
    return Errors(label, q.dtype, ours, theirs, scale, approx_exp=q.is_cuda)


def measure(case: Case, device: str | torch.device, grads: bool = True) -> Errors:
    """:func:`compare` on the seeded inputs of one sweep case."""
    q, k, v, do = make_inputs(case, device)
    return compare(q, k, v, do if grads else None, causal=case.causal, label=case.label(),
                   window=case.window)


def sweep_cases(size: str, dtypes: tuple[str, ...], seed: int = 0) -> list[Case]:
    """The correctness sweep. ``size="cpu"``: small shapes for the interpreter; ``"gpu"``:
    longer sequences, every head_dim up to 256. Every sequence length in {1, 17, 64, 100, 129,
    256} appears as N_q and as N_k, mostly paired with a different other length, both causal
    and not, with batch and heads > 1."""
    lengths = [1, 17, 64, 100, 129, 256]
    if size == "cpu":
        dims = [16, 32, 64, 40, 128]
        batch, heads = 2, 2
    elif size == "gpu":
        lengths += [512, 1000, 1024, 2048]
        dims = [16, 32, 64, 128, 256, 40, 80, 96]
        batch, heads = 2, 3
    else:
        raise ValueError(f"size must be 'cpu' or 'gpu', got {size!r}")
    rng = np.random.default_rng(seed)
    cases = []
    for dtype in dtypes:
        for i, n_q in enumerate(lengths):
            # each length meets a shuffled partner (sometimes itself) once causal, once not
            partners = rng.permutation(lengths)
            for causal, n_k in ((False, partners[0]), (True, partners[1])):
                d = dims[(i + 2 * causal + len(cases)) % len(dims)]
                cases.append(Case(batch, heads, int(n_q), int(n_k), d, causal, dtype,
                                  seed=len(cases)))
    return cases


def model_cases(size: str, dtypes: tuple[str, ...]) -> list[Case]:
    """The real-model sweep: grouped K/V heads (H / H_kv in {1, 2, 4} on the CPU, {1, 4, 8} on
    a GPU; MQA included) and sliding windows that cut tiles in the middle, with ragged
    N_q != N_k, causal and not."""
    lengths = [(37, 45), (129, 64), (1, 70)] if size == "cpu" else \
        [(129, 64), (1000, 1000), (700, 2048)]
    dims = [16, 32, 40] if size == "cpu" else [64, 128, 80]
    heads = [(4, 4), (4, 2), (4, 1)] if size == "cpu" else [(8, 8), (8, 2), (8, 1)]
    windows = [(-1, -1), (10, 3), (0, 0), (33, -1), (-1, 5)] if size == "cpu" else \
        [(-1, -1), (100, 20), (255, -1), (-1, 130)]
    cases = []
    for dtype in dtypes:
        for i, (n_q, n_k) in enumerate(lengths):
            for j, window in enumerate(windows):
                h, h_kv = heads[(i + j) % len(heads)]
                d = dims[(i + 2 * j) % len(dims)]
                causal = bool((i + j) % 2) and window[1] == -1
                cases.append(Case(2, h, n_q, n_k, d, causal, dtype, seed=100 + len(cases),
                                  heads_kv=h_kv, window=window))
    return cases


__all__ = ["Case", "Errors", "FACTOR", "compare", "measure", "make_inputs", "model_cases",
           "sweep_cases", "torch_attention"]
