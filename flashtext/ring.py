"""Ring attention (context parallelism), the bookkeeping: who holds which tokens, what work and
traffic a ring costs, when compute hides the transfers, and a launcher for a ring of processes.

W processes each hold 1/W of the tokens (their Q, K and V rows). Attention of the local queries
needs every key, so the K/V shards travel around a ring: at step t, rank r holds the shard that
started on rank (r - t) mod W, attends its queries to it and merges the partial result into its
running one, while it already sends that shard on to rank r + 1. The ring itself, on
torch.distributed with the book's Triton kernels, is :func:`flashtext.ring_attention`
(:mod:`flashtext.context_parallel`). Liu et al. 2023, "Ring Attention with Blockwise
Transformers for Near-Infinite Context", arXiv 2310.01889.

With a causal mask, contiguous shards leave ranks idle: rank 0's queries see only its own keys,
the last rank's see everything, and every ring step lasts as long as its busiest rank
(:func:`causal_work`, :func:`ring_time`). Assigning tokens round-robin ("striped", Brandon et al.
2023, arXiv 2311.09431) or in mirrored pairs of chunks ("zigzag") evens the work out.

:func:`launch` starts the processes (torch.multiprocessing on 127.0.0.1: gloo on CPU, NCCL with
one GPU per rank); every collective has a timeout, so a broken run fails instead of hanging.
"""

from __future__ import annotations

import datetime
import multiprocessing
import os
import socket
import tempfile
from pathlib import Path

import numpy as np

from flashtext.device import interpreter_usable

__all__ = [
    "LAYOUTS",
    "causal_work",
    "overlap_tokens",
    "launch",
    "ring_bytes",
    "ring_time",
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


# -------------------------------------------------------------------------- processes

def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, backend: str, fn, args: tuple, outdir: str,
            timeout: float) -> None:
    import torch
    import torch.distributed as dist

    if backend == "gloo":
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=timeout),
                            **({"device_id": device} if backend == "nccl" else {}))
    try:
        result = fn(rank, world, device, *args)
        torch.save(result, Path(outdir) / f"rank{rank}.pt")
        dist.barrier()
    finally:
        dist.destroy_process_group()


def launch(fn, world: int, args: tuple = (), backend: str | None = None,
           timeout: float = 60.0) -> list:
    """Start ``world`` processes on 127.0.0.1, each joined to one process group, run
    ``fn(rank, world, device, *args)`` on every rank and return the ranks' results in rank
    order (each must be something ``torch.save`` can store).

    ``fn`` must be importable (defined at the top level of a module: spawned processes import
    it by name). ``backend``: "gloo" (CPU processes), "nccl" (one GPU per rank, ``device`` is
    ``cuda:rank``), or None for NCCL when there are ``world`` GPUs. Every collective times out
    after ``timeout`` seconds and the other ranks are stopped when one fails, so a broken ring
    raises instead of hanging. CPU ranks are forked from a server process started on the
    first gloo launch (so they see the environment variables of that moment, with
    ``TRITON_INTERPRET=1``: CPU tensors run only under the interpreter, also where a GPU
    exists); GPU ranks are spawned afresh and see the caller's environment.
    """
    import torch
    import torch.multiprocessing as mp

    world = _positive(world, "world")
    if backend is None:
        backend = "nccl" if torch.cuda.device_count() >= world else "gloo"
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend must be 'gloo' or 'nccl', got {backend!r}")
    if backend == "nccl" and torch.cuda.device_count() < world:
        raise ValueError(f"backend 'nccl' needs one GPU per rank: world={world}, "
                         f"{torch.cuda.device_count()} GPUs here")
    if not callable(fn):
        raise ValueError(f"fn must be a function, got {type(fn).__name__}")
    if backend == "gloo" and not interpreter_usable():
        import triton

        raise ValueError(f"backend 'gloo' runs the kernels on CPU tensors under Triton's "
                         f"interpreter, which cannot run with triton {triton.__version__} and "
                         f"numpy {np.__version__}: use backend 'nccl' with one GPU per rank")
    # CPU ranks fork from one server process that has imported torch and flashtext once (the
    # import is most of a rank's start-up here); GPU ranks start fresh (CUDA does not survive
    # a fork)
    method = "forkserver" if backend == "gloo" else "spawn"
    if method == "forkserver":
        multiprocessing.get_context("forkserver").set_forkserver_preload(
            ["torch", "torch.distributed", "flashtext.context_parallel", "flashtext.kernels"])
    # gloo ranks hold CPU tensors, which only Triton's interpreter runs: their server starts
    # with TRITON_INTERPRET=1 on a machine with a GPU too (the variable is put back after)
    saved = os.environ.get("TRITON_INTERPRET")
    if method == "forkserver":
        os.environ["TRITON_INTERPRET"] = "1"
    try:
        with tempfile.TemporaryDirectory() as outdir:
            mp.start_processes(_worker, args=(world, _free_port(), backend, fn, tuple(args),
                                              outdir, timeout), nprocs=world, join=True,
                               start_method=method)
            return [torch.load(Path(outdir) / f"rank{r}.pt", weights_only=False)
                    for r in range(world)]
    finally:
        if saved is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = saved
