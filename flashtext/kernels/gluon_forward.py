"""A FlashAttention-3 forward for Hopper (sm_90), written in Gluon (chapter 13).

Triton decides for itself how warps share a kernel's work; Gluon, Triton's lower-level
language, lets the kernel say it. This kernel says what FlashAttention-3 (Shah et al. 2024,
arXiv 2407.08608) says, in the names of Algorithm 1 and of the FA2/FA3 papers:

* **Warp specialisation.** One program (CTA) owns BLOCK_M = 128 query rows of one (batch, head)
  and runs three warpgroups. The *producer* (the default partition, 24 registers a thread) only
  issues copy-engine (TMA) loads: Q once, then K_j and V_j tile by tile into a ``STAGES``-deep
  ring of shared-memory slots, each slot guarded by an mbarrier pair (``ready``: the bytes have
  landed; ``empty``: both consumers are done with it). Two *consumer* warpgroups, 64 query rows
  each, do the math; the registers the producer gives up go to them (``worker_num_regs``: 240 a
  thread, the most that 2 x 240 + 24 leaves in the 64K register file).
* **Ping-pong.** The consumers take turns at the tensor cores: warpgroup w waits for its turn
  (mbarrier ``turn[w]``), issues its two GEMMs of the step, and hands the turn over. So while one
  warpgroup's GEMMs run, the other does its softmax on the MUFU and FMA units.
* **Intra-warpgroup pipelining** (FA3 Algorithm 2). Each step issues S_j = Q K_j^T *before* it
  finishes the previous block: [issue S_j, rescale O, issue O += P_{j-1} V_{j-1}], then wait for
  S_j alone and do its softmax while P_{j-1} V_{j-1} is still on the tensor cores.
* **P in registers, two scores to one.** P~ is rounded to fp16/bf16 by one ``cvt.rn.*x2``
  per pair of neighbouring scores (``_to_operand``), the pairs the accumulator layout already
  holds, so each 32-bit register of the GEMM's A operand is written once, in order.
* **Masks and tile skipping** as in the Triton kernel (``flashtext.kernels.forward``): causal is
  aligned bottom-right (query i sees key j iff j <= i + N_K - N_Q), sliding windows (left, right)
  bound the tiles from both sides, tiles outside every row's range are never loaded, and only
  tiles that cross a boundary (the diagonal, a window edge, the end of K) compute a mask. Rows of
  a Q tile past N_Q and keys past N_K come back from the copy engine as zeros, and the output
  copy clips rows past N_Q.
* **GQA**: query head h reads K/V head h // (H / H_KV); that is only the head coordinate of the
  K/V tile copies.
* **Persistence** (a switch): every partition loops over work tiles (a head's 128-row query
  block); with ``persistent`` one program per SM takes every programs-th tile, and the ring, the
  turn barriers and Q's ``empty`` barrier run on from tile to tile, so the next tile's loads
  overlap this one's last GEMM and its output copy.
* **Three consumers** (a switch, ``consumers=3``): 192 query rows a program on three warpgroups
  of 160 registers (the producer at 32), the turn going round 0 -> 1 -> 2, FlashAttention-3's
  tile at d = 64, where ``flash_attention`` runs it (``dispatch.prefers_three_consumers``). At
  160 registers ptxas spills the loop unless the left-edge test is compiled in; ``open_left``
  gives a call without a left edge one that hides no key (LEFT = N_Q + N_K), and the dispatch
  sets it with three consumers.
* FlashAttention-4's two softmax ideas (``flashtext.fa4_softmax``), as switches:
  ``RESCALE_THRESHOLD`` > 0 rescales O only when some row's max grows by more than that many
  powers of two; ``POLY_PER_8`` of every 8 exponentials run as a polynomial on the FMA units.

Exponentials are base 2 with log2(e) folded into ``qk_scale``; lse is stored in natural log,
float32, -inf for a query that sees no key (the statistic the backward kernel expects).
"""

from __future__ import annotations

import functools
import math

import torch

from flashtext.fa2 import LN2, LOG2E
from flashtext.fa4_softmax import exp2_asm, exp2_poly_coefficients
from flashtext.kernels import fastpath
from flashtext.kernels.gluon_turns import TURN_BARRIER_BASE

try:  # Gluon ships with Triton >= 3.5; the CPU machine may lack it or run the interpreter
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        mbarrier,
        tma,
        warpgroup_mma,
        warpgroup_mma_wait,
    )
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GluonDescriptor
    HAVE_GLUON = True
except ImportError:  # pragma: no cover - depends on the installed Triton
    HAVE_GLUON = False
if HAVE_GLUON:
    from flashtext.kernels.gluon_turns import (  # noqa: F401 (shown in chapter 13)
        _named_barrier,
        _named_barrier_asm,
        _pass_turn,
        _wait_turn,
    )

BLOCK_M = 128  # query rows per program: two consumer warpgroups of 64 (wgmma's M) by default
WG_M = 64
HEAD_DIMS = (64, 128, 256)
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16)


def tile_config(head_dim: int) -> tuple[int, int]:
    """(BLOCK_N, STAGES) per head dimension: the widest key tile and deepest ring whose
    registers (O: 64 x d fp32 and S: 64 x BLOCK_N fp32 per warpgroup, 240 a thread) and shared
    memory (Q: 128 x d; STAGES x (K + V): BLOCK_N x d each; 227 KB in all) fit."""
    if head_dim == 64:
        return 128, 3  # 16 + 3 * 32 = 112 KB
    if head_dim == 128:
        return 128, 2  # 32 + 2 * 64 = 160 KB
    if head_dim == 256:
        return 64, 2   # 64 + 2 * 64 = 192 KB
    raise ValueError(f"head_dim must be one of {HEAD_DIMS}, got {head_dim}")


if HAVE_GLUON:
    _LOG2E = gl.constexpr(LOG2E)
    _LN2 = gl.constexpr(LN2)

    @gluon.constexpr_function
    def _exp2_asm(poly_per_8, degree):
        # (imported here: a Gluon function may only name Gluon functions, not Python ones)
        from flashtext.kernels import gluon_forward as this
        return this.exp2_asm(poly_per_8, degree)

    @gluon.constexpr_function
    def _cvt_x2_asm(dtype):
        kind = "f16" if dtype == gl.float16 else "bf16"
        return f"cvt.rn.{kind}x2.f32 $0, $2, $1;"

    @gluon.jit
    def _tile_coords(tile_id, n_m_blocks, H, GROUP, N_Q, N_K, LEFT, RIGHT,
                     BLOCK_N: gl.constexpr, HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr,
                     LPT: gl.constexpr, NUM_WG: gl.constexpr):
        """Work tile -> where it is and which key tiles it needs. Tiles run head by head, the
        query blocks of a head in order (longest first when causal: LPT)."""
        off_zh = tile_id // n_m_blocks
        m_block = tile_id % n_m_blocks
        if LPT:  # causal work grows with the row: start the longest blocks first
            m_block = n_m_blocks - 1 - m_block
        start_m = m_block * (64 * NUM_WG)
        off_z = off_zh // H
        off_h = off_zh % H
        off_hk = off_h // GROUP  # GQA: GROUP query heads share one K/V head
        # Key tiles this block needs: row i sees keys [i + lo_off, i + hi_off] (when bounded)
        # and [0, N_K). Tiles outside [lo, hi) are never loaded. A block whose rows see no key
        # at all still runs one fully masked tile (O = 0, lse = -inf come out of the loop).
        causal_offset = N_K - N_Q
        lo_off = causal_offset - LEFT
        hi_off = causal_offset + RIGHT
        last_row = gl.minimum(start_m + 64 * NUM_WG, N_Q) - 1
        hi_key = N_K
        if HAS_RIGHT:
            hi_key = gl.maximum(gl.minimum(N_K, last_row + hi_off + 1), 0)
        lo_key = 0
        if HAS_LEFT:
            lo_key = gl.minimum(gl.maximum(start_m + lo_off, 0), N_K)
        lo = gl.minimum(lo_key // BLOCK_N, (N_K - 1) // BLOCK_N)
        hi = gl.maximum(gl.cdiv(hi_key, BLOCK_N), lo + 1)
        return off_z, off_h, off_hk, off_zh, start_m, lo, hi, lo_off, hi_off

    @gluon.jit
    def _producer(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, bars, n_m_blocks, n_tiles,
                  H, GROUP, N_Q, N_K, LEFT, RIGHT, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                  HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr, LPT: gl.constexpr,
                  PERSISTENT: gl.constexpr, NUM_WG: gl.constexpr):
        """The copy-engine warpgroup. Per work tile: K_lo, Q (64 rows per consumer),
        then the K/V tiles in the order the consumers use them: (K_j, V_{j-1}), then V_{hi-1}.
        Each K/V tile waits for its ring slot to be empty, then asks for ``ready`` to fire when
        its bytes have landed. The ring position runs on across work tiles (persistent)."""
        q_ready, q_empty, k_ready, k_empty, v_ready, v_empty, turn = bars
        base = 0  # K/V tiles this program has loaded so far
        count = 0  # work tiles so far
        for tile_id in range(gl.program_id(0), n_tiles, gl.num_programs(0)):
            off_z, off_h, off_hk, off_zh, start_m, lo, hi, lo_off, hi_off = _tile_coords(
                tile_id, n_m_blocks, H, GROUP, N_Q, N_K, LEFT, RIGHT, BLOCK_N, HAS_LEFT,
                HAS_RIGHT, LPT, NUM_WG)
            _load_tile(k_desc, k_smem, k_ready, k_empty, off_z, off_hk, lo, base, BLOCK_N,
                       STAGES)
            for w in gl.static_range(NUM_WG):
                if PERSISTENT:  # consumer w is done with the previous tile's Q
                    mbarrier.wait(q_empty.index(w), (count & 1) ^ 1)
                mbarrier.expect(q_ready.index(w), q_desc.block_type.nbytes)
                tma.async_copy_global_to_shared(q_desc, [off_z, off_h, start_m + w * 64, 0],
                                                q_ready.index(w), q_smem.index(w))
            for j in range(lo + 1, hi):
                i = base + j - lo
                _load_tile(k_desc, k_smem, k_ready, k_empty, off_z, off_hk, j, i, BLOCK_N,
                           STAGES)
                _load_tile(v_desc, v_smem, v_ready, v_empty, off_z, off_hk, j - 1, i - 1,
                           BLOCK_N, STAGES)
            _load_tile(v_desc, v_smem, v_ready, v_empty, off_z, off_hk, hi - 1,
                       base + hi - 1 - lo, BLOCK_N, STAGES)
            base += hi - lo
            count += 1

    @gluon.jit
    def _load_tile(desc, smem, ready, empty, off_z, off_hk, j, i,
                   BLOCK_N: gl.constexpr, STAGES: gl.constexpr):
        """Tile j (the i-th of this program) into slot i % STAGES, once both consumers have
        released what that slot held STAGES tiles ago (a fresh barrier passes phase 1 at once)."""
        slot = i % STAGES
        mbarrier.wait(empty.index(slot), ((i // STAGES) & 1) ^ 1)
        mbarrier.expect(ready.index(slot), desc.block_type.nbytes)
        tma.async_copy_global_to_shared(desc, [off_z, off_hk, j * BLOCK_N, 0],
                                        ready.index(slot), smem.index(slot))

    @gluon.jit
    def _to_operand(p, dtype: gl.constexpr, PACK_P: gl.constexpr):
        """P~ rounded to the GEMM's input type. ``p.to(dtype)`` rounds score by score, and ptxas
        then packs the pairs into 32-bit registers high half first and swaps them back with a
        byte permute (PRMT) per pair; one cvt.rn.*x2 rounds two neighbouring scores (a thread's
        accumulator layout holds columns in pairs) straight into one register, in order.
        (cvt.rn.f16x2.f32 d, a, b puts a in the high half: the pair's first score, $1, goes
        second.)"""
        if not PACK_P:
            return p.to(dtype)
        return gl.inline_asm_elementwise(_cvt_x2_asm(dtype), "=r,f,f", [p], dtype=dtype.value,
                                         is_pure=True, pack=2)

    @gluon.jit
    def _softmax(qk, m_i, l_i, offs_m, offs_n, start_n, need_mask, N_K, lo_off, hi_off,
                 qk_scale, HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr,
                 NEG_SCALE: gl.constexpr, RESCALE_THRESHOLD: gl.constexpr,
                 POLY_PER_8: gl.constexpr, POLY_DEGREE: gl.constexpr):
        """Online softmax of one S tile (Algorithm 1 lines 10-11, base 2). Returns P~ (fp32),
        the new running max and sum, alpha (to rescale O by) and whether O must be rescaled.

        Unmasked tiles scale late: the row max of the raw scores times qk_scale (min for a
        negative scale), then one fused multiply-add qk * qk_scale - m per score. Masked tiles
        (a diagonal, a window edge, the end of K) scale first and set hidden scores to -inf;
        a row that has seen no key yet subtracts 0 instead of -inf (``m_safe``)."""
        if need_mask:
            s = qk * qk_scale
            cols = gl.expand_dims(start_n + offs_n, 0)
            rows = gl.expand_dims(offs_m, 1)
            visible = cols < N_K
            if HAS_RIGHT:  # key j <= i + N_K - N_Q + right (causal: right = 0)
                visible = visible & (cols <= rows + hi_off)
            if HAS_LEFT:   # key j >= i + N_K - N_Q - left
                visible = visible & (cols >= rows + lo_off)
            s = gl.where(visible, s, float("-inf"))
            m_tile = gl.max(s, 1)
            s_scale = 1.0
        else:
            s = qk
            if NEG_SCALE:
                m_tile = gl.min(qk, 1) * qk_scale
            else:
                m_tile = gl.max(qk, 1) * qk_scale
            s_scale = qk_scale
        m_cand = gl.maximum(m_i, m_tile)
        if RESCALE_THRESHOLD > 0:
            # FA4: keep the stale max unless some row's max grows by more than the threshold
            # (every exponent then stays <= 2**threshold); one decision for the warpgroup, so
            # that skipping is a branch, not a select. -inf - -inf is NaN: no vote to rescale.
            grow = (m_cand - m_i) > RESCALE_THRESHOLD
            rescale = gl.max(grow.to(gl.int32), 0) > 0
            m_new = gl.where(rescale, m_cand, m_i)
        else:
            rescale = True
            m_new = m_cand
        m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
        x = s * s_scale - gl.expand_dims(m_safe, 1)
        if POLY_PER_8 > 0:
            p = gl.inline_asm_elementwise(_exp2_asm(POLY_PER_8, POLY_DEGREE),
                                          "=f,=f,=f,=f,=f,=f,=f,=f,f,f,f,f,f,f,f,f", [x],
                                          dtype=gl.float32, is_pure=True, pack=8)
        else:
            p = gl.exp2(x)
        alpha = gl.exp2(m_i - m_safe)  # 1 where the max stayed, 0 where nothing was seen
        l_new = l_i * alpha + gl.sum(p, 1)
        return p, m_new, l_new, alpha, rescale

    @gluon.jit
    def _consumer(WG: gl.constexpr, o_desc, q_smem, o_smem, k_smem, v_smem, bars, LSE,
                  n_m_blocks, n_tiles, H, GROUP, N_Q, N_K, LEFT, RIGHT, qk_scale,
                  HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                  HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr, NEG_SCALE: gl.constexpr,
                  LPT: gl.constexpr, PERSISTENT: gl.constexpr, PINGPONG: gl.constexpr,
                  RESCALE_THRESHOLD: gl.constexpr, POLY_PER_8: gl.constexpr,
                  POLY_DEGREE: gl.constexpr, PACK_P: gl.constexpr, NUM_WG: gl.constexpr):
        """One consumer warpgroup: 64 query rows per work tile, the loop of FA3 Algorithm 2."""
        q_ready, q_empty, k_ready, k_empty, v_ready, v_empty, turn = bars
        # wgmma accumulators: S is 64 x BLOCK_N, O is 64 x HEAD_DIM, spread over 4 warps; P is
        # fed to the second GEMM from registers in the layout S already has (no data movement)
        S_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                      instr_shape=[16, BLOCK_N, 16])
        O_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                      instr_shape=[16, HEAD_DIM, 16])
        P_L: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=O_L, k_width=2)
        ROW_S: gl.constexpr = gl.SliceLayout(1, S_L)
        ROW_O: gl.constexpr = gl.SliceLayout(1, O_L)
        dtype: gl.constexpr = q_smem.dtype
        offs_n = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, S_L))
        s_zero = gl.zeros([64, BLOCK_N], gl.float32, S_L)
        q = q_smem.index(WG).reshape([64, HEAD_DIM])
        o_buf = o_smem.index(WG)
        if WG == NUM_WG - 1:
            _pass_turn(turn, WG, PINGPONG, NUM_WG)  # warpgroup 0 takes the first turn

        base = 0  # K/V tiles consumed so far (the ring position, as the producer counts)
        turns = 0  # turns taken at the tensor cores so far
        count = 0  # work tiles so far
        for tile_id in range(gl.program_id(0), n_tiles, gl.num_programs(0)):
            off_z, off_h, off_hk, off_zh, start_m, lo, hi, lo_off, hi_off = _tile_coords(
                tile_id, n_m_blocks, H, GROUP, N_Q, N_K, LEFT, RIGHT, BLOCK_N, HAS_LEFT,
                HAS_RIGHT, LPT, NUM_WG)
            row0 = start_m + WG * 64
            offs_m = row0 + gl.arange(0, 64, layout=ROW_S)
            # which of this warpgroup's tiles need a mask: past the end of K, or crossing a
            # causal / window edge for at least one of its 64 rows (the first row has the
            # lowest right edge, the last row the highest left edge)
            mask_from = N_K // BLOCK_N * BLOCK_N
            if HAS_RIGHT:
                mask_from = gl.minimum(mask_from, row0 + hi_off + 1 - BLOCK_N + 1)
            mask_below = 0
            if HAS_LEFT:
                mask_below = row0 + 63 + lo_off

            mbarrier.wait(q_ready.index(WG), count & 1)
            m_i = gl.full([64], float("-inf"), gl.float32, ROW_S)
            l_i = gl.zeros([64], gl.float32, ROW_S)

            # prologue: S_lo and its softmax
            slot = base % STAGES
            mbarrier.wait(k_ready.index(slot), (base // STAGES) & 1)
            _wait_turn(turn, WG, turns, PINGPONG)
            qk = warpgroup_mma(q, k_smem.index(slot).reshape([BLOCK_N, HEAD_DIM]).permute((1, 0)),
                               s_zero, use_acc=False, is_async=True)
            _pass_turn(turn, WG, PINGPONG, NUM_WG)
            qk = warpgroup_mma_wait(0, deps=[qk])
            mbarrier.arrive(k_empty.index(slot), count=1)
            start_n = lo * BLOCK_N
            need_mask = (start_n >= mask_from) | (start_n < mask_below)
            p, m_i, l_i, alpha, rescale = _softmax(
                qk, m_i, l_i, offs_m, offs_n, start_n, need_mask, N_K, lo_off, hi_off,
                qk_scale, HAS_LEFT, HAS_RIGHT, NEG_SCALE, RESCALE_THRESHOLD, POLY_PER_8,
                POLY_DEGREE)
            p_op = gl.convert_layout(_to_operand(p, dtype, PACK_P), P_L)
            acc = gl.zeros([64, HEAD_DIM], gl.float32, O_L)

            for j in range(lo + 1, hi):
                i = base + j - lo
                slot = i % STAGES
                prev = (i - 1) % STAGES
                mbarrier.wait(k_ready.index(slot), (i // STAGES) & 1)
                _wait_turn(turn, WG, turns + j - lo, PINGPONG)
                # S_j = Q K_j^T goes to the tensor cores first ...
                qk = warpgroup_mma(q, k_smem.index(slot).reshape([BLOCK_N, HEAD_DIM])
                                   .permute((1, 0)), s_zero, use_acc=False, is_async=True)
                # ... then O is rescaled for block j-1's max and O += P_{j-1} V_{j-1} queued
                if RESCALE_THRESHOLD > 0:
                    if rescale:
                        acc = acc * gl.expand_dims(gl.convert_layout(alpha, ROW_O), 1)
                else:
                    acc = acc * gl.expand_dims(gl.convert_layout(alpha, ROW_O), 1)
                mbarrier.wait(v_ready.index(prev), ((i - 1) // STAGES) & 1)
                acc = warpgroup_mma(p_op, v_smem.index(prev).reshape([BLOCK_N, HEAD_DIM]), acc,
                                    is_async=True)
                _pass_turn(turn, WG, PINGPONG, NUM_WG)
                # wait for S_j only; P_{j-1} V_{j-1} keeps the tensor cores busy meanwhile
                qk = warpgroup_mma_wait(1, deps=[qk])
                mbarrier.arrive(k_empty.index(slot), count=1)
                start_n = j * BLOCK_N
                need_mask = (start_n >= mask_from) | (start_n < mask_below)
                p, m_i, l_i, alpha, rescale = _softmax(
                    qk, m_i, l_i, offs_m, offs_n, start_n, need_mask, N_K, lo_off, hi_off,
                    qk_scale, HAS_LEFT, HAS_RIGHT, NEG_SCALE, RESCALE_THRESHOLD, POLY_PER_8,
                    POLY_DEGREE)
                acc, p_op = warpgroup_mma_wait(0, deps=[acc, p_op])
                mbarrier.arrive(v_empty.index(prev), count=1)
                p_op = gl.convert_layout(_to_operand(p, dtype, PACK_P), P_L)
            if PERSISTENT:  # every S of this tile is done: Q's slot may take the next tile's Q
                mbarrier.arrive(q_empty.index(WG), count=1)

            # epilogue: the last block's P V, then delayed normalisation
            last = base + hi - 1 - lo
            if RESCALE_THRESHOLD > 0:
                if rescale:
                    acc = acc * gl.expand_dims(gl.convert_layout(alpha, ROW_O), 1)
            else:
                acc = acc * gl.expand_dims(gl.convert_layout(alpha, ROW_O), 1)
            mbarrier.wait(v_ready.index(last % STAGES), (last // STAGES) & 1)
            _wait_turn(turn, WG, turns + hi - lo, PINGPONG)
            acc = warpgroup_mma(p_op, v_smem.index(last % STAGES).reshape([BLOCK_N, HEAD_DIM]),
                                acc, is_async=True)
            _pass_turn(turn, WG, PINGPONG, NUM_WG)
            acc, p_op = warpgroup_mma_wait(0, deps=[acc, p_op])
            mbarrier.arrive(v_empty.index(last % STAGES), count=1)

            # a row that saw no key (l = 0) gets O = 0 and lse = -inf
            seen = l_i > 0.0
            l_safe = gl.where(seen, l_i, 1.0)
            acc = acc / gl.expand_dims(gl.convert_layout(l_safe, ROW_O), 1)
            lse = gl.where(seen, (m_i + gl.log2(l_safe)) * _LN2, float("-inf"))
            gl.store(LSE + off_zh.to(gl.int64) * N_Q + offs_m, lse, mask=offs_m < N_Q)
            # O leaves through the copy engine, which clips rows past N_Q; its buffer is this
            # warpgroup's Q slot (one tile per program) or its own (persistent), whose previous
            # copy must have left first
            tma.store_wait(0)
            o_buf.reshape([64, HEAD_DIM]).store(acc.to(dtype))
            fence_async_shared()
            tma.async_copy_shared_to_global(o_desc, [off_z, off_h, row0, 0], o_buf)
            base += hi - lo
            turns += hi - lo + 1
            count += 1
        tma.store_wait(0)

    # lengths and window sizes are not specialised on: one compiled kernel serves them all
    @gluon.jit(do_not_specialize=["H", "GROUP", "N_Q", "N_K", "LEFT", "RIGHT", "n_m_blocks",
                                  "n_tiles"])
    def _attn_fwd_ws(q_desc, k_desc, v_desc, o_desc, LSE, qk_scale,
                     H, GROUP, N_Q, N_K, LEFT, RIGHT, n_m_blocks, n_tiles,
                     HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                     HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr, NEG_SCALE: gl.constexpr,
                     LPT: gl.constexpr, PERSISTENT: gl.constexpr, PINGPONG: gl.constexpr,
                     RESCALE_THRESHOLD: gl.constexpr, POLY_PER_8: gl.constexpr,
                     POLY_DEGREE: gl.constexpr, PACK_P: gl.constexpr, NUM_WG: gl.constexpr):
        # work tiles are (batch * head, query block of 64 * NUM_WG rows); a program takes tiles
        # program_id, program_id + programs, ... (one each unless PERSISTENT)
        # shared memory: Q (a 64-row slot per consumer), O's staging (Q's slots unless persistent),
        # the K/V ring, barriers
        q_smem = gl.allocate_shared_memory(q_desc.dtype, [NUM_WG] + q_desc.block_type.shape,
                                           q_desc.layout)
        if PERSISTENT:
            o_smem = gl.allocate_shared_memory(o_desc.dtype, [NUM_WG] + o_desc.block_type.shape,
                                               o_desc.layout)
        else:
            o_smem = q_smem
        k_smem = gl.allocate_shared_memory(k_desc.dtype, [STAGES] + k_desc.block_type.shape,
                                           k_desc.layout)
        v_smem = gl.allocate_shared_memory(v_desc.dtype, [STAGES] + v_desc.block_type.shape,
                                           v_desc.layout)
        q_ready = gl.allocate_shared_memory(gl.int64, [NUM_WG, 1], mbarrier.MBarrierLayout())
        q_empty = gl.allocate_shared_memory(gl.int64, [NUM_WG, 1], mbarrier.MBarrierLayout())
        turn = gl.allocate_shared_memory(gl.int64, [NUM_WG, 1], mbarrier.MBarrierLayout())
        k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for w in gl.static_range(NUM_WG):
            mbarrier.init(q_ready.index(w), count=1)
            mbarrier.init(q_empty.index(w), count=1)
            mbarrier.init(turn.index(w), count=1)
        for s in gl.static_range(STAGES):
            mbarrier.init(k_ready.index(s), count=1)
            mbarrier.init(v_ready.index(s), count=1)
            mbarrier.init(k_empty.index(s), count=NUM_WG)  # one arrival per consumer
            mbarrier.init(v_empty.index(s), count=NUM_WG)
        bars = (q_ready, q_empty, k_ready, k_empty, v_ready, v_empty, turn)

        # the consumers run one function, told apart by their first (constexpr) argument; the
        # registers the producer gives up go to them: 2 x 240 or (FA3's d = 64 split) 3 x 160
        # (written out twice: a tuple assigned to a name loses its constexprs)
        if NUM_WG == 3:
            gl.warp_specialize([
            (_producer, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, bars, n_m_blocks,
                         n_tiles, H, GROUP, N_Q, N_K, LEFT, RIGHT, BLOCK_N, STAGES, HAS_LEFT,
                         HAS_RIGHT, LPT, PERSISTENT, NUM_WG)),
            (_consumer, (0, o_desc, q_smem, o_smem, k_smem, v_smem, bars, LSE, n_m_blocks,
                         n_tiles, H, GROUP, N_Q, N_K, LEFT, RIGHT, qk_scale, HEAD_DIM, BLOCK_N,
                         STAGES, HAS_LEFT, HAS_RIGHT, NEG_SCALE, LPT, PERSISTENT, PINGPONG,
                         RESCALE_THRESHOLD, POLY_PER_8, POLY_DEGREE, PACK_P, NUM_WG)),
            (_consumer, (1, o_desc, q_smem, o_smem, k_smem, v_smem, bars, LSE, n_m_blocks,
                         n_tiles, H, GROUP, N_Q, N_K, LEFT, RIGHT, qk_scale, HEAD_DIM, BLOCK_N,
                         STAGES, HAS_LEFT, HAS_RIGHT, NEG_SCALE, LPT, PERSISTENT, PINGPONG,
                         RESCALE_THRESHOLD, POLY_PER_8, POLY_DEGREE, PACK_P, NUM_WG)),
            (_consumer, (2, o_desc, q_smem, o_smem, k_smem, v_smem, bars, LSE, n_m_blocks,
                         n_tiles, H, GROUP, N_Q, N_K, LEFT, RIGHT, qk_scale, HEAD_DIM, BLOCK_N,
                         STAGES, HAS_LEFT, HAS_RIGHT, NEG_SCALE, LPT, PERSISTENT, PINGPONG,
                         RESCALE_THRESHOLD, POLY_PER_8, POLY_DEGREE, PACK_P, NUM_WG)),
            ], [4, 4, 4], [160, 160, 160])
        else:
            gl.warp_specialize([
            (_producer, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, bars, n_m_blocks,
                         n_tiles, H, GROUP, N_Q, N_K, LEFT, RIGHT, BLOCK_N, STAGES, HAS_LEFT,
                         HAS_RIGHT, LPT, PERSISTENT, NUM_WG)),
            (_consumer, (0, o_desc, q_smem, o_smem, k_smem, v_smem, bars, LSE, n_m_blocks,
                         n_tiles, H, GROUP, N_Q, N_K, LEFT, RIGHT, qk_scale, HEAD_DIM, BLOCK_N,
                         STAGES, HAS_LEFT, HAS_RIGHT, NEG_SCALE, LPT, PERSISTENT, PINGPONG,
                         RESCALE_THRESHOLD, POLY_PER_8, POLY_DEGREE, PACK_P, NUM_WG)),
            (_consumer, (1, o_desc, q_smem, o_smem, k_smem, v_smem, bars, LSE, n_m_blocks,
                         n_tiles, H, GROUP, N_Q, N_K, LEFT, RIGHT, qk_scale, HEAD_DIM, BLOCK_N,
                         STAGES, HAS_LEFT, HAS_RIGHT, NEG_SCALE, LPT, PERSISTENT, PINGPONG,
                         RESCALE_THRESHOLD, POLY_PER_8, POLY_DEGREE, PACK_P, NUM_WG)),
            ], [4, 4], [240, 240])


@functools.cache
def _capability(index: int | None) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


@functools.cache
def _sm_count(index: int | None) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def _gl_dtype(dtype: torch.dtype):
    return gl.float16 if dtype == torch.float16 else gl.bfloat16


def _descriptor(t: torch.Tensor, rows: int):
    """A 4-D copy-engine descriptor over t (Z, H, N, d): tiles [1, 1, rows, d] at
    coordinates [batch, head, first row, 0]; rows past N read as zeros, writes past N clip."""
    block = [1, 1, rows, t.shape[-1]]
    layout = _shared_layout(tuple(block), _gl_dtype(t.dtype))
    return GluonDescriptor(t, list(t.shape), list(t.stride()), block, layout)


@functools.lru_cache(maxsize=256)
def _shared_layout(block: tuple[int, ...], dtype):
    """The shared-memory (NVMMA) layout of a tile, worked out once per block shape and dtype:
    Gluon's ``get_default_for`` costs about 10 us of host time a call, and every launch builds
    four descriptors (the dK/dV kernel seven)."""
    return gl.NVMMASharedLayout.get_default_for(list(block), dtype)


def _tma_layout_ok(t: torch.Tensor) -> bool:
    size = t.element_size()
    return (t.stride(-1) == 1 and t.data_ptr() % 16 == 0
            and all(s > 0 and s * size % 16 == 0 for s in t.stride()[:-1]))


def _window_ok(window) -> bool:
    return (isinstance(window, tuple | list) and len(window) == 2
            and all(isinstance(w, int) and not isinstance(w, bool) and w >= -1 for w in window))


def gluon_supported(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                    window=(-1, -1)) -> bool:
    """Can :func:`gluon_forward` run these inputs? CUDA tensors on an sm_90 GPU with Gluon
    installed, fp16/bf16, head_dim 64/128/256, k and v of one shape with a head count dividing
    q's, layouts the copy engine can address (unit last stride, 16-byte aligned base and
    strides), lengths >= 1. Otherwise False: the caller falls back to the Triton kernel."""
    if not HAVE_GLUON or not all(isinstance(t, torch.Tensor) for t in (q, k, v)):
        return False
    if not (q.is_cuda and k.is_cuda and v.is_cuda) or not (q.device == k.device == v.device):
        return False
    if _capability(q.device.index) != (9, 0):
        return False
    if not (q.dtype == k.dtype == v.dtype) or q.dtype not in SUPPORTED_DTYPES:
        return False
    if q.dim() != 4 or k.dim() != 4 or k.shape != v.shape:
        return False
    z, h, n_q, d = q.shape
    zk, hk, n_k, dk = k.shape
    if d not in HEAD_DIMS or dk != d or zk != z or hk < 1 or h % hk != 0:
        return False
    if n_q < 1 or n_k < 1 or not isinstance(causal, bool):
        return False
    if not _window_ok(window):
        return False
    return all(_tma_layout_ok(t) for t in (q, k, v))


def gluon_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                  sm_scale: float, window=(-1, -1),
                  **switches) -> tuple[torch.Tensor, torch.Tensor]:
    """The FA3-style forward on inputs :func:`gluon_supported` accepts.

    q (Z, H, N_Q, d); k, v (Z, H_KV, N_K, d) with H_KV dividing H. ``window = (left, right)``:
    query i sees keys i + off - left <= j <= i + off + right (off = N_K - N_Q, -1 = unbounded),
    combined with the causal mask when ``causal``. Returns O (contiguous, q's dtype) and lse
    (Z, H, N_Q) float32, natural log. ``switches`` select kernel variants for measurement
    (see :func:`kernel_constants`).
    """
    o, lse, _ = launch(q, k, v, causal, sm_scale, window, **switches)
    return o, lse


def kernel_constants(head_dim: int, causal: bool, window=(-1, -1), sm_scale: float = 1.0, *,
                     pingpong: bool = True, persistent: bool = False,
                     rescale_threshold: float = 0.0, poly_per_8: int = 0, poly_degree: int = 3,
                     pack_p: bool = True, consumers: int = 2, block_n: int | None = None,
                     stages: int | None = None, open_left: bool = False,
                     named_turn: bool = False) -> dict:
    """The compile-time constants of one kernel variant.

    ``pingpong``: turn-taking of the two consumer warpgroups. ``persistent``: one program per
    SM looping over the work tiles (the next tile's loads overlap this one's end; O gets its
    own staging buffer, so not at d = 256). ``rescale_threshold`` (FA4): powers of two, 0 =
    rescale at every new max. ``poly_per_8`` (FA4): exponentials of every 8 computed by a
    degree-``poly_degree`` polynomial on the FMA units. ``pack_p``: round P two scores per
    instruction (cvt.rn.*x2) instead of one (``p.to``). ``consumers``: 2 warpgroups of 240
    registers (128 query rows a program) or 3 of 160 (192 rows, FlashAttention-3's choice at
    d = 64). ``block_n`` / ``stages`` override :func:`tile_config`. ``open_left``: a call without
    a left edge gets one that hides no key (see :func:`_window_bounds`); it costs one compare a
    tile, and with it ptxas fits the loop in registers where a right edge alone makes it spill.
    ``named_turn``: the ping-pong turns on named hardware barriers (``bar.sync`` /
    ``bar.arrive`` by every thread, FlashAttention-3's way) instead of mbarriers."""
    if not (isinstance(poly_per_8, int) and 0 <= poly_per_8 <= 8):
        raise ValueError(f"poly_per_8 must be an integer from 0 to 8, got {poly_per_8!r}")
    if not (rescale_threshold >= 0 and math.isfinite(rescale_threshold)):
        raise ValueError(f"rescale_threshold must be finite and >= 0, got {rescale_threshold!r}")
    if rescale_threshold > 15:
        raise ValueError("rescale_threshold must be <= 15: P's entries reach 2**threshold and "
                         "must stay below float16's largest value")
    exp2_poly_coefficients(poly_degree)  # validates the degree
    if consumers not in (2, 3) or isinstance(consumers, bool):
        raise ValueError(f"consumers must be 2 or 3 (warpgroups), got {consumers!r}")
    if consumers == 3 and head_dim == 256:
        raise ValueError("consumers=3 does not fit d = 256: 160 registers a thread cannot hold "
                         "a 64 x 256 fp32 O")
    if persistent and head_dim == 256:
        raise ValueError("persistent needs O's own staging buffer, which does not fit next to "
                         "d = 256's Q and K/V ring in shared memory")
    if named_turn and not pingpong:
        raise ValueError("named_turn=True takes the ping-pong turns on named barriers; it "
                         "needs pingpong=True")
    default_n, default_stages = tile_config(head_dim)
    left, right = window
    return dict(HEAD_DIM=head_dim, BLOCK_N=block_n or default_n,
                STAGES=stages or default_stages, HAS_LEFT=left >= 0 or bool(open_left),
                HAS_RIGHT=causal or right >= 0, NEG_SCALE=sm_scale < 0, LPT=causal,
                PERSISTENT=bool(persistent), PINGPONG=(2 if named_turn else 1) if pingpong else 0,
                RESCALE_THRESHOLD=float(rescale_threshold), POLY_PER_8=poly_per_8,
                POLY_DEGREE=poly_degree, PACK_P=bool(pack_p), NUM_WG=consumers)


def tile_plan(start_m: int, n_q: int, n_k: int, block_n: int, causal: bool,
              window=(-1, -1), consumers: int = 2,
              open_left: bool = False) -> tuple[int, int, tuple[tuple[int, int], ...]]:
    """The kernel's tile arithmetic, line for line in Python (tests hold it to the mask).

    For the program whose rows (64 per consumer) start at ``start_m``: the key tiles [lo, hi)
    it loads, and per consumer warpgroup (mask_from, mask_below): tile j computes a mask iff
    ``j * block_n >= mask_from or j * block_n < mask_below``.
    """
    left, right = _window_bounds(causal, window, n_q, n_k, open_left)
    has_left, has_right = window[0] >= 0 or open_left, causal or window[1] >= 0
    lo_off = n_k - n_q - left
    hi_off = n_k - n_q + right
    last_row = min(start_m + consumers * WG_M, n_q) - 1
    hi_key = max(min(n_k, last_row + hi_off + 1), 0) if has_right else n_k
    lo_key = min(max(start_m + lo_off, 0), n_k) if has_left else 0
    lo = min(lo_key // block_n, (n_k - 1) // block_n)
    hi = max(-(-hi_key // block_n), lo + 1)
    masks = []
    for wg in range(consumers):
        row0 = start_m + wg * WG_M
        mask_from = n_k // block_n * block_n
        if has_right:
            mask_from = min(mask_from, row0 + hi_off + 1 - block_n + 1)
        mask_below = row0 + WG_M - 1 + lo_off if has_left else 0
        masks.append((mask_from, mask_below))
    return lo, hi, tuple(masks)


def _window_bounds(causal: bool, window, n_q: int = 0, n_k: int = 0,
                   open_left: bool = False) -> tuple[int, int]:
    """(LEFT, RIGHT) kernel arguments: causal caps the right edge at the diagonal. With
    ``open_left`` and no left edge, LEFT = N_Q + N_K: row i's first key i - 2 N_Q lies before
    key 0, so the edge hides nothing."""
    left, right = (int(w) for w in window)
    if causal:
        right = 0 if right < 0 else min(right, 0)
    if open_left and left < 0:
        if n_q < 1 or n_k < 1:
            raise ValueError(f"open_left needs the lengths n_q, n_k >= 1, got {n_q}, {n_k}")
        left = n_q + n_k
    return max(left, 0), max(right, 0)


def launch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, sm_scale: float,
           window=(-1, -1), *, checked: bool = False, **switches):
    """Run the kernel; returns (O, lse, the compiled kernel) (its ``asm`` holds PTX/SASS).
    ``checked``: the caller has just had :func:`gluon_supported` say yes to these inputs."""
    if not checked and not gluon_supported(q, k, v, causal, window):
        raise ValueError("gluon_forward: inputs not supported (see gluon_supported): need "
                         "CUDA sm_90, fp16/bf16, head_dim in (64, 128, 256), TMA-compatible "
                         "strides, k/v heads dividing q heads, window of two ints >= -1")
    z, h, n_q, d = q.shape
    h_kv, n_k = k.shape[1], k.shape[2]
    constants = kernel_constants(d, causal, tuple(window), sm_scale, **switches)
    o = torch.empty((z, h, n_q, d), dtype=q.dtype, device=q.device)
    lse = torch.empty((z, h, n_q), dtype=torch.float32, device=q.device)
    left, right = _window_bounds(causal, window, n_q, n_k, switches.get("open_left", False))
    n_m_blocks = -(-n_q // (constants["NUM_WG"] * WG_M))
    n_tiles = n_m_blocks * z * h
    programs = min(n_tiles, _sm_count(q.device.index)) if constants["PERSISTENT"] else n_tiles
    kernel = fastpath.launch(_attn_fwd_ws, (programs,), (
        _descriptor(q, WG_M), _descriptor(k, constants["BLOCK_N"]),
        _descriptor(v, constants["BLOCK_N"]), _descriptor(o, WG_M), lse, sm_scale * LOG2E,
        h, h // h_kv, n_q, n_k, left, right, n_m_blocks, n_tiles), constants, num_warps=4)
    return o, lse, kernel


def compile_sm90(head_dim: int = 128, dtype: torch.dtype = torch.float16, causal: bool = False,
                 window=(-1, -1), **switches):
    """Compile one variant for sm_90 without a GPU (CPU tensors only describe the layouts);
    returns Triton's compiled kernel, whose ``asm`` has "ttgir", "ptx" and "cubin". Needs a
    Triton with Gluon, imported with TRITON_INTERPRET unset or 0."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.runtime.jit import mangle_type

    constants = kernel_constants(head_dim, causal, tuple(window), **switches)
    q = torch.empty(2, 4, 1000, head_dim, dtype=dtype)
    k = torch.empty(2, 2, 1000, head_dim, dtype=dtype)
    descs = dict(q_desc=_descriptor(q, WG_M), k_desc=_descriptor(k, constants["BLOCK_N"]),
                 v_desc=_descriptor(k, constants["BLOCK_N"]), o_desc=_descriptor(q, WG_M))
    signature = {name: mangle_type(desc) for name, desc in descs.items()}
    signature.update(LSE="*fp32", qk_scale="fp32", H="i32", GROUP="i32", N_Q="i32", N_K="i32",
                     LEFT="i32", RIGHT="i32", n_m_blocks="i32", n_tiles="i32")
    source = GluonASTSource(_attn_fwd_ws, signature, constants)
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})


__all__ = ["HAVE_GLUON", "HEAD_DIMS", "TURN_BARRIER_BASE", "compile_sm90", "exp2_asm",
           "gluon_forward", "gluon_supported", "kernel_constants", "launch", "tile_config",
           "tile_plan"]
