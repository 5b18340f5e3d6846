"""Which kernels run a dense call: the Gluon FA3-style ones or the Triton FA2 ones.

On an sm_90 GPU the Gluon kernel (:mod:`flashtext.kernels.gluon_forward`, chapter 13) runs the
forward where it was measured faster than the Triton kernel (:mod:`flashtext.kernels.forward`,
chapter 10); everywhere else (other GPUs, the CPU interpreter, float32, packed sequences,
layouts the copy engine cannot address) the Triton kernel runs. Both return the same O and lse,
so the backward kernels do not care which one ran.

The rule, from side-by-side H200 runs (``BENCHMARKS.md``, v8):

* Gluon at d = 64, 128 and 256, except a masked call (causal or a window) whose queries each
  see fewer keys than :data:`GLUON_MIN_MASKED_KEYS` gives for its head dimension: a query block
  then has only a few key tiles to pipeline, and the Triton kernel (with its 64 x 64 tiles for
  short causal passes) was measured level with the Gluon one or faster.
* The Gluon forward runs *persistent* (one program per SM, each looping over work tiles, so
  that a tile's loads overlap the previous tile's end) at d = 64 and 128 without a mask, and
  with one up to :data:`PERSISTENT_MAX_MASKED_KEYS` keys a query: a program there has few key
  tiles, and starting and ending it is a large part of its time. Past that, the causal tiles
  of a head differ so much in length that one program per tile, handed out by the GPU as SMs
  free up, balances them better than a fixed round-robin.
* At d = 64 the Gluon forward runs *three* consumer warpgroups (192 query rows a program,
  FlashAttention-3's split at this head dimension) everywhere but a masked call short enough to
  run persistent: without a mask, persistent; with one, one program per tile. Three warpgroups
  of 160 registers leave ptxas fewer to spare, and it fits the loop without spilling only with
  the left-edge test compiled in, so these launches carry a left edge that hides no key
  (``open_left``). Measured in ``scripts/probe_gluon.py``
  (``flashtext/data/gluon_probe_h200.json``).

The backward's dK/dV pass (the larger part of it: four of its seven matmuls) runs the Gluon
kernel (:mod:`flashtext.kernels.gluon_backward`) where it can run the inputs (d = 64 and 128,
fp16 and bf16, on sm_90) and some key is seen by at least :data:`GLUON_MIN_BACKWARD_QUERIES`
queries. A program of the Gluon kernel loops over the query tiles that see its keys, and with
fewer of them (N = 512 and 1k in the sweep) the Triton backward was as fast or faster. The
preprocessing is Triton's either way.

Where the Gluon dK/dV kernel runs, it computes dQ as well (FlashAttention-3's way: each tile's
share added into an fp32 buffer by the copy engine's reduce-add), unless the caller asks for a
``deterministic`` backward. With a mask (causal or a window) each tile's dQ share is computed a
tile late (:func:`prefers_deferred_dq`): the two warpgroups exchange their halves of dS for it,
and taking the previous tile's lets neither wait for the other's current one. Measured in
``scripts/probe_gluon_backward.py`` (``flashtext/data/gluon_backward_probe_h200.json``). With
``deterministic``, dQ comes from Triton's ``_attn_bwd_dq``, which writes each row of dQ once, so
that the whole backward gives the same bits on every run.
"""

from __future__ import annotations

import torch

from flashtext.kernels import gluon_backward, gluon_forward
from flashtext.kernels.backward import backward as triton_backward
from flashtext.kernels.forward import forward as triton_forward

FORWARD_KERNELS = ("auto", "triton", "gluon")
BACKWARD_KERNELS = ("auto", "triton", "gluon")
GLUON_HEAD_DIMS = (64, 128, 256)
# a masked call whose queries see fewer keys than this (by head dimension) runs Triton
GLUON_MIN_MASKED_KEYS = {64: 4096, 128: 2048, 256: 0}
# a masked call whose queries see at most this many keys runs the Gluon forward persistent
PERSISTENT_MAX_MASKED_KEYS = {64: 4096, 128: 2048}
# head dimensions at which the Gluon forward runs three consumer warpgroups (192 query rows)
THREE_CONSUMER_HEAD_DIMS = (64,)
GLUON_MIN_BACKWARD_QUERIES = 2048  # a backward whose keys are each seen by fewer: Triton dK/dV
Window = tuple[int, int]


def is_masked(causal: bool, window: Window = (-1, -1)) -> bool:
    """Does the call hide some keys from some queries by position (causal or a window)?"""
    return causal or tuple(window) != (-1, -1)


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
    pass) the faster one on sm_90? At both of its head dimensions, masked or not."""
    return head_dim in gluon_backward.HEAD_DIMS


def prefers_deferred_dq(head_dim: int, causal: bool, window: Window = (-1, -1)) -> bool:
    """Where dQ is fused: is each tile's dQ share better taken a tile late? With a mask."""
    return prefers_fused_dq(head_dim, causal, window) and is_masked(causal, window)


def prefers_gluon(head_dim: int, n_q: int, n_k: int, causal: bool,
                  window: Window = (-1, -1)) -> bool:
    """The rule alone, by shape: is the Gluon forward the faster one on sm_90 here?"""
    if head_dim not in GLUON_HEAD_DIMS:
        return False
    return not (is_masked(causal, window) and widest_key_span(n_q, n_k, causal, window)
                < GLUON_MIN_MASKED_KEYS[head_dim])


def prefers_persistent(head_dim: int, n_q: int, n_k: int, causal: bool,
                       window: Window = (-1, -1)) -> bool:
    """Where the Gluon forward runs: is its persistent launch the faster one here?"""
    if head_dim not in PERSISTENT_MAX_MASKED_KEYS:
        return False
    return not is_masked(causal, window) or widest_key_span(n_q, n_k, causal, window) \
        <= PERSISTENT_MAX_MASKED_KEYS[head_dim]


def prefers_three_consumers(head_dim: int, n_q: int, n_k: int, causal: bool,
                            window: Window = (-1, -1)) -> bool:
    """Where the Gluon forward runs: three consumer warpgroups rather than two? At d = 64,
    unless the call is masked and short enough to run persistent."""
    if head_dim not in THREE_CONSUMER_HEAD_DIMS:
        return False
    return not (is_masked(causal, window)
                and prefers_persistent(head_dim, n_q, n_k, causal, window))


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
    shape = (q.shape[-1], q.shape[2], k.shape[2], causal, window)
    if forward_kernel == "triton":
        kernel = "triton"
    else:  # what choose_forward does, with the inputs checked once for the whole call
        supported = gluon_forward.gluon_supported(q, k, v, causal, window)
        if forward_kernel == "gluon" and not supported:
            raise _unsupported("forward_kernel", "the Gluon forward", gluon_forward.HEAD_DIMS,
                               q)
        kernel = "gluon" if supported and (forward_kernel == "gluon"
                                            or prefers_gluon(*shape)) else "triton"
    if kernel == "gluon":
        three = prefers_three_consumers(*shape)
        o, lse, _ = gluon_forward.launch(q, k, v, causal, sm_scale, window, checked=True,
                                         persistent=prefers_persistent(*shape),
                                         consumers=3 if three else 2, open_left=three)
        return o, lse
    return triton_forward(q, k, v, causal, sm_scale, window=window)


def backward(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             o: torch.Tensor, lse: torch.Tensor, causal: bool, sm_scale: float,
             window: Window = (-1, -1), backward_kernel: str = "auto",
             deterministic: bool = False,
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) with the dK/dV kernel :func:`choose_backward` picks, or the one
    ``backward_kernel`` names ("gluon" raises a ValueError on inputs it does not support).
    The Gluon kernel computes dQ as well where :func:`prefers_fused_dq` holds (a tile late
    where :func:`prefers_deferred_dq` does), unless ``deterministic``: then dQ comes from
    Triton's dQ pass, and the same inputs give the same bits every run."""
    if backward_kernel == "triton":
        kernel = "triton"
    else:  # what choose_backward does, with the inputs checked once here
        supported = gluon_backward.gluon_dkdv_supported(q, k, v, causal, window)
        if backward_kernel == "gluon" and not supported:
            raise _unsupported("backward_kernel", "the Gluon dK/dV kernel",
                               gluon_backward.HEAD_DIMS, q)
        kernel = "gluon" if supported and (backward_kernel == "gluon" or prefers_gluon_backward(
            q.shape[-1], q.shape[2], k.shape[2], causal, window)) else "triton"
    fuse_dq = kernel == "gluon" and not deterministic and \
        prefers_fused_dq(q.shape[-1], causal, window)
    defer_dq = fuse_dq and prefers_deferred_dq(q.shape[-1], causal, window)
    return triton_backward(do, q, k, v, o, lse, causal, sm_scale, window=window,
                           dkdv_kernel=kernel, fuse_dq=fuse_dq, defer_dq=defer_dq)


__all__ = ["BACKWARD_KERNELS", "FORWARD_KERNELS", "GLUON_HEAD_DIMS",
           "GLUON_MIN_BACKWARD_QUERIES", "GLUON_MIN_MASKED_KEYS", "PERSISTENT_MAX_MASKED_KEYS",
           "backward",
           "check_backward_kernel", "check_forward_kernel", "choose_backward", "choose_forward",
           "forward", "prefers_deferred_dq", "prefers_fused_dq", "prefers_gluon",
           "prefers_gluon_backward", "prefers_persistent",
           "widest_key_span",
           "widest_query_span"]
