"""A FlashAttention-3-style backward for Hopper (sm_90), written in Gluon (chapter 13).

The dK/dV half of the backward (:mod:`flashtext.kernels.backward` has the Triton version,
``_attn_bwd_dkdv``), and optionally dQ with it (else dQ comes from the separate Triton pass
``_attn_bwd_dq``), organised as FlashAttention-3 (Shah et al. 2024, arXiv 2407.08608)
organises it, in the style of :mod:`flashtext.kernels.gluon_forward`:

* **One program per key block.** A program (CTA) owns BLOCK_N = 128 keys of one (batch, K/V
  head); dK and dV for them stay in registers while it streams every query block that sees
  those keys, for each of the GROUP query heads sharing the K/V head (GQA: dK and dV sum over
  them, no atomics).
* **Warp specialisation.** The *producer* (the default partition) only issues copy-engine (TMA)
  loads: K and V once (one 64-key half per consumer), then Q_i and dO_i tile by tile into a
  ``STAGES``-deep ring of shared-memory slots, each slot guarded by ``q_ready`` / ``do_ready``
  (the bytes have landed) and ``empty`` (both consumers are done with it), with the phase
  parity of the forward's ``_load_tile``. Two *consumer* warpgroups of 64 keys each (wgmma's M)
  do the math with the registers the producer gives up (``worker_num_regs``, 240 a thread).
* **The loop** per query block, on transposed tiles (keys along rows, as FA3 does it, so that
  dV and dK are plain accumulating GEMMs): S^T = K Q^T and dP^T = V dO^T go to the tensor cores
  together; P^T = exp2(S^T * qk_scale - lse * log2 e) is recomputed from the forward's lse (no
  running max); dV += P^T dO is issued while dS^T = P^T * (dP^T - delta) is formed; then
  dK += dS^T Q. P^T and dS^T feed their GEMMs from registers. At the end dK *= sm_scale, and
  dK, dV leave through the copy engine from the consumer's own K / V slots.
* **Masks and tile skipping.** Causal is aligned bottom-right (query i sees key j iff
  j <= i + N_K - N_Q), sliding windows (left, right) bound the query tiles from both sides:
  query tiles no key of the block sees are never loaded, and only tiles that cross a window
  edge for one of the warpgroup's keys compute a mask. Rows past N_Q come from the copy engine
  as zeros with lse = +inf (P = 0); keys past N_K produce rows of dK, dV the output copy clips.
* **dQ, fused in** (``FUSE_DQ``, :func:`launch_dkdv`'s ``dq_accum``): a program sees each query
  tile once per query head but owns none of its dQ = sm_scale * dS K, a sum over every key
  block. So each consumer writes its dS (tile rows x its 64 keys) to shared memory, the two
  halves meet (mbarriers ``ds_ready`` / ``ds_free``, two buffers), and each consumer multiplies
  its share: its 64 of the tile's 128 rows at d = 64, its 64 of the 128 columns at d = 128,
  over all 128 keys. The 64 x 64 fp32 result goes to a staging tile in shared memory, and the
  copy engine adds it into a zeroed fp32 buffer (``cp.reduce.async.bulk.tensor ... .add``)
  while the consumer moves on. Per element fp32 atomics (``red.global.add``) did the same
  1.17-1.34x slower on the H200 and made the backward slower than a separate dQ pass
  (``BENCHMARKS.md``). The order of the additions varies from run to run; dK and dV stay each
  program's own.
* lse and delta (= rowsum(dO * O), ``backward.preprocess``) are read by the consumers
  themselves, not the producer (no copy-engine tiles for them: a (Z, H, N_Q) float32 row has
  16-byte aligned strides only when N_Q is a multiple of 4): plain loads of one number a
  thread, issued one tile ahead while S^T and dP^T are on the tensor cores, and spread over
  the accumulator's columns (through shared memory) only where they are used, so that they
  hold 2 registers a thread, not 32, next to dK and dV.
* Programs run key block by key block of one head: with a causal mask the first blocks, which
  every later query sees, are the longest and start first.

``flash_attention``'s backward runs it for the dK/dV pass on sm_90 where
:func:`gluon_dkdv_supported` holds and the rule of :mod:`flashtext.kernels.dispatch` picks it
(long enough sequences); its measured speed is in ``BENCHMARKS.md``.

Head dimensions 64 and 128. 256 does not fit this organisation: dK and dV of 64 keys x 256 are
128 fp32 registers a thread each, 256 together, over the 240 a consumer thread can have before
S^T and dP^T; and shared memory (K and V, 128 x 256 each, 128 KB) leaves room for one stage of
Q and dO (64 KB), not two (FA3 splits d = 256 differently).
"""

from __future__ import annotations

import torch

from flashtext.fa2 import LOG2E
from flashtext.kernels import fastpath
from flashtext.kernels.gluon_forward import (
    HAVE_GLUON,
    SUPPORTED_DTYPES,
    _descriptor,
    _shared_layout,
    _tma_layout_ok,
    _window_bounds,
    gluon_supported,
)

if HAVE_GLUON:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        mbarrier,
        tma,
        warpgroup_mma,
        warpgroup_mma_wait,
    )

if HAVE_GLUON:
    from triton._C.libtriton import ir as _ir
    from triton.experimental.gluon.language._core import builtin as _builtin
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as _GluonDescriptor

    @_builtin
    def _tma_reduce_add(tensor_desc, coord, src, _semantic=None):
        """The copy engine adds the shared-memory tile ``src`` into the global tile at
        ``coord`` (cp.reduce.async.bulk.tensor ... .add); ``tma.store_wait`` waits for it."""
        coord = _semantic._convert_to_ir_values(coord, require_i64=False)
        _semantic.builder.create_async_tma_reduce(_ir.DESCRIPTOR_REDUCE_KIND.ADD,
                                                  tensor_desc.handle, coord, src.handle)

    _thread_barrier = getattr(gl, "thread_barrier", None) or gl.barrier

BLOCK_N = 128  # keys per program: two consumer warpgroups of 64 (wgmma's M)
WG_N = 64
HEAD_DIMS = (64, 128)


def tile_config(head_dim: int) -> tuple[int, int]:
    """(BLOCK_M, STAGES) per head dimension: query rows per streamed tile and the depth of the
    Q/dO ring. Registers per consumer thread (of 240): dK and dV, 64 x d fp32 each, plus S^T and
    dP^T, 64 x BLOCK_M fp32 each; shared memory (227 KB): K and V (128 x d each) plus STAGES x
    (Q + dO) tiles of BLOCK_M x d, 2 bytes an element. At d = 64, 128-row tiles (S^T and dP^T
    of 64 x 128) ran the pass 1.17-1.25x as fast as 64-row ones on the H200 without a mask and
    1.00-1.05x with a causal one (``scripts/probe_gluon_backward.py``); at d = 128 they do not
    fit beside dK and dV (256 registers) and ran 1.7-2.0x slower."""
    if head_dim == 64:
        return 128, 2  # 32 + 2 * 32 = 96 KB
    if head_dim == 128:
        return 64, 3   # 64 + 3 * 32 = 160 KB
    raise ValueError(f"head_dim must be one of {HEAD_DIMS}, got {head_dim}")


def shared_memory_bytes(head_dim: int, block_m: int, stages: int, fuse_dq: bool = False) -> int:
    """Tile bytes in shared memory (fp16/bf16; barriers and alignment not counted). A fused dQ
    adds two buffers of dS (block_m x 128 keys, 2 bytes) and two 64 x 64 fp32 staging tiles."""
    tiles = 2 * (2 * BLOCK_N * head_dim + stages * 2 * block_m * head_dim)
    if fuse_dq:
        tiles += 2 * 2 * block_m * BLOCK_N + 2 * 4 * WG_N * WG_N
    return tiles


if HAVE_GLUON:
    _LOG2E = gl.constexpr(LOG2E)

    @gluon.jit
    def _block_coords(H_KV, GROUP, N_Q, N_K, LEFT, RIGHT, n_n_blocks,
                      BLOCK_M: gl.constexpr, HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr):
        """Program -> its key block and the query tiles [lo, hi) that see some of its keys.
        Key j is seen by rows i with j - hi_off <= i <= j - lo_off (bounded sides only)."""
        pid = gl.program_id(0)
        n_block = pid % n_n_blocks
        off_zhk = pid // n_n_blocks
        off_z = off_zhk // H_KV
        off_hk = off_zhk % H_KV
        start_n = n_block * 128
        causal_offset = N_K - N_Q
        lo_off = causal_offset - LEFT
        hi_off = causal_offset + RIGHT
        last_key = gl.minimum(start_n + 128, N_K) - 1
        lo_row = 0
        if HAS_RIGHT:
            lo_row = gl.maximum(start_n - hi_off, 0)
        hi_row = N_Q
        if HAS_LEFT:
            hi_row = gl.maximum(gl.minimum(N_Q, last_key - lo_off + 1), 0)
        lo = lo_row // BLOCK_M
        hi = gl.maximum(gl.cdiv(hi_row, BLOCK_M), lo)
        return off_z, off_hk, start_n, lo, hi, lo_off, hi_off

    @gluon.jit
    def _dkdv_producer(q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, bars,
                       H_KV, GROUP, N_Q, N_K, LEFT, RIGHT, n_n_blocks, BLOCK_M: gl.constexpr,
                       STAGES: gl.constexpr, HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr):
        """The copy-engine warpgroup: K and V halves once, then (Q_i, dO_i) for each query head
        of the group and each query tile i in [lo, hi), the t-th pair into slot t % STAGES once
        both consumers have released what it held STAGES pairs ago."""
        kv_ready, q_ready, do_ready, empty, _, _ = bars
        off_z, off_hk, start_n, lo, hi, lo_off, hi_off = _block_coords(
            H_KV, GROUP, N_Q, N_K, LEFT, RIGHT, n_n_blocks, BLOCK_M, HAS_LEFT, HAS_RIGHT)
        mbarrier.expect(kv_ready.index(0),
                        2 * k_desc.block_type.nbytes + 2 * v_desc.block_type.nbytes)
        for w in gl.static_range(2):
            tma.async_copy_global_to_shared(k_desc, [off_z, off_hk, start_n + w * 64, 0],
                                            kv_ready.index(0), k_smem.index(w))
            tma.async_copy_global_to_shared(v_desc, [off_z, off_hk, start_n + w * 64, 0],
                                            kv_ready.index(0), v_smem.index(w))
        # the t-th (Q, dO) pair: query head off_hk * GROUP + t // n_tiles, tile lo + t % n_tiles
        n_tiles = gl.maximum(hi - lo, 1)
        for t in range(GROUP * (hi - lo)):
            off_h = off_hk * GROUP + t // n_tiles
            start_m = (lo + t % n_tiles) * BLOCK_M
            slot = t % STAGES
            mbarrier.wait(empty.index(slot), ((t // STAGES) & 1) ^ 1)
            mbarrier.expect(q_ready.index(slot), q_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(q_desc, [off_z, off_h, start_m, 0],
                                            q_ready.index(slot), q_smem.index(slot))
            mbarrier.expect(do_ready.index(slot), do_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(do_desc, [off_z, off_h, start_m, 0],
                                            do_ready.index(slot), do_smem.index(slot))

    @gluon.jit
    def _row_stats(LSE, DELTA, t, total, n_tiles, lo, off_z, off_hk, H_KV, GROUP, N_Q,
                   BLOCK_M: gl.constexpr, STAT_L: gl.constexpr):
        """lse * log2(e) and delta of the t-th tile's query rows, one number a thread (none
        when t is past the last tile). Rows past N_Q and rows that saw no key (lse = -inf) get
        +inf, so that their P is 0."""
        off_h = off_hk * GROUP + t // n_tiles
        rows = (lo + t % n_tiles) * BLOCK_M + gl.arange(0, BLOCK_M, layout=STAT_L)
        ok = (rows < N_Q) & (t < total)
        stats = (off_z * (H_KV * GROUP) + off_h).to(gl.int64) * N_Q
        lse = gl.load(LSE + stats + rows, mask=ok, other=float("inf"))
        delta = gl.load(DELTA + stats + rows, mask=ok, other=0.0)
        return gl.where(lse == float("-inf"), float("inf"), lse) * _LOG2E, delta

    @gluon.jit
    def _dq_gemms(buf, WG: gl.constexpr, ds_smem, k_smem, HEAD_DIM: gl.constexpr,
                  BLOCK_M: gl.constexpr):
        """This warpgroup's 64 x 64 share of dS K for the tile whose dS halves are in buffer
        ``buf``: its 64 of the 128 query rows at d = 64, its 64 of the 128 columns at d = 128
        (BLOCK_M = 64), summed over both warpgroups' 64-key halves. Issued, not waited for."""
        Q_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                      instr_shape=[16, 64, 16])
        SPLIT_ROWS: gl.constexpr = BLOCK_M == 128
        dq = gl.zeros([64, 64], gl.float32, Q_L)
        for half in gl.static_range(2):  # sum over the two 64-key halves
            ds_h = ds_smem.index(buf * 2 + half)
            k_h = k_smem.index(half).reshape([64, HEAD_DIM])
            if SPLIT_ROWS:
                ds_h = ds_h.slice(WG * 64, 64, dim=0)
            else:
                k_h = k_h.slice(WG * 64, 64, dim=1)
            dq = warpgroup_mma(ds_h, k_h, dq, use_acc=half == 1, is_async=True)
        return dq

    @gluon.jit
    def _dq_add(dq, u, WG: gl.constexpr, dq_smem, dq_desc, sm_scale, lo, n_tiles, off_z,
                off_hk, GROUP, BLOCK_M: gl.constexpr):
        """Tile u's share (times sm_scale) into DQ, rows past N_Q clipped: staged in this
        warpgroup's fp32 tile once the copy engine has read the previous one out of it, then
        added by the copy engine's reduce-add."""
        SPLIT_ROWS: gl.constexpr = BLOCK_M == 128
        tma.store_wait(0)
        _thread_barrier()
        dq_smem.index(WG).reshape([64, 64]).store(dq * sm_scale)
        fence_async_shared()
        start_m = (lo + u % n_tiles) * BLOCK_M
        row0 = WG * 64 if SPLIT_ROWS else 0
        col0 = 0 if SPLIT_ROWS else WG * 64
        _tma_reduce_add(dq_desc, [off_z, off_hk * GROUP + u // n_tiles, start_m + row0, col0],
                        dq_smem.index(WG))

    @gluon.jit
    def _put_ds(ds_t, t, WG: gl.constexpr, ds_smem, ds_ready, ds_free):
        """This warpgroup's dS of tile t (queries x its 64 keys) into buffer t % 2, once both
        warpgroups are done reading what it held two tiles ago; says when it is in. Returns
        the buffer."""
        buf = t % 2
        mbarrier.wait(ds_free.index(buf), ((t // 2) & 1) ^ 1)
        ds_smem.index(buf * 2 + WG).permute((1, 0)).store(ds_t.to(ds_smem.dtype))
        fence_async_shared()
        mbarrier.arrive(ds_ready.index(buf), count=1)
        return buf

    @gluon.jit
    def _dq_share_later(u, WG: gl.constexpr, ds_smem, k_smem, dq_smem, dq_desc, ds_ready,
                        ds_free, sm_scale, lo, n_tiles, off_z, off_hk, GROUP,
                        HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr):
        """DEFER_DQ: tile u's share, a tile after this warpgroup wrote its dS half, once the
        other warpgroup's half is in too; buffer u % 2 is then free for tile u + 2's dS."""
        mbarrier.wait(ds_ready.index(u % 2), (u // 2) & 1)
        dq = _dq_gemms(u % 2, WG, ds_smem, k_smem, HEAD_DIM, BLOCK_M)
        dq = warpgroup_mma_wait(0, deps=[dq])
        mbarrier.arrive(ds_free.index(u % 2), count=1)
        _dq_add(dq, u, WG, dq_smem, dq_desc, sm_scale, lo, n_tiles, off_z, off_hk, GROUP,
                BLOCK_M)

    @gluon.jit
    def _dkdv_consumer(WG: gl.constexpr, dk_desc, dv_desc, dq_desc, q_smem, do_smem, k_smem,
                       v_smem, ds_smem, dq_smem, bars, LSE, DELTA, sm_scale, qk_scale, H_KV,
                       GROUP, N_Q, N_K, LEFT, RIGHT, n_n_blocks, HEAD_DIM: gl.constexpr,
                       BLOCK_M: gl.constexpr, STAGES: gl.constexpr, HAS_LEFT: gl.constexpr,
                       HAS_RIGHT: gl.constexpr, FUSE_DQ: gl.constexpr,
                       DEFER_DQ: gl.constexpr):
        """One consumer warpgroup: dK and dV of 64 keys, accumulated over the query tiles;
        with FUSE_DQ, also a 64 x 64 share of each tile's dQ = sm_scale * dS K, added into
        the fp32 tensor behind ``dq_desc`` by the copy engine."""
        kv_ready, q_ready, do_ready, empty, ds_ready, ds_free = bars
        # wgmma accumulators: S^T and dP^T are 64 x BLOCK_M, dK and dV 64 x HEAD_DIM, over 4
        # warps; P^T and dS^T feed the dV / dK GEMMs from registers as their A operand
        S_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                      instr_shape=[16, BLOCK_M, 16])
        D_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                      instr_shape=[16, HEAD_DIM, 16])
        OP_L: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=D_L, k_width=2)
        COL: gl.constexpr = gl.SliceLayout(0, S_L)  # a query index per column
        ROW: gl.constexpr = gl.SliceLayout(1, S_L)  # a key index per row
        STAT_L: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])  # a row per thread
        dtype: gl.constexpr = q_smem.dtype
        off_z, off_hk, start_n, lo, hi, lo_off, hi_off = _block_coords(
            H_KV, GROUP, N_Q, N_K, LEFT, RIGHT, n_n_blocks, BLOCK_M, HAS_LEFT, HAS_RIGHT)
        n0 = start_n + WG * 64
        # which query tiles need a mask for this warpgroup's 64 keys: those where some key is
        # right of some row's right edge (the first row, the last key decide) or left of some
        # row's left edge (the last row, the first key decide)
        mask_below = 0
        if HAS_RIGHT:
            mask_below = n0 + 63 - hi_off
        mask_from = hi * BLOCK_M
        if HAS_LEFT:
            mask_from = n0 - BLOCK_M + 2 - lo_off
        keys = gl.expand_dims(n0 + gl.arange(0, 64, layout=ROW), 1)
        s_zero = gl.zeros([64, BLOCK_M], gl.float32, S_L)
        k = k_smem.index(WG).reshape([64, HEAD_DIM])
        v = v_smem.index(WG).reshape([64, HEAD_DIM])
        dk = gl.zeros([64, HEAD_DIM], gl.float32, D_L)
        dv = gl.zeros([64, HEAD_DIM], gl.float32, D_L)
        # dQ of a tile over all 128 keys: the two warpgroups' dS halves meet in shared memory
        # and each takes a 64 x 64 share of dS K (_dq_gemms)
        mbarrier.wait(kv_ready.index(0), 0)

        # the tiles in the producer's order; each tile's row statistics are loaded one tile
        # ahead (global loads, one number a thread, spread over the accumulator's columns only
        # where used, to keep registers for dK and dV)
        n_tiles = gl.maximum(hi - lo, 1)
        total = GROUP * (hi - lo)
        lse2, delta = _row_stats(LSE, DELTA, 0, total, n_tiles, lo, off_z, off_hk, H_KV, GROUP,
                                 N_Q, BLOCK_M, STAT_L)
        for t in range(total):
            start_m = (lo + t % n_tiles) * BLOCK_M
            slot = t % STAGES
            phase = (t // STAGES) & 1
            q_t = q_smem.index(slot).reshape([BLOCK_M, HEAD_DIM])
            do_t = do_smem.index(slot).reshape([BLOCK_M, HEAD_DIM])
            mbarrier.wait(q_ready.index(slot), phase)
            s_t = warpgroup_mma(k, q_t.permute((1, 0)), s_zero, use_acc=False, is_async=True)
            mbarrier.wait(do_ready.index(slot), phase)
            dp_t = warpgroup_mma(v, do_t.permute((1, 0)), s_zero, use_acc=False,
                                 is_async=True)
            # while S^T and dP^T are on the tensor cores: the next tile's row statistics
            next_lse2, next_delta = _row_stats(LSE, DELTA, t + 1, total, n_tiles, lo, off_z,
                                               off_hk, H_KV, GROUP, N_Q, BLOCK_M, STAT_L)
            s_t = warpgroup_mma_wait(1, deps=[s_t])
            need_mask = (start_m < mask_below) | (start_m >= mask_from)
            if need_mask:  # hidden scores -> -inf before the exponential: P = 0
                qs = gl.expand_dims(start_m + gl.arange(0, BLOCK_M, layout=COL), 0)
                visible = keys >= 0
                if HAS_RIGHT:  # key j <= i + N_K - N_Q + right
                    visible = visible & (keys <= qs + hi_off)
                if HAS_LEFT:   # key j >= i + N_K - N_Q - left
                    visible = visible & (keys >= qs + lo_off)
                s_t = gl.where(visible, s_t * qk_scale, float("-inf"))
                p_t = gl.exp2(s_t - gl.expand_dims(gl.convert_layout(lse2, COL), 0))
            else:
                p_t = gl.exp2(s_t * qk_scale
                              - gl.expand_dims(gl.convert_layout(lse2, COL), 0))
            p_op = gl.convert_layout(p_t.to(dtype), OP_L)
            # dV += P^T dO goes to the tensor cores while dS^T is formed
            dv = warpgroup_mma(p_op, do_t, dv, is_async=True)
            dp_t = warpgroup_mma_wait(1, deps=[dp_t])
            ds_t = p_t * (dp_t - gl.expand_dims(gl.convert_layout(delta, COL), 0))
            ds_op = gl.convert_layout(ds_t.to(dtype), OP_L)
            dk = warpgroup_mma(ds_op, q_t, dk, is_async=True)
            if FUSE_DQ and DEFER_DQ:
                # dS into buffer t % 2, then tile t - 1's share: the other warpgroup wrote its
                # half a tile ago, so neither waits for the other's current tile
                _put_ds(ds_t, t, WG, ds_smem, ds_ready, ds_free)
                if t > 0:
                    _dq_share_later(t - 1, WG, ds_smem, k_smem, dq_smem, dq_desc, ds_ready,
                                    ds_free, sm_scale, lo, n_tiles, off_z, off_hk, GROUP,
                                    HEAD_DIM, BLOCK_M)
                dk, dv, p_op, ds_op = warpgroup_mma_wait(0, deps=[dk, dv, p_op, ds_op])
                mbarrier.arrive(empty.index(slot), count=1)
            elif FUSE_DQ:
                # dS into buffer t % 2, then this tile's share once the other half is in too
                buf = _put_ds(ds_t, t, WG, ds_smem, ds_ready, ds_free)
                mbarrier.wait(ds_ready.index(buf), (t // 2) & 1)
                dq = _dq_gemms(buf, WG, ds_smem, k_smem, HEAD_DIM, BLOCK_M)
                dk, dv, p_op, ds_op, dq = warpgroup_mma_wait(0, deps=[dk, dv, p_op, ds_op, dq])
                mbarrier.arrive(empty.index(slot), count=1)
                mbarrier.arrive(ds_free.index(buf), count=1)
                _dq_add(dq, t, WG, dq_smem, dq_desc, sm_scale, lo, n_tiles, off_z, off_hk,
                        GROUP, BLOCK_M)
            else:
                dk, dv, p_op, ds_op = warpgroup_mma_wait(0, deps=[dk, dv, p_op, ds_op])
                mbarrier.arrive(empty.index(slot), count=1)
            lse2, delta = next_lse2, next_delta

        if FUSE_DQ and DEFER_DQ and total > 0:  # the last tile's share
            _dq_share_later(total - 1, WG, ds_smem, k_smem, dq_smem, dq_desc, ds_ready,
                            ds_free, sm_scale, lo, n_tiles, off_z, off_hk, GROUP, HEAD_DIM,
                            BLOCK_M)
        if FUSE_DQ and total > 0:
            # the other warpgroup's dQ GEMMs read this warpgroup's K half too: wait until
            # both are done with the last tile's before writing dK over it
            mbarrier.wait(ds_free.index((total - 1) % 2), ((total - 1) // 2) & 1)
        # dK, dV leave through the copy engine (rows past N_K clipped) from this warpgroup's
        # own K and V slots, which no GEMM reads any more
        dk = dk * sm_scale
        k_smem.index(WG).reshape([64, HEAD_DIM]).store(dk.to(dtype))
        v_smem.index(WG).reshape([64, HEAD_DIM]).store(dv.to(dtype))
        fence_async_shared()
        if n0 < N_K:
            tma.async_copy_shared_to_global(dk_desc, [off_z, off_hk, n0, 0], k_smem.index(WG))
            tma.async_copy_shared_to_global(dv_desc, [off_z, off_hk, n0, 0], v_smem.index(WG))
        tma.store_wait(0)

    # lengths and window sizes are not specialised on: one compiled kernel serves them all
    @gluon.jit(do_not_specialize=["H_KV", "GROUP", "N_Q", "N_K", "LEFT", "RIGHT",
                                  "n_n_blocks"])
    def _attn_bwd_dkdv_ws(q_desc, k_desc, v_desc, do_desc, dk_desc, dv_desc, dq_desc, LSE,
                          DELTA,
                          sm_scale, qk_scale, H_KV, GROUP, N_Q, N_K, LEFT, RIGHT, n_n_blocks,
                          HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, STAGES: gl.constexpr,
                          HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr,
                          FUSE_DQ: gl.constexpr, DEFER_DQ: gl.constexpr):
        # one program per (batch * K/V head, key block of 128); shared memory: K and V (two
        # 64-key halves each, later dK and dV's staging), the Q / dO ring, barriers
        k_smem = gl.allocate_shared_memory(k_desc.dtype, [2] + k_desc.block_type.shape,
                                           k_desc.layout)
        v_smem = gl.allocate_shared_memory(v_desc.dtype, [2] + v_desc.block_type.shape,
                                           v_desc.layout)
        q_smem = gl.allocate_shared_memory(q_desc.dtype, [STAGES] + q_desc.block_type.shape,
                                           q_desc.layout)
        do_smem = gl.allocate_shared_memory(do_desc.dtype, [STAGES] + do_desc.block_type.shape,
                                            do_desc.layout)
        kv_ready = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
        q_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        do_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        # with FUSE_DQ: two buffers of dS (tile rows x 64 keys, one half per warpgroup), a
        # 64 x 64 fp32 tile per warpgroup that the copy engine adds into dQ, and barriers for
        # "both halves written" and "both warpgroups done reading" (without it, stand-ins)
        ds_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128,
                                                       element_bitwidth=16, rank=2)
        if FUSE_DQ:
            ds_smem = gl.allocate_shared_memory(q_desc.dtype, [4, BLOCK_M, 64], ds_layout)
            dq_smem = gl.allocate_shared_memory(dq_desc.dtype, [2] + dq_desc.block_type.shape,
                                                dq_desc.layout)
        else:
            ds_smem = gl.allocate_shared_memory(q_desc.dtype, [1, 8, 64], ds_layout)
            dq_smem = gl.allocate_shared_memory(gl.float32, [2, 8, 8],
                                                gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
        ds_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        ds_free = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        mbarrier.init(kv_ready.index(0), count=1)
        for s in gl.static_range(STAGES):
            mbarrier.init(q_ready.index(s), count=1)
            mbarrier.init(do_ready.index(s), count=1)
            mbarrier.init(empty.index(s), count=2)  # one arrival per consumer warpgroup
        for b in gl.static_range(2):
            mbarrier.init(ds_ready.index(b), count=2)
            mbarrier.init(ds_free.index(b), count=2)
        bars = (kv_ready, q_ready, do_ready, empty, ds_ready, ds_free)

        gl.warp_specialize([
            (_dkdv_producer, (q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem,
                              bars, H_KV, GROUP, N_Q, N_K, LEFT, RIGHT, n_n_blocks, BLOCK_M,
                              STAGES, HAS_LEFT, HAS_RIGHT)),
            (_dkdv_consumer, (0, dk_desc, dv_desc, dq_desc, q_smem, do_smem, k_smem, v_smem,
                              ds_smem, dq_smem, bars, LSE, DELTA, sm_scale, qk_scale, H_KV,
                              GROUP, N_Q, N_K, LEFT, RIGHT, n_n_blocks, HEAD_DIM, BLOCK_M,
                              STAGES, HAS_LEFT, HAS_RIGHT, FUSE_DQ, DEFER_DQ)),
            (_dkdv_consumer, (1, dk_desc, dv_desc, dq_desc, q_smem, do_smem, k_smem, v_smem,
                              ds_smem, dq_smem, bars, LSE, DELTA, sm_scale, qk_scale, H_KV,
                              GROUP, N_Q, N_K, LEFT, RIGHT, n_n_blocks, HEAD_DIM, BLOCK_M,
                              STAGES, HAS_LEFT, HAS_RIGHT, FUSE_DQ, DEFER_DQ)),
        ], [4, 4], [240, 240])


def kernel_constants(head_dim: int, causal: bool, window=(-1, -1), *,
                     block_m: int | None = None, stages: int | None = None,
                     fuse_dq: bool = False, defer_dq: bool = False) -> dict:
    """The compile-time constants of one kernel variant (``block_m`` / ``stages`` override
    :func:`tile_config`; ``fuse_dq``: the kernel adds dQ into an fp32 buffer too;
    ``defer_dq``: each tile's dQ share is computed one tile later; the default with a mask)."""
    default_m, default_stages = tile_config(head_dim)
    left, right = window
    if fuse_dq and (block_m or default_m) * head_dim != 128 * 64:
        # each warpgroup's dQ share is 64 x 64: the tile's 128 rows split in two at d = 64,
        # d = 128's columns split in two with 64-row tiles
        raise ValueError(f"fuse_dq needs block_m * head_dim = 128 * 64 (128-row tiles at d = 64, "
                         f"64-row tiles at d = 128), got block_m={block_m or default_m}, "
                         f"head_dim={head_dim}")
    if defer_dq and not fuse_dq:
        raise ValueError("defer_dq needs fuse_dq (it reorders the fused dQ's steps)")
    return dict(HEAD_DIM=head_dim, BLOCK_M=block_m or default_m,
                STAGES=stages or default_stages, HAS_LEFT=left >= 0,
                HAS_RIGHT=causal or right >= 0, FUSE_DQ=fuse_dq, DEFER_DQ=defer_dq)


def dkdv_tile_plan(start_n: int, n_q: int, n_k: int, block_m: int, causal: bool,
                   window=(-1, -1)) -> tuple[int, int, tuple[tuple[int, int], ...]]:
    """The kernel's tile arithmetic, line for line in Python (tests hold it to the mask).

    For the program whose keys start at ``start_n``: the query tiles [lo, hi) it loads (for
    each query head of the group), and per consumer warpgroup (mask_below, mask_from): query
    tile i computes a mask iff ``i * block_m < mask_below or i * block_m >= mask_from``.
    """
    left, right = _window_bounds(causal, window)
    has_left, has_right = window[0] >= 0, causal or window[1] >= 0
    lo_off = n_k - n_q - left
    hi_off = n_k - n_q + right
    last_key = min(start_n + BLOCK_N, n_k) - 1
    lo_row = max(start_n - hi_off, 0) if has_right else 0
    hi_row = max(min(n_q, last_key - lo_off + 1), 0) if has_left else n_q
    lo = lo_row // block_m
    hi = max(-(-hi_row // block_m), lo)
    masks = []
    for wg in range(BLOCK_N // WG_N):
        n0 = start_n + wg * WG_N
        mask_below = n0 + WG_N - 1 - hi_off if has_right else 0
        mask_from = n0 - block_m + 2 - lo_off if has_left else hi * block_m
        masks.append((mask_below, mask_from))
    return lo, hi, tuple(masks)


def gluon_dkdv_supported(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                         window=(-1, -1)) -> bool:
    """Can :func:`launch_dkdv` run these inputs? CUDA tensors on an sm_90 GPU with Gluon
    installed, fp16/bf16, head_dim 64/128, k and v of one shape with a head count dividing
    q's, layouts the copy engine can address (unit last stride, 16-byte aligned base and
    strides), lengths >= 1, a window of two ints >= -1. Otherwise False."""
    # the forward's conditions, with this kernel's head dimensions (a subset of the forward's)
    return gluon_supported(q, k, v, causal, window) and q.shape[-1] in HEAD_DIMS


def launch_dkdv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor,
                lse: torch.Tensor, delta: torch.Tensor, causal: bool, sm_scale: float,
                window=(-1, -1), out: tuple[torch.Tensor, torch.Tensor] | None = None,
                dq_accum: torch.Tensor | None = None, **overrides):
    """dK and dV of sum(O * dO) on inputs :func:`gluon_dkdv_supported` accepts.

    q, do (Z, H, N_Q, d); k, v (Z, H_KV, N_K, d); lse (the forward's, natural log, -inf for a
    query that sees no key) and delta (= rowsum(dO * O), ``backward.preprocess``), both
    (Z, H, N_Q) float32. Returns (dk, dv, the compiled kernel): dk and dv contiguous
    (Z, H_KV, N_K, d) in k's dtype, summed over the query heads sharing a K/V head.
    ``out=(dk, dv)`` writes them into those tensors (contiguous, that shape and dtype) rather
    than new ones, so a caller that already holds the pair doesn't hold two.
    ``dq_accum``: a zeroed contiguous float32 (Z, H, N_Q, d) tensor; the kernel then computes
    dQ too and adds it into that tensor, one (query tile, key block) share at a time through
    the copy engine's reduce-add, in an order that varies from run to run (dK and dV do not
    change: their sums are the program's own).
    ``overrides``: ``block_m`` / ``stages`` / ``defer_dq`` (see :func:`kernel_constants`).
    """
    if not gluon_dkdv_supported(q, k, v, causal, window):
        raise ValueError("gluon dK/dV: inputs not supported (see gluon_dkdv_supported): need "
                         "CUDA sm_90, fp16/bf16, head_dim in (64, 128), TMA-compatible "
                         "strides, k/v heads dividing q heads, window of two ints >= -1")
    z, h, n_q, d = q.shape
    h_kv, n_k = k.shape[1], k.shape[2]
    if do.shape != q.shape or do.dtype != q.dtype or do.device != q.device:
        raise ValueError(f"do must match q: {tuple(q.shape)} {q.dtype}, got "
                         f"{tuple(do.shape)} {do.dtype}")
    for name, t in (("lse", lse), ("delta", delta)):
        if t.shape != (z, h, n_q) or t.dtype != torch.float32 or t.device != q.device:
            raise ValueError(f"{name} must be float32 of shape {(z, h, n_q)} on {q.device}, "
                             f"got {tuple(t.shape)} {t.dtype}")
    do = do if _tma_layout_ok(do) else do.contiguous()
    lse, delta = lse.contiguous(), delta.contiguous()
    if dq_accum is not None:
        _checked_dq_accum(dq_accum, q)
    constants = kernel_constants(d, causal, tuple(window), fuse_dq=dq_accum is not None,
                                 **overrides)
    if out is None:
        dk = torch.empty((z, h_kv, n_k, d), dtype=k.dtype, device=k.device)
        dv = torch.empty((z, h_kv, n_k, d), dtype=v.dtype, device=v.device)
    else:
        dk, dv = _checked_out(out, (z, h_kv, n_k, d), k)
    left, right = _window_bounds(causal, window)
    n_n_blocks = -(-n_k // BLOCK_N)
    block_m = constants["BLOCK_M"]
    dk_desc = _descriptor(dk, WG_N)
    # without a fused dQ the kernel never touches dq_desc: dK's descriptor stands in
    dq_desc = _dq_descriptor(dq_accum) if dq_accum is not None else dk_desc
    kernel = fastpath.launch(_attn_bwd_dkdv_ws, (n_n_blocks * z * h_kv,), (
        _descriptor(q, block_m), _descriptor(k, WG_N), _descriptor(v, WG_N),
        _descriptor(do, block_m), dk_desc, _descriptor(dv, WG_N), dq_desc, lse, delta,
        sm_scale, sm_scale * LOG2E, h_kv, h // h_kv, n_q, n_k, left, right, n_n_blocks),
        constants, num_warps=4)
    return dk, dv, kernel


def _dq_descriptor(t: torch.Tensor):
    """The copy engine's view of the (float32) dQ accumulator: 64 x 64 tiles, one warpgroup's
    share."""
    block = [1, 1, 64, 64]
    return _GluonDescriptor(t, list(t.shape), list(t.stride()), block,
                            _shared_layout(tuple(block), gl.float32))


def _checked_buffer(name: str, t, shape: tuple[int, ...], dtype: torch.dtype,
                    device: torch.device) -> torch.Tensor:
    """``t`` as a contiguous tensor of that shape, dtype and device, which the copy engine can
    write through (its rows 16-byte aligned), or a ValueError naming ``name``."""
    if (not isinstance(t, torch.Tensor) or tuple(t.shape) != tuple(shape) or t.dtype != dtype
            or t.device != device or not t.is_contiguous()):
        got = (f"{tuple(t.shape)} {t.dtype} on {t.device}, contiguous={t.is_contiguous()}"
               if isinstance(t, torch.Tensor) else type(t).__name__)
        raise ValueError(f"{name} must be a contiguous {dtype} tensor of shape "
                         f"{tuple(shape)} on {device}, got {got}")
    return t


def _checked_dq_accum(dq_accum, q: torch.Tensor) -> torch.Tensor:
    """``dq_accum`` as the fp32 buffer the copy engine can add dQ into, or a ValueError."""
    return _checked_buffer("dq_accum", dq_accum, tuple(q.shape), torch.float32, q.device)


def _checked_out(out, shape: tuple[int, ...], k: torch.Tensor):
    """``out`` as the (dk, dv) pair the kernel can write through TMA, or a ValueError."""
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        raise ValueError(f"out must be a (dk, dv) pair of tensors, got {type(out).__name__}")
    for name, t in zip(("dk", "dv"), out, strict=True):
        _checked_buffer(f"out's {name}", t, shape, k.dtype, k.device)
    return out


def compile_sm90_dkdv(head_dim: int = 128, dtype: torch.dtype = torch.float16,
                      causal: bool = False, window=(-1, -1), **overrides):
    """Compile one variant for sm_90 without a GPU (CPU tensors only describe the layouts);
    returns Triton's compiled kernel, whose ``asm`` has "ttgir", "ptx" and "cubin". Needs a
    Triton with Gluon, imported with TRITON_INTERPRET unset or 0."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.runtime.jit import mangle_type

    constants = kernel_constants(head_dim, causal, tuple(window), **overrides)
    q = torch.empty(2, 4, 1000, head_dim, dtype=dtype)
    k = torch.empty(2, 2, 1000, head_dim, dtype=dtype)
    block_m = constants["BLOCK_M"]
    descs = dict(q_desc=_descriptor(q, block_m), k_desc=_descriptor(k, WG_N),
                 v_desc=_descriptor(k, WG_N), do_desc=_descriptor(q, block_m),
                 dk_desc=_descriptor(k, WG_N), dv_desc=_descriptor(k, WG_N),
                 dq_desc=_dq_descriptor(q.float()) if constants["FUSE_DQ"]
                 else _descriptor(k, WG_N))
    signature = {name: mangle_type(desc) for name, desc in descs.items()}
    signature.update(LSE="*fp32", DELTA="*fp32", sm_scale="fp32", qk_scale="fp32",
                     H_KV="i32", GROUP="i32", N_Q="i32", N_K="i32", LEFT="i32", RIGHT="i32",
                     n_n_blocks="i32")
    source = GluonASTSource(_attn_bwd_dkdv_ws, signature, constants)
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})


__all__ = ["BLOCK_N", "HEAD_DIMS", "SUPPORTED_DTYPES", "compile_sm90_dkdv", "dkdv_tile_plan",
           "gluon_dkdv_supported", "kernel_constants", "launch_dkdv", "shared_memory_bytes",
           "tile_config"]
