"""The Gluon FA3-style forward (flashtext.kernels.gluon_forward).

It runs only on an sm_90 GPU (Gluon has no interpreter). The GPU tests compare it with the
float64 reference under the accuracy rule of ``flashtext.kernels.accuracy`` (at most twice
PyTorch's error in the same dtype, plus the documented allowances); the CPU tests check what a
CPU can: the generated exponential code, input validation, and that the kernel compiles for
sm_90 to the instructions FA3 is made of.
"""

import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from flashtext import fa4_softmax as fa4
from flashtext import reference
from flashtext.fa4_softmax import exp2_poly_coefficients, exp2_relative_error
from flashtext.kernels import gluon_forward as gf
from flashtext.kernels.accuracy import Case, Errors, make_inputs
from tests.gluon_watchdog import SM90, gluon_watchdog, sm90  # noqa: F401 (an autouse fixture)
from tests.kernel_helpers import (
    DEVICE,
    GPU_SWEEP,
    _np,
    _poisoned,
    assert_has_gqa_and_windows,
    gpu,
    gpu_model_sweep,
)

# ---------------------------------------------------------------- CPU: code, validation


@pytest.mark.parametrize("poly", [0, 1, 2, 8])
def test_exp2_asm_splits_mufu_and_fma(poly):
    asm = gf.exp2_asm(poly, 3) if poly else ""
    if poly:
        assert asm.count("ex2.approx.ftz.f32") == 8 - poly
        assert asm.count("add.rm.ftz.f32") == poly  # one range reduction per polynomial
        assert asm.count("fma.rn.ftz.f32") == 3 * poly  # Horner, degree 3
        # the literals are the fitted coefficients, bit for bit
        for c in exp2_poly_coefficients(3)[1:]:
            assert fa4._f32_hex(c) in asm
    assert fa4._f32_hex(1.0) == "0f3F800000" and fa4._f32_hex(-127.0) == "0fC2FE0000"


def test_tile_config_fits_shared_memory():
    for d in gf.HEAD_DIMS:
        block_n, stages = gf.tile_config(d)
        smem = 2 * (gf.BLOCK_M * d + stages * 2 * block_n * d)  # Q + the K/V ring, 2-byte
        assert smem <= 227 * 1024
        if d < 256:  # three consumers, persistent: Q and O's staging of 192 rows, the ring
            assert 2 * (2 * 3 * gf.WG_M * d + stages * 2 * block_n * d) <= 227 * 1024, d
    with pytest.raises(ValueError, match="head_dim"):
        gf.tile_config(96)


def test_kernel_constants_validate():
    c = gf.kernel_constants(128, causal=True, window=(64, -1))
    assert (c["HAS_LEFT"], c["HAS_RIGHT"], c["LPT"]) == (True, True, True)
    assert gf.kernel_constants(64, False)["HAS_RIGHT"] is False
    assert gf._window_bounds(True, (-1, 5)) == (0, 0)  # causal caps the right edge
    assert gf._window_bounds(False, (7, 5)) == (7, 5)
    assert gf._window_bounds(True, (-1, -1), 10, 30, open_left=True) == (40, 0)
    assert gf._window_bounds(False, (7, 5), 10, 30, open_left=True) == (7, 5)  # has an edge
    with pytest.raises(ValueError, match="open_left needs the lengths"):
        gf._window_bounds(True, (-1, -1), open_left=True)
    with pytest.raises(ValueError, match="poly_per_8"):
        gf.kernel_constants(64, False, poly_per_8=9)
    with pytest.raises(ValueError, match="rescale_threshold"):
        gf.kernel_constants(64, False, rescale_threshold=16.0)
    with pytest.raises(ValueError, match="degree"):
        gf.kernel_constants(64, False, poly_per_8=1, poly_degree=0)
    with pytest.raises(ValueError, match="persistent"):
        gf.kernel_constants(256, False, persistent=True)
    assert gf.kernel_constants(64, False)["NUM_WG"] == 2
    assert gf.kernel_constants(64, False, consumers=3)["NUM_WG"] == 3
    for bad in (1, 4, True, 2.5):
        with pytest.raises(ValueError, match="consumers must be 2 or 3"):
            gf.kernel_constants(64, False, consumers=bad)
    with pytest.raises(ValueError, match="consumers=3 does not fit d = 256"):
        gf.kernel_constants(256, False, consumers=3)
    # the turn: 0 off, 1 on mbarriers (the default), 2 on named barriers
    assert gf.kernel_constants(128, False)["PINGPONG"] == 1
    assert gf.kernel_constants(128, False, pingpong=False)["PINGPONG"] == 0
    assert gf.kernel_constants(128, False, named_turn=True)["PINGPONG"] == 2
    with pytest.raises(ValueError, match="named_turn=True .* needs pingpong=True"):
        gf.kernel_constants(128, False, pingpong=False, named_turn=True)


def test_not_supported_off_sm90():
    q = torch.zeros(1, 2, 16, 64, dtype=torch.float16)
    assert not gf.gluon_supported(q, q, q, False)
    with pytest.raises(ValueError, match="not supported"):
        gf.gluon_forward(q, q, q, False, 0.125)


@pytest.mark.parametrize("consumers,open_left", [(2, False), (3, False), (2, True), (3, True)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window", [(-1, -1), (0, 0), (37, 0), (100, 30), (-1, 50), (200, -1)])
def test_tile_plan_covers_every_visible_key_and_masks_every_partial_tile(causal, window,
                                                                         consumers, open_left):
    """For each program and warpgroup: every key a real row sees lies in a loaded tile, a tile
    is left unmasked only if each of the warpgroup's rows sees each of its keys, and the
    kernel's per-score test (its LEFT / RIGHT arguments) shows a real row exactly its keys."""
    # every diagonal offset N_k - N_q modulo both tile widths, plus short and lopsided shapes
    shapes = [(1, 1), (17, 1000), (1000, 17), (700, 300), (2, 600)]
    shapes += [(200, 200 + delta) for delta in range(-64, 65)]
    constants = gf.kernel_constants(64, causal, window, open_left=open_left)
    for n_q, n_k in shapes:
        keep = _visible(n_q, n_k, causal, window)
        left, right = gf._window_bounds(causal, window, n_q, n_k, open_left)
        rows, cols = np.arange(n_q)[:, None], np.arange(n_k)[None, :]
        shown = np.ones((n_q, n_k), dtype=bool)
        if constants["HAS_RIGHT"]:
            shown &= cols <= rows + n_k - n_q + right
        if constants["HAS_LEFT"]:
            shown &= cols >= rows + n_k - n_q - left
        assert np.array_equal(shown, keep), (n_q, n_k, left, right)
        for block_n in (64, 128):
            block_m = consumers * gf.WG_M
            for start_m in range(0, n_q, block_m):
                lo, hi, masks = gf.tile_plan(start_m, n_q, n_k, block_n, causal, window,
                                             consumers, open_left)
                assert 0 <= lo < hi <= max(1, -(-n_k // block_n)) and len(masks) == consumers
                rows = keep[start_m:start_m + block_m]
                cols = np.nonzero(rows.any(axis=0))[0]
                if cols.size:
                    assert lo * block_n <= cols.min() and cols.max() < hi * block_n
                for wg, (mask_from, mask_below) in enumerate(masks):
                    r0 = start_m + wg * gf.WG_M
                    wg_rows = keep[r0:min(r0 + gf.WG_M, n_q)]
                    for j in range(lo, hi):
                        start = j * block_n
                        masked = start >= mask_from or start < mask_below
                        full = start + block_n <= n_k and (
                            wg_rows.size == 0 or wg_rows[:, start:start + block_n].all())
                        # real rows only: rows past N_q compute values nobody stores
                        assert masked or full, (n_q, n_k, block_n, start_m, wg, j)


def test_tile_plan_is_the_kernels_arithmetic():
    """tile_plan repeats the kernel's expressions; if one side changes, so must the other."""
    import inspect

    src = inspect.getsource(gf._tile_coords.fn) + inspect.getsource(gf._consumer.fn)
    for expr in ("lo_off = causal_offset - LEFT", "hi_off = causal_offset + RIGHT",
                 "start_m = m_block * (64 * NUM_WG)",
                 "last_row = gl.minimum(start_m + 64 * NUM_WG, N_Q) - 1",
                 "hi_key = gl.maximum(gl.minimum(N_K, last_row + hi_off + 1), 0)",
                 "lo_key = gl.minimum(gl.maximum(start_m + lo_off, 0), N_K)",
                 "lo = gl.minimum(lo_key // BLOCK_N, (N_K - 1) // BLOCK_N)",
                 "hi = gl.maximum(gl.cdiv(hi_key, BLOCK_N), lo + 1)",
                 "mask_from = N_K // BLOCK_N * BLOCK_N",
                 "mask_from = gl.minimum(mask_from, row0 + hi_off + 1 - BLOCK_N + 1)",
                 "mask_below = row0 + 63 + lo_off",
                 "need_mask = (start_n >= mask_from) | (start_n < mask_below)"):
        assert expr in src, expr


_COMPILE = textwrap.dedent("""
    import json, re, torch
    from flashtext.bench.static_compile import sass_of
    from flashtext.kernels.gluon_forward import compile_sm90
    c = compile_sm90(128, torch.float16, causal=True, window=(256, -1))
    ptx = c.asm["ptx"]
    counts = {k: ptx.count(k) for k in (
        "wgmma.mma_async", "setmaxnreg.inc.sync.aligned.u32 \\t240",
        "setmaxnreg.dec.sync.aligned.u32 \\t24", "cp.async.bulk.tensor.4d",
        "mbarrier.try_wait", "ex2.approx", "ld.local", "st.local", "cvt.rn.f16.f32 ",
        "cvt.rn.f16x2.f32 ")}
    bf16 = compile_sm90(64, torch.bfloat16).asm["ptx"]
    counts.update({k: bf16.count(k) for k in ("cvt.rn.bf16.f32 ", "cvt.rn.bf16x2.f32 ")})
    counts["sass_spills"] = len(re.findall(r"\\b(LDL|STL)\\b", sass_of(c.asm["cubin"])))
    three = compile_sm90(64, torch.float16, consumers=3).asm["ptx"]
    counts["three"] = {k: three.count(k) for k in (
        "wgmma.mma_async", "setmaxnreg.inc.sync.aligned.u32 \\t160",
        "setmaxnreg.dec.sync.aligned.u32 \\t32", "mbarrier.init.shared::cta.b64")}
    # what the dispatch runs at d = 64: three consumers with the open left edge
    for causal in (False, True):
        built = compile_sm90(64, torch.float16, causal=causal, consumers=3, open_left=True,
                             persistent=not causal)
        counts[f"three_open_spills_{causal}"] = len(
            re.findall(r"\\b(LDL|STL)\\b", sass_of(built.asm["cubin"])))
    # the ping-pong turns on named barriers: FlashAttention-3's bar.sync / bar.arrive
    named = compile_sm90(128, torch.float16, causal=True, window=(256, -1),
                         named_turn=True).asm["ptx"]
    counts["named"] = {k: named.count(k) for k in (
        "bar.sync 8, 256", "bar.sync 9, 256", "bar.arrive 8, 256", "bar.arrive 9, 256",
        "mbarrier.try_wait", "mbarrier.arrive")}
    counts["named"]["triton_ids"] = sorted({int(i) for i in re.findall(
        r"\\bbar(?:rier)?\\.sync\\s+(\\d+)(?:,\\s*\\d+)?;", named)} - {8, 9})
    counts["mbarrier.arrive"] = ptx.count("mbarrier.arrive")
    print(json.dumps(counts))
""")


@pytest.mark.skipif(not gf.HAVE_GLUON, reason="this Triton has no Gluon")
def test_compiles_for_sm90_without_a_gpu():
    """Triton compiles (and its bundled ptxas assembles) the kernel for sm_90 on any machine;
    in a fresh process, because the interpreter, on here, would take over the compile."""
    env = dict(os.environ, TRITON_INTERPRET="0")
    out = subprocess.run([sys.executable, "-c", _COMPILE], env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    counts = json.loads(out.stdout.strip().splitlines()[-1])
    # two consumers x (S = Q K^T and O += P V, 8 k-steps of 16 at d = 128) x 2 code paths
    assert counts["wgmma.mma_async"] == 64
    assert counts["setmaxnreg.inc.sync.aligned.u32 \t240"] == 2  # both consumers get 240
    assert counts["setmaxnreg.dec.sync.aligned.u32 \t24"] == 1  # the producer gives up to 24
    assert counts["cp.async.bulk.tensor.4d"] >= 3  # Q, K, V tile copies (+ the O store)
    assert counts["mbarrier.try_wait"] > 0 and counts["ex2.approx"] > 0
    assert counts["ld.local"] == counts["st.local"] == 0  # no local arrays in the PTX
    assert counts["sass_spills"] == 0  # and ptxas spilled no register (LDL / STL in SASS)
    # P is rounded two scores per instruction, never one by one: O's final store already used
    # the paired form, so it is the scalar form's absence that shows P's conversion
    for kind in ("f16", "bf16"):
        assert counts[f"cvt.rn.{kind}.f32 "] == 0, counts
        assert counts[f"cvt.rn.{kind}x2.f32 "] > 0, counts
    # three consumers at d = 64 (192 query rows): 160 registers each, the producer at 32; per
    # consumer S (4 k-steps of 16) and P V (8) in the loop, S before it, P V after: 24 each
    three = counts["three"]
    assert three["setmaxnreg.inc.sync.aligned.u32 \t160"] == 3, three
    assert three["setmaxnreg.dec.sync.aligned.u32 \t32"] == 1, three
    assert three["wgmma.mma_async"] == 3 * 24, three
    # Q ready / Q empty / turn per consumer, K and V ready / empty per slot of d = 64's 3
    assert three["mbarrier.init.shared::cta.b64"] == 3 * 3 + 4 * 3, three
    # ptxas fits them in 160 registers with the left-edge test compiled in: no spill
    assert counts["three_open_spills_False"] == counts["three_open_spills_True"] == 0, counts
    # named turns: each consumer waits for its turn in three places (before the first S, in
    # the loop, before the last P V) and passes it in as many, warpgroup 1 once more at the
    # start; the turn's mbarrier waits and arrives go; Triton's own barriers keep ids below 8
    named = counts["named"]
    assert named["bar.sync 8, 256"] == named["bar.sync 9, 256"] == 3, named
    assert (named["bar.arrive 9, 256"], named["bar.arrive 8, 256"]) == (3, 4), named
    assert named["mbarrier.try_wait"] == counts["mbarrier.try_wait"] - 6, (named, counts)
    assert named["mbarrier.arrive"] == counts["mbarrier.arrive"] - 7, (named, counts)
    assert named["triton_ids"] and max(named["triton_ids"]) < gf.TURN_BARRIER_BASE, named


# ---------------------------------------------------------------- GPU: against float64


def _reference(q, k, v, causal, scale, window=(-1, -1)):
    """float64 attention (GQA, windows, bottom-right; O = 0 and lse = -inf for a query that
    sees no key)."""
    return reference.attention(q, k, v, causal=causal, scale=scale, return_lse=True,
                               window=window)


def _visible(n_q, n_k, causal, window):
    i = np.arange(n_q)[:, None] + (n_k - n_q)
    j = np.arange(n_k)[None, :]
    left, right = window
    keep = np.ones((n_q, n_k), dtype=bool)
    if causal:
        keep &= j <= i
    if right >= 0:
        keep &= j <= i + right
    if left >= 0:
        keep &= j >= i - left
    return keep


def _torch_baseline(q, k, v, causal, scale, window=(-1, -1)):
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = (q @ k.transpose(-1, -2)) * scale
    keep = torch.from_numpy(_visible(q.shape[2], k.shape[2], causal, window)).to(q.device)
    s = s.masked_fill(~keep, float("-inf"))
    return torch.softmax(s, dim=-1).nan_to_num(0.0) @ v, torch.logsumexp(s.float(), dim=-1)


def _max_abs(a, b):
    if not np.array_equal(np.isneginf(a), np.isneginf(b)):
        return math.inf
    fin = np.isfinite(b)
    return float(np.max(np.abs(a[fin] - b[fin]), initial=0.0))


def _check(q, k, v, causal, scale=None, window=(-1, -1), extra=0.0, **switches):
    """Run the kernel and hold it to the accuracy rule; ``extra`` is an added relative allowance
    on O and lse (the software exponential's documented error). Returns (o, lse)."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    o, lse = gf.gluon_forward(q, k, v, causal, scale, window, **switches)
    o_ref, lse_ref = _reference(q, k, v, causal, scale, window)
    o_pt, lse_pt = _torch_baseline(q, k, v, causal, scale, window)
    scale_o = float(np.max(np.abs(o_ref), initial=0.0))
    finite = lse_ref[np.isfinite(lse_ref)]
    scale_lse = float(np.max(np.abs(finite), initial=0.0))
    ours = {"o": _max_abs(_np(o), o_ref), "lse": _max_abs(_np(lse), lse_ref)}
    theirs = {"o": _max_abs(_np(o_pt), o_ref), "lse": _max_abs(_np(lse_pt), lse_ref)}
    err = Errors("gluon", q.dtype, ours, theirs, {"o": scale_o, "lse": scale_lse},
                 approx_exp=True)
    # P's entries off by a relative eps move O = sum p v / sum p by at most 2 eps max|v|, and
    # lse = m + log(sum p) by at most eps
    v_max = float(v.abs().max()) if v.numel() else 0.0
    for name, size in (("o", 2 * v_max), ("lse", 1.0)):
        bound = err.bound(name) + extra * size
        assert err.ours[name] <= bound, f"{name}: {err.ours[name]:.3g} > {bound:.3g}"
    return o, lse


GLUON_SWEEP = [c for c in GPU_SWEEP if c.dtype != "float32" and c.head_dim in gf.HEAD_DIMS]


def test_gluon_sweep_covers_the_required_shapes():
    assert {c.head_dim for c in GLUON_SWEEP} == set(gf.HEAD_DIMS)
    assert {c.dtype for c in GLUON_SWEEP} == {"float16", "bfloat16"}
    assert {c.causal for c in GLUON_SWEEP} == {False, True}
    assert any(c.n_q != c.n_k for c in GLUON_SWEEP)
    lengths = {c.n_q for c in GLUON_SWEEP} | {c.n_k for c in GLUON_SWEEP}
    assert {1, 17, 100, 129, 1000} <= lengths


@sm90
@gpu
@pytest.mark.parametrize("case", GLUON_SWEEP, ids=Case.label)
def test_sweep(case):
    q, k, v, _ = make_inputs(case, DEVICE)
    _check(q, k, v, case.causal)


MODEL_SWEEP = gpu_model_sweep(gf.HEAD_DIMS)


def test_model_sweep_has_gqa_and_windows():
    assert_has_gqa_and_windows(MODEL_SWEEP)


@sm90
@gpu
@pytest.mark.parametrize("case", MODEL_SWEEP, ids=Case.label)
def test_model_sweep(case):
    """The real-model cases (grouped K/V heads, sliding windows) through the Gluon kernel."""
    q, k, v, _ = make_inputs(case, DEVICE)
    assert gf.gluon_supported(q, k, v, case.causal, case.window)
    _check(q, k, v, case.causal, window=case.window)


@sm90
@gpu
@pytest.mark.parametrize("d", gf.HEAD_DIMS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n_q, n_k", [(1, 1), (17, 1000), (1000, 17), (129, 129), (300, 700)])
def test_ragged_lengths_every_head_dim(d, causal, n_q, n_k):
    case = Case(2, 3, n_q, n_k, d, causal, "bfloat16", seed=n_q + n_k + d)
    q, k, v, _ = make_inputs(case, DEVICE)
    _check(q, k, v, causal)


@sm90
@gpu
@pytest.mark.parametrize("causal", [False, True])
def test_long_sequences_wrap_the_ring_many_times(causal):
    case = Case(1, 4, 4096, 4096, 128, causal, "float16", seed=3)
    q, k, v, _ = make_inputs(case, DEVICE)
    _check(q, k, v, causal)


@sm90
@gpu
def test_queries_that_see_no_key():
    # causal with N_q > N_k: the first N_q - N_k queries see nothing; whole blocks of them too
    q, k, v, _ = make_inputs(Case(1, 2, 700, 50, 64, True, "float16"), DEVICE)
    o, lse = _check(q, k, v, True)
    assert torch.all(o[:, :, :650] == 0) and torch.all(torch.isneginf(lse[:, :, :650]))
    assert torch.all(torch.isfinite(lse[:, :, 650:]))


@sm90
@gpu
@pytest.mark.parametrize("window", [(64, 0), (100, 30), (-1, 50), (200, -1), (0, 0)])
@pytest.mark.parametrize("causal", [False, True])
def test_sliding_windows(window, causal):
    q, k, v, _ = make_inputs(Case(2, 2, 333, 600, 128, causal, "float16", seed=7), DEVICE)
    _check(q, k, v, causal, window=window)


@sm90
@gpu
@pytest.mark.parametrize("h, h_kv", [(8, 1), (8, 2), (6, 3)])
def test_gqa(h, h_kv):
    g = torch.Generator().manual_seed(h * 10 + h_kv)
    q = torch.randn(2, h, 257, 64, generator=g).to(DEVICE, torch.bfloat16)
    k, v = (torch.randn(2, h_kv, 513, 64, generator=g).to(DEVICE, torch.bfloat16)
            for _ in range(2))
    _check(q, k, v, True)
    _check(q, k, v, False, window=(128, 16))


@sm90
@gpu
def test_strided_views_without_copy():
    # (batch, seq, heads, dim) storage seen as (batch, heads, seq, dim), and padded buffers
    g = torch.Generator().manual_seed(5)
    qs, ks, vs = (torch.randn(2, 300, 4, 128, generator=g).to(DEVICE, torch.float16)
                  for _ in range(3))
    q, k, v = (t.transpose(1, 2) for t in (qs, ks, vs))
    assert not q.is_contiguous() and gf.gluon_supported(q, k, v, True)
    o, lse = _check(q, k, v, True)
    o_c, lse_c = gf.gluon_forward(*(t.contiguous() for t in (q, k, v)), True, 128**-0.5)
    torch.testing.assert_close(o, o_c, atol=2e-3, rtol=0)  # another layout: rounding only
    torch.testing.assert_close(lse, lse_c, atol=1e-5, rtol=0)
    # a view inside a NaN-filled buffer: any read past a row or past N turns O into NaN
    qp, kp, vp = (_poisoned(t.contiguous()) for t in (q, k, v))
    o_p, lse_p = gf.gluon_forward(qp, kp, vp, True, 128**-0.5)
    assert torch.isfinite(o_p).all() and torch.isfinite(lse_p).all()


@sm90
@gpu
@pytest.mark.parametrize("sm_scale", [-0.3, 0.0, 2.0])
def test_scale_sign_and_size(sm_scale):
    q, k, v, _ = make_inputs(Case(1, 2, 200, 300, 64, False, "float16", seed=11), DEVICE)
    _check(q, k, v, False, scale=sm_scale)
    _check(q, k, v, True, scale=sm_scale)


@sm90
@gpu
@pytest.mark.parametrize("switches", [dict(pingpong=False), dict(rescale_threshold=8.0),
                                      dict(poly_per_8=2), dict(poly_per_8=8, poly_degree=4),
                                      dict(rescale_threshold=8.0, poly_per_8=1),
                                      dict(stages=3), dict(persistent=True),
                                      dict(pack_p=False), dict(consumers=3),
                                      dict(consumers=3, persistent=True),
                                      dict(consumers=3, block_n=64, stages=4),
                                      dict(open_left=True),
                                      dict(consumers=3, open_left=True),
                                      dict(consumers=3, open_left=True, persistent=True),
                                      dict(named_turn=True),
                                      dict(named_turn=True, persistent=True),
                                      dict(consumers=3, open_left=True, persistent=True,
                                           named_turn=True)],
                         ids=str)
@pytest.mark.parametrize("d", [64, 128])
def test_variants(switches, d):
    """Every switch stays within the accuracy rule; the software exponential gets an allowance
    of its polynomial's largest relative error (on P, hence on l, O and lse)."""
    extra = exp2_relative_error(switches.get("poly_degree", 3)) if "poly_per_8" in switches else 0
    for causal in (False, True):
        case = Case(2, 2, 1000, 1000, d, causal, "bfloat16", seed=d + causal)
        q, k, v, _ = make_inputs(case, DEVICE)
        _check(q, k, v, causal, extra=extra, **switches)


@sm90
@gpu
@pytest.mark.parametrize("consumers", [2, 3])
@pytest.mark.parametrize("n_q,n_k", [(1000, 777), (300, 1000), (1, 600), (17, 1000), (600, 2)])
def test_open_left_edge_hides_no_key(n_q, n_k, consumers):
    """LEFT = N_Q + N_K with a left edge compiled in: every mask shows what it did without."""
    g = torch.Generator().manual_seed(n_q + n_k)
    q = torch.randn(2, 4, n_q, 64, generator=g).to(DEVICE, torch.bfloat16)
    k, v = (torch.randn(2, 2, n_k, 64, generator=g).to(DEVICE, torch.bfloat16)
            for _ in range(2))
    for causal, window in ((True, (-1, -1)), (False, (-1, -1)), (False, (-1, 50)),
                           (True, (-1, 300))):
        _check(q, k, v, causal, window=window, consumers=consumers, open_left=True)


@sm90
@gpu
@pytest.mark.parametrize("causal", [False, True])
def test_persistent_programs_take_several_tiles(causal):
    # 8 query blocks x 64 heads = 512 work tiles over at most 132 programs: the ring, the turn
    # barriers and Q's empty barrier run on across tiles of different lengths
    g = torch.Generator().manual_seed(17)
    q = torch.randn(4, 16, 1000, 128, generator=g).to(DEVICE, torch.float16)
    k, v = (torch.randn(4, 4, 777, 128, generator=g).to(DEVICE, torch.float16)
            for _ in range(2))
    o, lse = _check(q, k, v, causal, persistent=True)
    o1, lse1 = gf.gluon_forward(q, k, v, causal, 128**-0.5)  # one tile per program
    torch.testing.assert_close(o, o1, atol=4e-3, rtol=0)  # another compiled kernel: rounding
    torch.testing.assert_close(lse, lse1, atol=1e-5, rtol=0)


@sm90
@gpu
def test_conditional_rescaling_matches_always_rescaling():
    # scores that grow along the keys: the running max moves at almost every block
    q, k, v, _ = make_inputs(Case(1, 2, 512, 2048, 128, False, "float16", seed=13), DEVICE)
    ramp = torch.linspace(0, 3, 2048, device=DEVICE, dtype=torch.float16)[None, None, :, None]
    k = (k + ramp * q.mean(dim=2, keepdim=True)).to(torch.float16)
    o0, lse0 = gf.gluon_forward(q, k, v, False, 0.125)
    o8, lse8 = gf.gluon_forward(q, k, v, False, 0.125, rescale_threshold=8.0)
    torch.testing.assert_close(o8, o0, atol=2e-3, rtol=0)
    torch.testing.assert_close(lse8, lse0, atol=1e-5, rtol=1e-6)


@sm90
@gpu
def test_supported_says_no_to_what_it_cannot_run():
    q = torch.zeros(1, 2, 64, 128, device=DEVICE, dtype=torch.float16)
    assert gf.gluon_supported(q, q, q, True)
    assert not gf.gluon_supported(q.float(), q.float(), q.float(), True)  # fp32
    q96 = torch.zeros(1, 2, 64, 96, device=DEVICE, dtype=torch.float16)
    assert not gf.gluon_supported(q96, q96, q96, False)  # head_dim 96
    qt = torch.zeros(1, 2, 128, 64, device=DEVICE, dtype=torch.float16).transpose(2, 3)
    assert not gf.gluon_supported(qt, qt, qt, False)  # head_dim not unit-stride
    k3 = torch.zeros(1, 3, 64, 128, device=DEVICE, dtype=torch.float16)
    assert not gf.gluon_supported(q, k3, k3, False)  # 2 query heads over 3 kv heads
    assert not gf.gluon_supported(q, q, q, False, window=(-2, 0))
    assert not gf.gluon_supported(q[:, :, :0], q, q, False)  # empty
    with pytest.raises(ValueError, match="not supported"):
        gf.gluon_forward(q96, q96, q96, False, 0.1)


@sm90
@gpu
def test_deterministic():
    q, k, v, _ = make_inputs(Case(2, 2, 1000, 1000, 128, True, "bfloat16"), DEVICE)
    a = gf.gluon_forward(q, k, v, True, 0.1)
    b = gf.gluon_forward(q, k, v, True, 0.1)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])  # same code, same inputs


# ---------------------------------------------------------------- the H200 probe script


def _probe():
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "scripts" / "probe_gluon.py"
    spec = importlib.util.spec_from_file_location("probe_gluon", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_probe_variants_are_valid_kernels():
    probe = _probe()
    for name in probe.VARIANTS:
        for d in probe.VARIANT_DIMS.get(name, (64, 128)):
            constants = gf.kernel_constants(d, True, **probe.switches_for(name, d))
            block_n, stages = constants["BLOCK_N"], constants["STAGES"]
            rows = constants["NUM_WG"] * gf.WG_M
            assert 2 * (rows * d + stages * 2 * block_n * d) <= 227 * 1024, (name, d)
    assert probe.VARIANT_DIMS.keys() <= probe.VARIANTS.keys()
    assert probe.switches_for("stages_alt", 128)["stages"] != gf.tile_config(128)[1]


def test_probe_table_prints_ratios(capsys):
    rows = [dict(dtype="float16", d=128, n=4096, causal=False, provider=p, tflops=t)
            for p, t in (("cudnn", 500.0), ("triton", 450.0), ("gluon", 550.0), ("poly1", 560.0))]
    _probe().table(rows)
    out = capsys.readouterr().out
    assert "1.10x" in out and "560" in out


def test_probe_refuses_zero_rounds():
    script = Path(__file__).resolve().parents[1] / "scripts" / "probe_gluon.py"
    out = subprocess.run([sys.executable, str(script), "--rounds", "0"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 2 and "--rounds must be at least 1" in out.stderr


@sm90
@gpu
@pytest.mark.parametrize("d, causal, switches", [(64, False, dict(consumers=3, open_left=True,
                                                                   persistent=True)),
                                                  (128, True, {})])
def test_a_repeated_launch_takes_the_compiled_kernel_and_gives_the_same_bits(d, causal,
                                                                             switches):
    """After the first call of a shape the kernel is launched through the compiled kernel's
    own launcher (fastpath): the same code, so the same bits; a new alignment goes back to
    Triton's launch."""
    from flashtext.kernels import fastpath

    q, k, v, _ = make_inputs(Case(2, 4, 300, 300, d, causal, "float16"), DEVICE)
    fastpath.COMPILED.clear()
    first = gf.launch(q, k, v, causal, 0.125, **switches)
    entries = [key for key in fastpath.COMPILED if key[0][0] is gf._attn_fwd_ws]
    assert len(entries) == 1
    again = gf.launch(q, k, v, causal, 0.125, **switches)
    assert again[2] is first[2]  # the compiled kernel of the first call
    assert torch.equal(again[0], first[0]) and torch.equal(again[1], first[1])
    _check(q, k, v, causal, **switches)  # the fast path, held to the accuracy rule


@pytest.mark.skipif(not gf.HAVE_GLUON, reason="this Triton has no Gluon")
def test_descriptor_layouts_are_worked_out_once_per_tile_shape_and_dtype():
    """A launch builds four descriptors (dK/dV seven); each one's shared-memory layout is Gluon's
    default for its tile, looked up after the first, never another tile's or dtype's."""
    from triton.experimental.gluon import language as gl

    gf._shared_layout.cache_clear()
    q = torch.empty(2, 4, 300, 64, dtype=torch.float16)
    first, again = gf._descriptor(q, 64), gf._descriptor(q[:1], 64)
    assert again.layout is first.layout and gf._shared_layout.cache_info().hits == 1
    assert first.layout == gl.NVMMASharedLayout.get_default_for([1, 1, 64, 64], gl.float16)
    other = [gf._descriptor(q, 128).layout, gf._descriptor(q.to(torch.bfloat16), 64).layout,
             gf._descriptor(torch.empty(2, 4, 300, 128, dtype=torch.float16), 64).layout]
    assert gf._shared_layout.cache_info().misses == 4
    for layout, (block, dtype) in zip(other, (([1, 1, 128, 64], gl.float16),
                                              ([1, 1, 64, 64], gl.bfloat16),
                                              ([1, 1, 64, 128], gl.float16)), strict=True):
        assert layout == gl.NVMMASharedLayout.get_default_for(block, dtype)
