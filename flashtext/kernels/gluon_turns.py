"""The ping-pong turn of the Gluon forward's consumer warpgroups: who issues GEMMs next.

Warpgroup w waits for its t-th turn before issuing its GEMMs and passes the turn to the next
(w + 1 mod the number of consumers) once they are issued. ``PINGPONG`` picks how: 0 no turns,
1 on an mbarrier per warpgroup (one thread arrives, after the warpgroup barrier Triton puts
before it), 2 on named hardware barriers (``bar.sync`` by the waiting warpgroup, ``bar.arrive``
by the passing one, every thread: FlashAttention-3's way, needing no warpgroup barrier).
"""

from __future__ import annotations

TURN_BARRIER_BASE = 8  # the first named barrier of the turns; Triton's own take the lower ids

try:  # Gluon ships with Triton >= 3.5; the CPU machine may lack it or run the interpreter
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import mbarrier
    HAVE_GLUON = True
except ImportError:  # pragma: no cover - depends on the installed Triton
    HAVE_GLUON = False

if HAVE_GLUON:
    @gluon.constexpr_function
    def _named_barrier_asm(op, wg):
        # barrier 8 + w is warpgroup w's turn: it waits there (bar.sync, its 128 threads) for
        # the warpgroup before it to arrive (bar.arrive, 128 more); Triton's own barriers take
        # the lower ids (the whole CTA's and each partition's)
        from flashtext.kernels import gluon_turns as this
        return f"bar.{op} {this.TURN_BARRIER_BASE + wg}, 256;\n\tmov.b32 $0, $1;"

    @gluon.jit
    def _named_barrier(op: gl.constexpr, wg: gl.constexpr):
        """One bar.sync / bar.arrive per thread: an int32 tensor with one element a thread
        carries the instruction (a warpgroup's 128 threads, 4 warps)."""
        one_each: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
        token = gl.zeros([128], gl.int32, one_each)
        gl.inline_asm_elementwise(_named_barrier_asm(op, wg), "=r,r", [token], dtype=gl.int32,
                                  is_pure=False, pack=1)

    @gluon.jit
    def _wait_turn(turn, WG: gl.constexpr, t, PINGPONG: gl.constexpr):
        """Ping-pong: wait until the warpgroup before this one has issued its GEMMs (the t-th
        turn; with three consumers the turn goes round 0 -> 1 -> 2 -> 0). PINGPONG 1: on an
        mbarrier (one thread arrives, after a warpgroup barrier Triton adds); 2: on a named
        hardware barrier, as FlashAttention-3 does (every thread arrives, nothing added)."""
        if PINGPONG == 1:
            mbarrier.wait(turn.index(WG), t & 1)
        elif PINGPONG == 2:
            _named_barrier("sync", WG)

    @gluon.jit
    def _pass_turn(turn, WG: gl.constexpr, PINGPONG: gl.constexpr, NUM_WG: gl.constexpr):
        if PINGPONG == 1:
            mbarrier.arrive(turn.index((WG + 1) % NUM_WG), count=1)
        elif PINGPONG == 2:
            _named_barrier("arrive", (WG + 1) % NUM_WG)
