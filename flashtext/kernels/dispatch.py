"""Which kernels run a dense call: the Gluon FA3-style ones or the Triton FA2 ones.

On an sm_90 GPU the Gluon kernel (:mod:`flashtext.kernels.gluon_forward`, chapter 13) runs the
forward where it was measured faster than the Triton kernel (:mod:`flashtext.kernels.forward`,
chapter 10); everywhere else (other GPUs, the CPU interpreter, float32, packed sequences,
layouts the copy engine cannot address) the Triton kernel runs. Both return the same O and lse,
so the backward kernels do not care which one ran.

The rule, from side-by-side H200 runs (``BENCHMARKS.md``, v5):

* d = 64 stays on Triton: there the Gluon kernel is level with it at best.
* d = 128 and 256 go to Gluon, except a masked d = 128 call (causal or a window) whose queries
  each see fewer than :data:`GLUON_MIN_MASKED_KEYS` keys: a query block then has only a few key
  tiles to pipeline, and the Triton kernel (with its 64 x 64 tiles for short causal passes) was
  measured level with the Gluon one or faster.

The backward's dK/dV pass (the larger part of it: four of its seven matmuls) runs the Gluon
kernel (:mod:`flashtext.kernels.gluon_backward`) where it can run the inputs (d = 64 and 128,
fp16 and bf16, on sm_90) and some key is seen by at least :data:`GLUON_MIN_BACKWARD_QUERIES`
queries: there the H200 measured it 1.35-1.53x (d = 128) and 1.12-1.46x (d = 64) as fast as
the Triton dK/dV pass (``scripts/probe_gluon_backward.py``). A program of the Gluon kernel
loops over the query tiles that see its keys, and with fewer of them (N = 512 and 1k in the
sweep) its backward ran 0.63-1.20x as fast as the Triton one. The preprocessing is Triton's
either way.

Where the Gluon dK/dV kernel runs, it computes dQ as well (FlashAttention-3's way: each tile's
share added into an fp32 buffer by the copy engine's reduce-add), unless the caller asks for a
``deterministic`` backward or d = 64 comes with a mask (causal or a window). In an H200 probe
(``scripts/records/gluon_backward_fused_dq_h200.json``, ``BENCHMARKS.md``: fp16 and bf16,
N = 2k to 16k) the fused backward ran 1.09-1.15x as fast as the Gluon dK/dV beside Triton's dQ
pass at d = 128, masked or not, and at d = 64 without a mask, but 0.95-1.01x at d = 64 with a
causal mask. Elsewhere dQ comes from Triton's ``_attn_bwd_dq``, which writes each row of dQ
once, so that the whole backward gives the same bits on every run.
"""

from __future__ import annotations

import torch

from flashtext.kernels import gluon_backward, gluon_forward
from flashtext.kernels.backward import backward as triton_backward
from flashtext.kernels.forward import forward as triton_forward

FORWARD_KERNELS = ("auto", "triton", "gluon")
BACKWARD_KERNELS = ("auto", "triton", "gluon")
GLUON_HEAD_DIMS = (128, 256)  # at d = 64 the Triton forward is as fast
GLUON_MIN_MASKED_KEYS = 2048  # a masked d = 128 call whose queries see fewer keys: Triton
GLUON_MIN_BACKWARD_QUERIES = 2048  # a backward whose keys are each seen by fewer: Triton dK/dV
Window = tuple[int, int]


def widest_key_span(n_q: int, n_k: int, causal: bool, window: Window = (-1, -1)) -> int:
    """The most keys any one query sees. Query i sees keys [i + off - left, i + off + right]
    within [0, N_k) (off = N_k - N_q; causal caps right at 0): a count that rises, stays and
    falls with i, so its largest value is at an end of the rows or where a clip starts."""
    left, right = window
    if causal:
        right = 0 if right < 0 else min(right, 0)
    off = n_k - n_q

    def seen(i: int) -> int:
        lo = 0 if left < 0 else max(0, i + off - left)
        hi = n_k - 1 if right < 0 else min(n_k - 1, i + off + right)
        return max(0, hi - lo + 1)

    if n_q == 0:
        return 0
    rows = {0, n_q - 1, left - off, n_k - 1 - off - right}
    return max(seen(min(max(i, 0), n_q - 1)) for i in rows)


def widest_query_span(n_q: int, n_k: int, causal: bool, window: Window = (-1, -1)) -> int:
    """The most queries any one key is seen by: :func:`widest_key_span` of the transposed
    problem (key j is seen by queries [j - off - right, j - off + left], off = N_k - N_q)."""
    left, right = window
    if causal:
        right = 0 if right < 0 else min(right, 0)
    return widest_key_span(n_k, n_q, False, (right, left))


def prefers_gluon_backward(head_dim: int, n_q: int, n_k: int, causal: bool,
                           window: Window = (-1, -1)) -> bool:
    """The dK/dV rule alone, by shape: is the Gluon dK/dV the faster one on sm_90 here?"""
    return head_dim in gluon_backward.HEAD_DIMS and \
        widest_query_span(n_q, n_k, causal, window) >= GLUON_MIN_BACKWARD_QUERIES


def prefers_fused_dq(head_dim: int, causal: bool, window: Window = (-1, -1)) -> bool:
    """Where the Gluon dK/dV kernel runs: is computing dQ in it (rather than in Triton's dQ
    pass) the faster one on sm_90? Not at d = 64 with a mask."""
    masked = causal or tuple(window) != (-1, -1)
    return head_dim in gluon_backward.HEAD_DIMS and not (head_dim == 64 and masked)


def prefers_gluon(head_dim: int, n_q: int, n_k: int, causal: bool,
                  window: Window = (-1, -1)) -> bool:
    """The rule alone, by shape: is the Gluon forward the faster one on sm_90 here?"""
    if head_dim not in GLUON_HEAD_DIMS:
        return False
    masked = causal or tuple(window) != (-1, -1)
    return not (masked and head_dim == 128
                and widest_key_span(n_q, n_k, causal, window) < GLUON_MIN_MASKED_KEYS)


def choose_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                   window: Window = (-1, -1)) -> str:
    """"gluon" or "triton": the forward kernel ``flash_attention`` runs for these inputs (Gluon
    where it can run them, :func:`~flashtext.kernels.gluon_forward.gluon_supported`, and is the
    faster one, :func:`prefers_gluon`)."""
    if gluon_forward.gluon_supported(q, k, v, causal, window) and \
            prefers_gluon(q.shape[-1], q.shape[2], k.shape[2], causal, window):
        return "gluon"
    return "triton"


def choose_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                    window: Window = (-1, -1)) -> str:
    """"gluon" or "triton": the kernel of the dK/dV pass ``flash_attention``'s backward runs
    (Gluon where it can run these inputs,
    :func:`~flashtext.kernels.gluon_backward.gluon_dkdv_supported`, and is the faster one,
    :func:`prefers_gluon_backward`)."""
    if gluon_backward.gluon_dkdv_supported(q, k, v, causal, window) and \
            prefers_gluon_backward(q.shape[-1], q.shape[2], k.shape[2], causal, window):
        return "gluon"
    return "triton"


def _check_kernel(name: str, value, allowed: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in allowed:
        raise ValueError(f"{name} must be one of {allowed} ('auto': the faster one these "
                         f"inputs support), got {value!r}")
    return value


def check_forward_kernel(forward_kernel) -> str:
    """``forward_kernel`` as one of :data:`FORWARD_KERNELS`, or a ValueError naming it."""
    return _check_kernel("forward_kernel", forward_kernel, FORWARD_KERNELS)


def check_backward_kernel(backward_kernel) -> str:
    """``backward_kernel`` as one of :data:`BACKWARD_KERNELS`, or a ValueError naming it."""
    return _check_kernel("backward_kernel", backward_kernel, BACKWARD_KERNELS)


def _unsupported(argument: str, kernel: str, head_dims, q: torch.Tensor) -> ValueError:
    """The error for ``argument='gluon'`` on inputs ``kernel`` does not run."""
    return ValueError(f"{argument}='gluon' needs inputs {kernel} runs: CUDA tensors on an sm_90 "
                      "GPU with a Triton that has Gluon, float16 or bfloat16, head_dim in "
                      f"{head_dims}, N_q and N_k >= 1, a unit last stride and 16-byte aligned "
                      f"strides; got {q.dtype} {tuple(q.shape)} on {q.device}. Use 'auto' or "
                      "'triton'")


def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, sm_scale: float,
            window: Window = (-1, -1), forward_kernel: str = "auto",
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """(O, lse) from the kernel :func:`choose_forward` picks, or the one ``forward_kernel``
    names ("gluon" raises a ValueError on inputs it does not support)."""
    kernel = choose_forward(q, k, v, causal, window) if forward_kernel == "auto" \
        else forward_kernel
    if kernel == "gluon" and not gluon_forward.gluon_supported(q, k, v, causal, window):
        raise _unsupported("forward_kernel", "the Gluon forward", gluon_forward.HEAD_DIMS, q)
    if kernel == "gluon":
        o, lse, _ = gluon_forward.launch(q, k, v, causal, sm_scale, window)
        return o, lse
    return triton_forward(q, k, v, causal, sm_scale, window=window)


def backward(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             o: torch.Tensor, lse: torch.Tensor, causal: bool, sm_scale: float,
             window: Window = (-1, -1), backward_kernel: str = "auto",
             deterministic: bool = False,
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) with the dK/dV kernel :func:`choose_backward` picks, or the one
    ``backward_kernel`` names ("gluon" raises a ValueError on inputs it does not support).
    The Gluon kernel computes dQ as well where :func:`prefers_fused_dq` holds, unless
    ``deterministic``: then dQ comes from Triton's dQ pass, and the same inputs give the same
    bits every run."""
    kernel = choose_backward(q, k, v, causal, window) if backward_kernel == "auto" \
        else backward_kernel
    if kernel == "gluon" and not gluon_backward.gluon_dkdv_supported(q, k, v, causal, window):
        raise _unsupported("backward_kernel", "the Gluon dK/dV kernel", gluon_backward.HEAD_DIMS,
                           q)
    fuse_dq = kernel == "gluon" and not deterministic and \
        prefers_fused_dq(q.shape[-1], causal, window)
    return triton_backward(do, q, k, v, o, lse, causal, sm_scale, window=window,
                           dkdv_kernel=kernel, fuse_dq=fuse_dq)


__all__ = ["BACKWARD_KERNELS", "FORWARD_KERNELS", "GLUON_HEAD_DIMS",
           "GLUON_MIN_BACKWARD_QUERIES", "GLUON_MIN_MASKED_KEYS", "backward",
           "check_backward_kernel", "check_forward_kernel", "choose_backward", "choose_forward",
           "forward", "prefers_fused_dq", "prefers_gluon", "prefers_gluon_backward",
           "widest_key_span",
           "widest_query_span"]
