"""Ring attention (context parallelism) on torch.distributed: shard the sequence, pass K/V around.

W processes each hold 1/W of the tokens (their Q, K and V rows). Attention of the local queries
needs every key, so the K/V shards travel around a ring: at step t, rank r holds the shard that
started on rank (r - t) mod W, attends its queries to it, and merges the partial result into its
running (m, l, acc) state with :func:`flashtext.online.merge_attention`, the same merge as
chapter 3's. While it computes, it already sends that shard on to rank r + 1 and receives the
next from rank r - 1 (``batch_isend_irecv``), so communication hides behind compute when a shard
is long enough (:func:`overlap_tokens`). No rank ever holds more than two K/V shards: memory per
rank is O(N / W). Liu et al. 2023, "Ring Attention with Blockwise Transformers", arXiv 2310.01889.

With a causal mask, contiguous shards leave ranks idle: rank 0's queries see only its own keys,
the last rank's see everything, and every ring step lasts as long as its busiest rank
(:func:`causal_work`, :func:`ring_time`). Assigning tokens round-robin ("striped", Brandon et al.
2023, arXiv 2311.09431) or in mirrored pairs of chunks ("zigzag") evens the work out.

The arithmetic here is float64 NumPy (exact, for checking); the transport is real: gloo on CPU,
NCCL when there is one GPU per rank. Processes are started with torch.multiprocessing's spawn on
127.0.0.1 and every collective has a timeout, so a broken run fails instead of hanging.
"""

from __future__ import annotations

import datetime
import os
import socket
import tempfile
from pathlib import Path

import numpy as np

from flashtext import reference
from flashtext.online import AttentionState, merge_attention

__all__ = [
    "LAYOUTS",
    "causal_work",
    "overlap_tokens",
    "ring_attention_shard",
    "ring_bytes",
    "ring_time",
    "run_ring",
    "shard_positions",
]

LAYOUTS = ("contiguous", "striped", "zigzag")


def _positive(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def shard_positions(n: int, world: int, rank: int, layout: str = "contiguous") -> np.ndarray:
    """Global token positions held by ``rank`` (sorted).

    * contiguous: rank r holds [r n/W, (r + 1) n/W);
    * striped: positions p with p mod W = r;
    * zigzag: the sequence cut into 2W chunks; rank r holds chunks r and 2W - 1 - r.
    """
    n, world = _positive(n, "n"), _positive(world, "world")
    if not 0 <= rank < world:
        raise ValueError(f"rank must be in [0, {world}), got {rank}")
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    chunks = 2 * world if layout == "zigzag" else world
    if n % chunks:
        raise ValueError(f"n={n} must be a multiple of {chunks} for the {layout} layout with "
                         f"world={world}")
    if layout == "contiguous":
        size = n // world
        return np.arange(rank * size, (rank + 1) * size)
    if layout == "striped":
        return np.arange(rank, n, world)
    size = n // chunks
    first, second = rank, chunks - 1 - rank
    return np.concatenate([np.arange(first * size, (first + 1) * size),
                           np.arange(second * size, (second + 1) * size)])


def _visible(q_pos: np.ndarray, k_pos: np.ndarray) -> np.ndarray:
    return k_pos[None, :] <= q_pos[:, None]


def causal_work(n: int, world: int, layout: str = "contiguous") -> np.ndarray:
    """(world, world) array: visible (query, key) pairs rank r handles at ring step t, i.e.
    its queries against the keys of rank (r - t) mod W, under a causal mask. A kernel skips
    the masked pairs (whole blocks of them), so this is the work each step costs each rank."""
    pos = [shard_positions(n, world, r, layout) for r in range(world)]
    work = np.zeros((world, world), dtype=np.int64)
    for r in range(world):
        for t in range(world):
            work[r, t] = _visible(pos[r], pos[(r - t) % world]).sum()
    return work


def ring_time(work: np.ndarray) -> dict[str, float]:
    """Every ring step waits for its slowest rank: time = sum over steps of the max over ranks.
    Compared with a perfect split of the same total work."""
    work = np.asarray(work, dtype=np.float64)
    if work.ndim != 2 or work.shape[0] != work.shape[1]:
        raise ValueError(f"work must be a square (ranks, steps) array, got shape {work.shape}")
    steps = work.max(axis=0).sum()
    ideal = work.sum() / work.shape[0]
    return {"time": float(steps), "ideal": float(ideal), "efficiency": float(ideal / steps)}


def ring_bytes(n: int, d: int, world: int, batch: int = 1, heads: int = 1,
               bytes_per_element: int = 2) -> dict[str, int]:
    """Bytes one forward pass sends around the ring. Each rank forwards a K and a V shard
    (n/W rows of d) at W - 1 of the W steps (the last shard is not sent on)."""
    for value, name in ((n, "n"), (d, "d"), (world, "world"), (batch, "batch"),
                        (heads, "heads"), (bytes_per_element, "bytes_per_element")):
        _positive(value, name)
    shard = 2 * (n // world) * d * batch * heads * bytes_per_element  # K and V
    per_rank = (world - 1) * shard
    return {"per_step_per_rank": shard, "per_rank": per_rank, "total": world * per_rank}


def overlap_tokens(matmul_flops: float, link_bandwidth: float, bytes_per_element: int = 2
                   ) -> float:
    """Smallest shard length n/W for which a step's compute hides its communication.

    Compute: 4 (n/W)^2 d FLOPs at ``matmul_flops``; communication: 2 (n/W) d bytes_per_element
    at ``link_bandwidth``. Equal when n/W = matmul_flops * bytes_per_element / (2 bandwidth):
    d cancels.
    """
    if matmul_flops <= 0 or link_bandwidth <= 0:
        raise ValueError("matmul_flops and link_bandwidth must be positive")
    return matmul_flops * bytes_per_element / (2 * link_bandwidth)


# -------------------------------------------------------------------------- the distributed part

def ring_attention_shard(q, k, v, n: int, causal: bool = False, scale: float | None = None,
                         layout: str = "contiguous", group=None):
    """Run on every rank of an initialised process group, with this rank's rows of Q, K, V
    (torch tensors (..., n/W, d), the rows :func:`shard_positions` assigns). Returns
    (output rows, lse rows, visible pairs per step) for the local queries, float64 NumPy."""
    import torch
    import torch.distributed as dist

    rank, world = dist.get_rank(group), dist.get_world_size(group)
    q_pos = shard_positions(n, world, rank, layout)
    if q.shape[-2] != len(q_pos) or k.shape != v.shape or k.shape[-2] != len(q_pos):
        raise ValueError(f"rank {rank} expects {len(q_pos)} rows of q, k and v, got "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    q64 = reference._f64(q)
    scale = reference.default_scale(q64.shape[-1]) if scale is None else scale
    state = AttentionState.empty(q64.shape[:-1], v.shape[-1])
    send_to, recv_from = (rank + 1) % world, (rank - 1) % world
    k_cur, v_cur = k.contiguous(), v.contiguous()
    work = []
    for t in range(world):
        pending = []
        if t < world - 1:  # pass the shard on while computing with it
            k_next, v_next = torch.empty_like(k_cur), torch.empty_like(v_cur)
            ops = [dist.P2POp(dist.isend, k_cur, send_to, group),
                   dist.P2POp(dist.irecv, k_next, recv_from, group),
                   dist.P2POp(dist.isend, v_cur, send_to, group),
                   dist.P2POp(dist.irecv, v_next, recv_from, group)]
            pending = dist.batch_isend_irecv(ops)
        k_pos = shard_positions(n, world, (rank - t) % world, layout)
        visible = _visible(q_pos, k_pos) if causal else np.ones((len(q_pos), len(k_pos)), bool)
        work.append(int(visible.sum()))
        if visible.any():  # a block that is masked everywhere is skipped, as a kernel would
            s = scale * (q64 @ np.swapaxes(reference._f64(k_cur), -1, -2))
            s = np.where(visible, s, -np.inf)
            state = merge_attention(state, AttentionState.from_block(s, reference._f64(v_cur)))
        for req in pending:
            req.wait()
        if pending:
            k_cur, v_cur = k_next, v_next
    return state.output(), state.lse(), work


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, backend: str, cases: list[dict], outdir: str,
            timeout: float) -> None:
    import torch
    import torch.distributed as dist

    if backend == "gloo":
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    device = torch.device(f"cuda:{rank}") if backend == "nccl" else torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=timeout))
    try:
        results = {}
        for i, case in enumerate(cases):
            rows = shard_positions(case["n"], world, rank, case["layout"])
            q, k, v = (torch.as_tensor(case[x][..., rows, :]).to(device) for x in "qkv")
            out, lse, work = ring_attention_shard(q, k, v, case["n"], case["causal"],
                                                  case.get("scale"), case["layout"])
            results[f"out{i}"], results[f"lse{i}"] = out, lse
            results[f"work{i}"], results[f"rows{i}"] = np.asarray(work), rows
        np.savez(Path(outdir) / f"rank{rank}.npz", **results)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def run_ring(q, k, v, world: int = 2, causal: bool = False, layout: str = "contiguous",
             scale: float | None = None, backend: str | None = None, timeout: float = 60.0,
             cases: list[dict] | None = None):
    """Start ``world`` processes on 127.0.0.1, shard (..., N, d) float64 inputs by ``layout``,
    run :func:`ring_attention_shard` on each, and gather the result in sequence order.

    Returns a dict with ``out`` (..., N, d), ``lse`` (..., N) and ``work`` (world, world:
    visible pairs per rank per step). ``backend``: "gloo" (CPU), "nccl" (needs ``world`` GPUs),
    or None to pick NCCL when enough GPUs exist. ``cases``: several input sets (dicts with
    q, k, v, causal, layout) run in one launch, to pay process start-up once; then a list of
    result dicts comes back.
    """
    import torch
    import torch.multiprocessing as mp

    world = _positive(world, "world")
    if backend is None:
        backend = "nccl" if torch.cuda.device_count() >= world else "gloo"
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend must be 'gloo' or 'nccl', got {backend!r}")
    single = cases is None
    if single:
        cases = [{"q": q, "k": k, "v": v, "causal": causal, "layout": layout, "scale": scale}]
    prepared = []
    for case in cases:
        arrays = {x: reference._f64(case[x]) for x in "qkv"}
        n = arrays["q"].shape[-2]
        if arrays["k"].shape[-2] != n or arrays["v"].shape[-2] != n:
            raise ValueError("ring attention here shards queries and keys alike: q, k, v need "
                             "the same sequence length")
        shard_positions(n, world, 0, case.get("layout", "contiguous"))  # validates n, layout
        prepared.append({**arrays, "n": n, "causal": bool(case.get("causal", False)),
                         "layout": case.get("layout", "contiguous"),
                         "scale": case.get("scale")})
    with tempfile.TemporaryDirectory() as outdir:
        mp.spawn(_worker, args=(world, _free_port(), backend, prepared, outdir, timeout),
                 nprocs=world, join=True)
        parts = [dict(np.load(Path(outdir) / f"rank{r}.npz")) for r in range(world)]
    results = []
    for i, case in enumerate(prepared):
        out = np.zeros(case["q"].shape[:-1] + (case["v"].shape[-1],))
        lse = np.zeros(case["q"].shape[:-1])
        for part in parts:
            out[..., part[f"rows{i}"], :] = part[f"out{i}"]
            lse[..., part[f"rows{i}"]] = part[f"lse{i}"]
        results.append({"out": out, "lse": lse, "backend": backend,
                        "work": np.stack([part[f"work{i}"] for part in parts])})
    return results[0] if single else results
