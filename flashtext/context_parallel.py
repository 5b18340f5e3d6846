"""Ring attention on torch.distributed with the book's Triton kernels: ``ring_attention``.

Every rank of a process group holds its shard of the sequence: q, k and v of shape
(batch, heads, N/W, head_dim), the rows :func:`flashtext.ring.shard_positions` gives it under
``layout``. Attention of the local queries needs every key, so the K/V shards travel around the
ring: at step t rank r holds the shard that started on rank s = (r - t) mod W. It posts the send
of that shard to rank r + 1 and the receive of the next one from rank r - 1 (``isend``/``irecv``
through ``batch_isend_irecv``), runs :func:`flashtext.kernels.attention_forward` on the shard in
hand while the transfer runs, and merges the block's (O, lse) into its running result by their
log-sum-exps, chapter 3's merge with (m, l, acc) = (lse, 1, O). Memory per rank stays O(N/W).
Liu et al. 2023, "Ring Attention with Blockwise Transformers for Near-Infinite Context",
arXiv 2310.01889.

The backward runs the same ring once more. Each rank keeps its dQ; the K/V shards travel again,
and with each shard travels the fp32 sum of the dK/dV contributions of the ranks it has visited
(``attention_backward`` on the shard in hand, given the forward's merged O and lse); after W
steps one last hop brings every shard's complete dK/dV home to its owner.

Which blocks the kernel computes. The kernel's causal mask is bottom-right aligned (query i sees
key j iff j <= i + N_k - N_q) and there is no per-block mask, so the layouts are chosen so that
every (query shard, key shard) block is fully visible, fully hidden (skipped), or a block that is
exactly the kernel's causal mask:

* ``contiguous``: rank r holds positions [r N/W, (r + 1) N/W). Its own shard is causal with
  N_q = N_k, earlier shards are fully visible, later ones hidden. Correct but unbalanced: rank 0
  idles while the last rank works at every step (``flashtext.ring.causal_work``).
* ``zigzag`` (the default): the sequence cut into 2W chunks, rank r holds chunks r and 2W-1-r.
  Its own shard is causal with N_q = N_k (the two chunks, in order, are an ordered sequence);
  from a rank s < r it attends all its queries to the first half of the keys (chunk s comes
  before both of its chunks, chunk 2W-1-s after both); from s > r only its second half of the
  queries (chunk 2W-1-r) attends, to all the keys. Every step costs every rank the same.
* ``striped`` (Brandon et al. 2023, arXiv 2311.09431): rank r holds positions p = r mod W.
  Local query i (position iW + r) sees local key j of rank s (position jW + s) iff j <= i when
  s <= r: causal with N_q = N_k; and iff j <= i - 1 when s > r: causal with the last key dropped
  (N_k = N_q - 1, so the bottom-right mask is exactly j <= i - 1; query 0 sees no key there and
  the kernel returns lse = -inf for it, weight 0 in the merge).

Works on gloo (CPU processes, the kernels under Triton's interpreter) and NCCL (one GPU per
rank). Blocks' outputs come from the kernel in the input dtype; the merge, dQ and the travelling
dK/dV are accumulated in float32.
"""

from __future__ import annotations

import math
import numbers
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.autograd.function import once_differentiable

from flashtext.ring import LAYOUTS, shard_positions

__all__ = [
    "LAYOUTS",
    "RingAttentionFunction",
    "block_plan",
    "merge_partial",
    "overlap_summary",
    "profile_ring",
    "profile_worker",
    "ring_attention",
    "ring_backward",
    "ring_forward",
    "run_cases",
    "shard",
    "unshard",
]

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_TAG_K, _TAG_V, _TAG_DK, _TAG_DV = 1, 2, 3, 4  # gloo matches messages by tag; NCCL by order


# ------------------------------------------------------------------------------ sharding

def shard(x: torch.Tensor, rank: int, world: int, layout: str = "zigzag") -> torch.Tensor:
    """Rank ``rank``'s rows (dim 2) of a full-sequence (batch, heads, N, d) tensor, or of a
    (batch, heads, N) one such as a log-sum-exp."""
    if not isinstance(x, torch.Tensor) or x.dim() not in (3, 4):
        raise ValueError("x must be a (batch, heads, seq[, head_dim]) torch.Tensor")
    rows = torch.as_tensor(shard_positions(x.shape[2], world, rank, layout), device=x.device)
    return x.index_select(2, rows).contiguous()


def unshard(parts: list[torch.Tensor], layout: str = "zigzag") -> torch.Tensor:
    """Inverse of :func:`shard`: the ranks' shards (in rank order) back in sequence order. Works
    for (batch, heads, N/W, d) outputs and (batch, heads, N/W) log-sum-exps alike."""
    world = len(parts)
    n = sum(p.shape[2] for p in parts)
    out = parts[0].new_empty(parts[0].shape[:2] + (n,) + parts[0].shape[3:])
    for rank, part in enumerate(parts):
        rows = torch.as_tensor(shard_positions(n, world, rank, layout), device=part.device)
        out.index_copy_(2, rows, part)
    return out


# ------------------------------------------------------------------------------ one step

@dataclass(frozen=True)
class Block:
    """What rank r computes with the K/V shard of rank s: queries[q_rows] against keys[k_rows],
    with the kernel's causal mask or none."""

    q_rows: slice
    k_rows: slice
    causal: bool

    def pairs(self, n_local: int) -> int:
        """(query, key) pairs the kernel evaluates (the masked ones it skips excluded)."""
        n_q = len(range(*self.q_rows.indices(n_local)))
        n_k = len(range(*self.k_rows.indices(n_local)))
        if not self.causal:
            return n_q * n_k
        return sum(max(0, min(n_k, i + n_k - n_q + 1)) for i in range(n_q))


def block_plan(rank: int, source: int, world: int, n_local: int, causal: bool,
               layout: str) -> Block | None:
    """The block rank ``rank`` computes with the shard that started on rank ``source``
    (None: fully hidden, skipped). See the module docstring for why each case is exact."""
    every = slice(None)
    if not causal:
        return Block(every, every, False)
    if source == rank:
        return Block(every, every, True)
    earlier = source < rank
    if layout == "contiguous":
        return Block(every, every, False) if earlier else None
    if layout == "zigzag":
        half = n_local // 2
        return (Block(every, slice(0, half), False) if earlier
                else Block(slice(half, None), every, False))
    if layout == "striped":
        if earlier:
            return Block(every, every, True)
        return Block(every, slice(0, n_local - 1), True) if n_local > 1 else None
    raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")


def merge_partial(o: torch.Tensor, lse: torch.Tensor, o_block: torch.Tensor,
                  lse_block: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge a block's normalised output and lse into a running (o, lse), float32.

    lse = log(e^lse + e^lse_block); o = e^(lse - new) o + e^(lse_block - new) o_block. A side
    with lse = -inf (no key seen yet) gets weight 0; where both are -inf the row stays 0."""
    new = torch.logaddexp(lse, lse_block)
    shift = torch.where(torch.isneginf(new), torch.zeros_like(new), new)
    w_old = torch.exp(lse - shift).unsqueeze(-1)
    w_block = torch.exp(lse_block - shift).unsqueeze(-1)
    return w_old * o + w_block * o_block.float(), new


# ------------------------------------------------------------------------------ communication

def _peers(group) -> tuple[int, int, int, int]:
    """(rank, world, global rank of the next, of the previous) in ``group``."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    if group is not None:
        nxt, prv = dist.get_global_rank(group, nxt), dist.get_global_rank(group, prv)
    return rank, world, nxt, prv


def _pass_on(tensors: list[torch.Tensor], tags: list[int], nxt: int, prv: int, group):
    """Send ``tensors`` to the next rank and receive as many like them from the previous one.
    Returns (receive buffers, transfer); the transfer keeps the outgoing tensors alive until
    :func:`_wait` (their memory must not be reused while a send still reads it)."""
    incoming = [torch.empty_like(t) for t in tensors]
    ops = []
    for t, buf, tag in zip(tensors, incoming, tags, strict=True):
        ops.append(dist.P2POp(dist.isend, t, nxt, group, tag))
        ops.append(dist.P2POp(dist.irecv, buf, prv, group, tag))
    return incoming, (dist.batch_isend_irecv(ops), tensors)


def _wait(transfer) -> None:
    if transfer:
        for req in transfer[0]:
            req.wait()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ------------------------------------------------------------------------------ forward, backward

def ring_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                 sm_scale: float, layout: str, group=None, *, compute: bool = True,
                 communicate: bool = True, step_times: list[float] | None = None,
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """The forward ring on this rank: (O in q's dtype, lse float32 (batch, heads, N/W)).

    ``compute=False`` or ``communicate=False`` leave out the kernels or the transfers (the
    result is then meaningless) so :func:`profile_ring` can time each alone; ``step_times``
    collects each step's wall time (the device synchronised at the end of every step)."""
    from flashtext.kernels import attention_forward

    rank, world, nxt, prv = _peers(group)
    n_local = q.shape[2]
    o = torch.zeros(q.shape[:3] + (v.shape[3],), dtype=torch.float32, device=q.device)
    lse = torch.full(q.shape[:3], -math.inf, dtype=torch.float32, device=q.device)
    k_cur, v_cur = k.contiguous(), v.contiguous()  # sent as they are: dense
    for step in range(world):
        start = time.perf_counter()
        pending = None
        if communicate and step < world - 1:  # send the shard on while computing with it
            (k_next, v_next), pending = _pass_on([k_cur, v_cur], [_TAG_K, _TAG_V], nxt, prv,
                                                 group)
        block = block_plan(rank, (rank - step) % world, world, n_local, causal, layout)
        if compute and block is not None:
            qr, kr = block.q_rows, block.k_rows
            o_b, lse_b = attention_forward(q[:, :, qr], k_cur[:, :, kr], v_cur[:, :, kr],
                                           block.causal, sm_scale)
            o[:, :, qr], lse[:, :, qr] = merge_partial(o[:, :, qr], lse[:, :, qr], o_b, lse_b)
        _wait(pending)
        if pending:
            k_cur, v_cur = k_next, v_next
        if step_times is not None:
            _sync(q.device)
            step_times.append(time.perf_counter() - start)
    return o.to(q.dtype), lse


def ring_backward(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  o: torch.Tensor, lse: torch.Tensor, causal: bool, sm_scale: float,
                  layout: str, group=None, *, compute: bool = True, communicate: bool = True,
                  step_times: list[float] | None = None,
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The backward ring on this rank: (dq, dk, dv) for its own shards, in the input dtype.

    Per block the kernel's backward takes the *merged* O and lse, so its P = exp(S - lse) is
    already the full softmax's; dQ adds up locally; dK/dV of the shard in hand are added to
    the running sums that arrived with it and sent on with it (then home, one hop more)."""
    from flashtext.kernels import attention_backward

    rank, world, nxt, prv = _peers(group)
    n_local = q.shape[2]
    dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    k_cur, v_cur = k.contiguous(), v.contiguous()
    d_pending, dk_in, dv_in = None, None, None
    for step in range(world):
        start = time.perf_counter()
        kv_pending = None
        if communicate and step < world - 1:
            (k_next, v_next), kv_pending = _pass_on([k_cur, v_cur], [_TAG_K, _TAG_V], nxt,
                                                    prv, group)
        dk = torch.zeros(k.shape, dtype=torch.float32, device=k.device)
        dv = torch.zeros(v.shape, dtype=torch.float32, device=v.device)
        block = block_plan(rank, (rank - step) % world, world, n_local, causal, layout)
        if compute and block is not None:
            qr, kr = block.q_rows, block.k_rows
            dq_b, dk_b, dv_b = attention_backward(
                do[:, :, qr], q[:, :, qr], k_cur[:, :, kr], v_cur[:, :, kr], o[:, :, qr],
                lse[:, :, qr].contiguous(), block.causal, sm_scale)
            dq[:, :, qr] += dq_b
            dk[:, :, kr] += dk_b
            dv[:, :, kr] += dv_b
        _wait(d_pending)  # the sums that travelled with this shard so far
        if dk_in is not None:
            dk += dk_in
            dv += dv_in
        _wait(kv_pending)
        if kv_pending:
            k_cur, v_cur = k_next, v_next
        if communicate and world > 1:  # on with the shard (after the last step: home)
            (dk_in, dv_in), d_pending = _pass_on([dk, dv], [_TAG_DK, _TAG_DV], nxt, prv, group)
        if step_times is not None:
            _sync(q.device)
            step_times.append(time.perf_counter() - start)
    if d_pending:  # the last hop home, counted in the last step
        start = time.perf_counter()
        _wait(d_pending)
        if step_times is not None:
            _sync(q.device)
            step_times[-1] += time.perf_counter() - start
    if world == 1 or not communicate:
        dk_in, dv_in = dk, dv
    return dq.to(q.dtype), dk_in.to(k.dtype), dv_in.to(v.dtype)


class RingAttentionFunction(torch.autograd.Function):
    """Autograd: the forward ring saves its shards, O and lse; the backward runs the dK/dV ring.
    Every rank of the group must call backward (it communicates). lse is an output without a
    gradient."""

    @staticmethod
    def forward(ctx, q, k, v, causal: bool, sm_scale: float, layout: str, group):
        o, lse = ring_forward(q, k, v, causal, sm_scale, layout, group)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.causal, ctx.sm_scale, ctx.layout, ctx.group = causal, sm_scale, layout, group
        ctx.mark_non_differentiable(lse)
        return o, lse

    @staticmethod
    @once_differentiable  # the backward ring's kernels are not themselves differentiable
    def backward(ctx, do, _dlse):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = ring_backward(do.to(q.dtype).contiguous(), q, k, v, o, lse, ctx.causal,
                                   ctx.sm_scale, ctx.layout, ctx.group)
        return dq, dk, dv, None, None, None, None


# ------------------------------------------------------------------------------ validation

def _validate(q, k, v, causal, sm_scale, layout, group, check_ranks: bool = True) -> float:
    """Check this rank's inputs, then (``check_ranks``) that every rank of the group agrees on
    them (one small all_gather), so a mismatch is a ValueError on every rank, never a hang.
    Returns the scale."""
    from flashtext.kernels import attention_forward

    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"{name} must be a 4-d torch.Tensor (batch, heads, N/W, head_dim), "
                             f"this rank's shard; got {got}")
    if not (q.shape == k.shape == v.shape):
        raise ValueError("q, k and v must be shards of one sequence, of one shape (batch, heads, "
                         f"N/W, head_dim): got q {tuple(q.shape)}, k {tuple(k.shape)}, "
                         f"v {tuple(v.shape)}")
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if layout == "zigzag" and q.shape[2] % 2:
        raise ValueError(f"q: the zigzag layout gives each rank two equal chunks, so N/W (dim 2) "
                         f"must be even, got {q.shape[2]}")
    if not isinstance(causal, bool):
        raise ValueError(f"causal must be True or False, got {causal!r}")
    if sm_scale is not None and (isinstance(sm_scale, bool)
                                 or not isinstance(sm_scale, numbers.Real)
                                 or not math.isfinite(sm_scale)):
        raise ValueError(f"sm_scale must be a finite number or None (1/sqrt(head_dim)), "
                         f"got {sm_scale!r}")
    scale = 1.0 / math.sqrt(q.shape[3]) if sm_scale is None else float(sm_scale)
    if not dist.is_available() or not dist.is_initialized():
        raise ValueError("group: ring_attention needs an initialised torch.distributed process "
                         "group (torch.distributed.init_process_group, or flashtext.ring.launch)")
    # the kernel's own checks (dtype, head_dim, device) on an empty slice, before any transfer
    attention_forward(q[:, :, :0], k[:, :, :0], v[:, :, :0], causal, scale)
    if not isinstance(check_ranks, bool):
        raise ValueError(f"check_ranks must be True or False, got {check_ranks!r}")
    if not check_ranks:
        return scale
    world = dist.get_world_size(group)
    mine = torch.tensor([*q.shape, DTYPES.index(q.dtype), int(causal), LAYOUTS.index(layout),
                         round(scale * 2**40)], dtype=torch.int64, device=q.device)
    every = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(every, mine, group=group)
    differ = [r for r, theirs in enumerate(every) if not torch.equal(theirs, mine)]
    if differ:
        raise ValueError(f"q: every rank must pass shards of one shape and dtype with the same "
                         f"causal, sm_scale and layout; rank {dist.get_rank(group)} has shape "
                         f"{tuple(q.shape)}, {q.dtype}, causal={causal}, layout={layout!r}, "
                         f"and ranks {differ} differ")
    return scale


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                   sm_scale: float | None = None, group=None, layout: str = "zigzag",
                   return_lse: bool = False, check_ranks: bool = True):
    """Exact attention over a sequence sharded across the ranks of ``group`` (default: the
    world), differentiable. Call it on every rank with that rank's shards (:func:`shard` makes
    them from a full tensor; :func:`unshard` puts outputs back in order); returns this rank's
    rows of softmax(sm_scale q k^T [+ causal mask]) v over the *whole* sequence. See the module
    docstring for the ring, the layouts and the blocks the kernel computes.

    ``return_lse=True`` also returns this rank's log-sum-exps over the whole sequence
    ((batch, heads, N/W), float32, natural log; no gradient flows through them).
    ``check_ranks=False`` skips the check that all ranks passed shards of one shape, dtype,
    mask, scale and layout: one all_gather and a wait for it on the host per call, worth
    skipping in a training loop whose shapes are known to agree (a mismatch then fails only
    when the transfers do, or at the group's timeout)."""
    scale = _validate(q, k, v, causal, sm_scale, layout, group, check_ranks)
    o, lse = RingAttentionFunction.apply(q, k, v, causal, scale, layout, group)
    return (o, lse) if return_lse else o


# ------------------------------------------------------------------------------ measuring

def profile_ring(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                 layout: str = "zigzag", group=None, repeats: int = 3,
                 backward: bool = False) -> dict:
    """Time one rank's ring, per step, three ways: kernels alone (``compute``), transfers alone
    (``communicate``), and the real ring with both overlapped (``ring``), taking turns. Each is
    the median over ``repeats`` rounds after one warm-up round, in seconds, one entry per ring
    step. ``overlap``: the fraction of the smaller of compute and communication that the ring
    hid, (compute + communicate - ring) / min(compute, communicate), clipped to [0, 1], summed
    over the steps that send (the last forward step sends nothing)."""
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be a positive integer, got {repeats!r}")
    scale = _validate(q, k, v, causal, None, layout, group)
    world = dist.get_world_size(group)

    def once(compute: bool, communicate: bool) -> list[float]:
        times: list[float] = []
        dist.barrier(group=group)
        if backward:
            o, lse = ring_forward(q, k, v, causal, scale, layout, group)
            ring_backward(torch.ones_like(q), q, k, v, o, lse, causal, scale, layout, group,
                          compute=compute, communicate=communicate, step_times=times)
        else:
            ring_forward(q, k, v, causal, scale, layout, group, compute=compute,
                         communicate=communicate, step_times=times)
        return times

    # the three ways take turns, so a machine whose speed drifts (shared cores, clocks)
    # slows all three alike; one warm-up round first
    modes = {"compute": (True, False), "communicate": (False, True), "ring": (True, True)}
    runs: dict[str, list[list[float]]] = {name: [] for name in modes}
    for round_ in range(repeats + 1):
        for name, (do_compute, do_communicate) in modes.items():
            times = once(do_compute, do_communicate)
            if round_:
                runs[name].append(times)
    compute, communicate, ring = (
        torch.tensor(runs[name], dtype=torch.float64).median(dim=0).values.tolist()
        for name in modes)
    sending = range(world if backward else world - 1)
    c = sum(compute[i] for i in sending)
    m = sum(communicate[i] for i in sending)
    s = sum(ring[i] for i in sending)
    hidden = (c + m - s) / min(c, m) if min(c, m) > 0 else 0.0
    rank = dist.get_rank(group)
    plans = [block_plan(rank, (rank - t) % world, world, q.shape[2], causal, layout)
             for t in range(world)]
    return {"compute": compute, "communicate": communicate, "ring": ring,
            "overlap": max(0.0, min(1.0, hidden)), "world": world, "rank": rank,
            "pairs": [0 if b is None else b.pairs(q.shape[2]) for b in plans],
            "batch": q.shape[0], "heads": q.shape[1], "n_local": q.shape[2],
            "head_dim": q.shape[3], "element_size": q.element_size(), "causal": causal,
            "layout": layout, "backward": backward}


def overlap_summary(profile: dict) -> dict:
    """What one rank's :func:`profile_ring` says about the overlap condition, over the steps
    that send (forward only).

    ``rate``: the kernel's FLOP/s (4 d FLOPs per visible (query, key) pair, the two matmuls);
    ``bandwidth``: bytes of one K/V shard over the time to pass it on alone; ``threshold``:
    the shard length n/W at which a full non-causal block's compute, 4 (n/W)^2 d, takes as long
    as its transfer, 2 (n/W) d bytes per element: R b / (2 BW), this hardware's condition.
    ``hidden``: the fraction of the transfer time the real ring did not pay for."""
    if profile["backward"]:
        raise ValueError("profile: overlap_summary reads a forward profile (backward=False)")
    sending = range(profile["world"] - 1)
    if not sending:
        raise ValueError("profile: a ring of one rank sends nothing; profile 2 or more ranks")
    per_head = profile["batch"] * profile["heads"]
    d, b, n = profile["head_dim"], profile["element_size"], profile["n_local"]
    flops = sum(4 * d * per_head * profile["pairs"][t] for t in sending)
    compute = sum(profile["compute"][t] for t in sending)
    communicate = sum(profile["communicate"][t] for t in sending)
    ring = sum(profile["ring"][t] for t in sending)
    shard_bytes = 2 * n * d * per_head * b * len(sending)  # K and V, every sending step
    rate, bandwidth = flops / compute, shard_bytes / communicate
    return {"compute": compute / len(sending), "communicate": communicate / len(sending),
            "ring": ring / len(sending), "rate": rate, "bandwidth": bandwidth,
            "threshold": rate * b / (2 * bandwidth),
            "hidden": max(0.0, min(1.0, (compute + communicate - ring) / communicate)),
            "overlap": profile["overlap"]}


# ------------------------------------------------------------------------------ a worker

def run_cases(rank: int, world: int, device: torch.device, cases: list[dict]) -> list[dict]:
    """A worker for :func:`flashtext.ring.launch`: run each case through
    :func:`ring_attention` and its backward on this rank; the tests and chapter 14 use it.

    A case holds full-sequence CPU tensors ``q``, ``k``, ``v``, ``do`` (batch, heads, N, d)
    and ``causal``, ``layout``, ``sm_scale``; every rank takes its shard. ``mismatch_rank``
    (optional) makes that rank pass shards two rows short, to show the cross-rank check. Returns
    per case this rank's ``o``, ``lse``, ``dq``, ``dk``, ``dv`` (CPU) and ``pairs`` (the
    (query, key) pairs of the block the kernel got at each step), or ``error`` (the
    ValueError's text)."""
    results = []
    for case in cases:
        layout = case.get("layout", "zigzag")
        local = [shard(case[x], rank, world, layout).to(device) for x in ("q", "k", "v")]
        if case.get("mismatch_rank") == rank:
            local = [t[:, :, :-2] for t in local]
        q, k, v = (t.detach().requires_grad_(True) for t in local)
        try:
            o, lse = ring_attention(q, k, v, case.get("causal", False), case.get("sm_scale"),
                                    layout=layout, return_lse=True)
        except ValueError as err:
            results.append({"error": str(err)})
            continue
        o.backward(shard(case["do"], rank, world, layout).to(device=device, dtype=o.dtype))
        plans = [block_plan(rank, (rank - t) % world, world, q.shape[2], case.get("causal", False),
                            layout) for t in range(world)]
        results.append({"o": o.detach().cpu(), "lse": lse.cpu(), "dq": q.grad.cpu(),
                        "dk": k.grad.cpu(), "dv": v.grad.cpu(),
                        "pairs": [0 if b is None else b.pairs(q.shape[2]) for b in plans]})
    return results


def profile_worker(rank: int, world: int, device: torch.device, n_local: int, batch: int = 1,
                   heads: int = 2, head_dim: int = 16, dtype: torch.dtype = torch.float32,
                   causal: bool = True, layout: str = "zigzag", repeats: int = 3,
                   backward: bool = False) -> dict:
    """A worker for :func:`flashtext.ring.launch`: :func:`profile_ring` on random shards of
    ``n_local`` tokens per rank (seeded by rank)."""
    g = torch.Generator().manual_seed(rank)
    q, k, v = (torch.randn((batch, heads, n_local, head_dim), generator=g)
               .to(device=device, dtype=dtype) for _ in range(3))
    return profile_ring(q, k, v, causal, layout, repeats=repeats, backward=backward)
