"""The Gluon FA3-style dK/dV backward (flashtext.kernels.gluon_backward).

It runs only on an sm_90 GPU (Gluon has no interpreter). The GPU tests compare dK and dV with
the float64 reference under the accuracy rule of ``flashtext.kernels.accuracy`` (at most twice
PyTorch's error in the same dtype, plus the documented allowances); the CPU tests check what a
CPU can: the tile plan against the mask, input validation, and that the kernel compiles for
sm_90 to the instructions FA3 is made of.
"""

import json
import math
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from flashtext import reference
from flashtext.kernels import gluon_backward as gb
from flashtext.kernels.accuracy import (
    Case,
    Errors,
    cancellation_scale,
    make_inputs,
    torch_attention,
)
from tests.gluon_watchdog import SM90, gluon_watchdog, sm90  # noqa: F401 (an autouse fixture)
from tests.kernel_helpers import (
    DEVICE,
    _np,
    _poisoned,
    assert_has_gqa_and_windows,
    gpu,
    gpu_model_sweep,
)

# ---------------------------------------------------------------- CPU: plan, validation


def test_tile_config_fits_shared_memory_and_registers():
    for d in gb.HEAD_DIMS:
        block_m, stages = gb.tile_config(d)
        assert gb.shared_memory_bytes(d, block_m, stages) <= 227 * 1024
        # dQ fused in: at d = 128 (160 KB of K, V and three Q / dO stages) 64 KB more: 224 KB
        fused = gb.shared_memory_bytes(d, block_m, stages, fuse_dq=True)
        assert fused - gb.shared_memory_bytes(d, block_m, stages) == \
            2 * 2 * block_m * 128 + 2 * 4 * 64 * 64
        assert fused <= 227 * 1024
        # dK, dV (64 x d) and S^T, dP^T (64 x BLOCK_M) fp32 accumulators per consumer thread
        assert (2 * 64 * d + 2 * 64 * block_m) // 128 <= 240 - 32
    for d in (96, 256):  # 256: dK and dV alone would need 256 of a consumer's 240 registers
        with pytest.raises(ValueError, match="head_dim"):
            gb.tile_config(d)


def test_kernel_constants():
    c = gb.kernel_constants(128, causal=True, window=(64, -1))
    assert (c["HAS_LEFT"], c["HAS_RIGHT"], c["HEAD_DIM"]) == (True, True, 128)
    c = gb.kernel_constants(64, False, block_m=128, stages=2)
    assert (c["HAS_LEFT"], c["HAS_RIGHT"], c["BLOCK_M"], c["STAGES"]) == (False, False, 128, 2)
    # a fused dQ splits a 64 x 64 share per warpgroup out of the tile's rows (d = 64, 128 rows)
    # or its columns (d = 128, 64 rows); other tiles have no such split
    for d in gb.HEAD_DIMS:
        assert gb.kernel_constants(d, True, fuse_dq=True)["FUSE_DQ"]
    for d, block_m in ((64, 64), (128, 128)):
        with pytest.raises(ValueError, match="fuse_dq needs block_m \\* head_dim"):
            gb.kernel_constants(d, True, block_m=block_m, fuse_dq=True)
    # deferring each tile's dQ share by a tile is a reordering of the fused dQ only
    assert gb.kernel_constants(64, True, fuse_dq=True, defer_dq=True)["DEFER_DQ"]
    assert not gb.kernel_constants(64, True, fuse_dq=True)["DEFER_DQ"]
    with pytest.raises(ValueError, match="defer_dq needs fuse_dq"):
        gb.kernel_constants(64, True, defer_dq=True)


def test_not_supported_off_sm90():
    q = torch.zeros(1, 2, 16, 64, dtype=torch.float16)
    assert not gb.gluon_dkdv_supported(q, q, q, False)
    lse = torch.zeros(1, 2, 16)
    with pytest.raises(ValueError, match="not supported"):
        gb.launch_dkdv(q, q, q, q, lse, lse, False, 0.125)


def test_out_must_be_a_pair_the_kernel_can_write():
    # launch_dkdv(out=) checks the pair before the kernel writes through it (pure Python: the
    # check runs on any machine; the GPU test of out= is in test_deterministic)
    k = torch.zeros(1, 2, 16, 64, dtype=torch.float16)
    good = (torch.empty_like(k), torch.empty_like(k))
    assert gb._checked_out(good, tuple(k.shape), k) is good
    # each wrong pair, and what the message must say of it
    bad = [((good[0],), "a (dk, dv) pair"),
           ((good[0], good[1][:, :1]), "dv must be a contiguous torch.float16 tensor of shape "
                                       "(1, 2, 16, 64) on cpu, got (1, 1, 16, 64)"),
           ((good[0].float(), good[1]), "dk must be a contiguous torch.float16 tensor of shape "
                                        "(1, 2, 16, 64) on cpu, got (1, 2, 16, 64) torch.float32"),
           ((good[0], None), "dv must be a contiguous torch.float16 tensor of shape "
                             "(1, 2, 16, 64) on cpu, got NoneType"),
           ((good[0], good[1].transpose(2, 3).contiguous().transpose(2, 3)), "contiguous=False")]
    for pair, says in bad:
        with pytest.raises(ValueError) as err:
            gb._checked_out(pair, tuple(k.shape), k)
        assert says in str(err.value), (says, str(err.value))


def test_dq_accum_must_be_an_fp32_buffer_shaped_like_q():
    # launch_dkdv(dq_accum=) checks the buffer before the copy engine adds into it
    q = torch.zeros(1, 2, 16, 64, dtype=torch.float16)
    good = torch.zeros(q.shape)
    assert gb._checked_dq_accum(good, q) is good
    shape = "dq_accum must be a contiguous torch.float32 tensor of shape (1, 2, 16, 64) on cpu"
    bad = [(good.half(), "got (1, 2, 16, 64) torch.float16"),
           (good[:, :1], "got (1, 1, 16, 64) torch.float32"),
           (good.transpose(2, 3).contiguous().transpose(2, 3), "contiguous=False"),
           (None, "got NoneType")]
    for buffer, says in bad:
        with pytest.raises(ValueError) as err:
            gb._checked_dq_accum(buffer, q)
        assert shape in str(err.value) and says in str(err.value), str(err.value)


def _mask(n_q, n_k, causal, window):
    return reference.window_mask(n_q, n_k, (window[0], 0 if causal else window[1]))


WINDOWS = [(-1, -1), (0, 0), (37, 0), (100, 30), (-1, 50), (200, -1), (0, -1), (5, 300)]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window", WINDOWS)
def test_dkdv_tile_plan_visits_every_seen_query_tile_and_masks_every_partial_one(causal,
                                                                               window):
    """For each program (128 keys): every query tile holding a row that sees one of its keys
    is visited, the first and last visited tiles hold such a row (no wasted tiles), and for
    each consumer warpgroup (64 keys) a tile is left unmasked only if each of its rows sees
    each of the warpgroup's keys (real rows and keys: padding rows read q = dO = 0 with
    lse = +inf, padding keys write rows nobody stores)."""
    # every diagonal offset N_k - N_q modulo both tile heights, plus short and lopsided shapes
    shapes = [(1, 1), (17, 1000), (1000, 17), (700, 300), (2, 600), (600, 2), (129, 129)]
    shapes += [(200, 200 + delta) for delta in range(-130, 131, 3)]
    for n_q, n_k in shapes:
        keep = _mask(n_q, n_k, causal, window)
        for block_m in (64, 128):
            for start_n in range(0, n_k, gb.BLOCK_N):
                lo, hi, masks = gb.dkdv_tile_plan(start_n, n_q, n_k, block_m, causal, window)
                where = (n_q, n_k, block_m, start_n)
                assert 0 <= lo <= hi <= -(-n_q // block_m), where
                seen = keep[:, start_n:start_n + gb.BLOCK_N]
                rows = np.nonzero(seen.any(axis=1))[0]
                if rows.size:
                    assert lo * block_m <= rows.min() and rows.max() < hi * block_m, where
                else:
                    assert lo == hi, where
                for i in {lo, hi - 1} if hi > lo else ():
                    assert seen[i * block_m:(i + 1) * block_m].any(), where
                for wg, (mask_below, mask_from) in enumerate(masks):
                    n0 = start_n + wg * gb.WG_N
                    wg_keys = keep[:, n0:min(n0 + gb.WG_N, n_k)]
                    for i in range(lo, hi):
                        start = i * block_m
                        masked = start < mask_below or start >= mask_from
                        block = wg_keys[start:start + block_m]
                        assert masked or block.size == 0 or block.all(), (*where, wg, i)


def test_dkdv_tile_plan_masks_nothing_without_a_mask():
    for n_q, n_k in ((1, 1), (1000, 17), (300, 700)):
        for start_n in range(0, n_k, gb.BLOCK_N):
            lo, hi, masks = gb.dkdv_tile_plan(start_n, n_q, n_k, 64, False)
            assert (lo, hi) == (0, -(-n_q // 64))
            for mask_below, mask_from in masks:
                assert all(mask_below <= i * 64 < mask_from for i in range(lo, hi))


def test_dkdv_tile_plan_is_the_kernels_arithmetic():
    """dkdv_tile_plan repeats the kernel's expressions; if one side changes, so must the
    other."""
    import inspect

    src = inspect.getsource(gb._block_coords.fn) + inspect.getsource(gb._dkdv_consumer.fn)
    for expr in ("lo_off = causal_offset - LEFT", "hi_off = causal_offset + RIGHT",
                 "last_key = gl.minimum(start_n + 128, N_K) - 1",
                 "lo_row = gl.maximum(start_n - hi_off, 0)",
                 "hi_row = gl.maximum(gl.minimum(N_Q, last_key - lo_off + 1), 0)",
                 "lo = lo_row // BLOCK_M", "hi = gl.maximum(gl.cdiv(hi_row, BLOCK_M), lo)",
                 "n0 = start_n + WG * 64", "mask_below = n0 + 63 - hi_off",
                 "mask_from = hi * BLOCK_M", "mask_from = n0 - BLOCK_M + 2 - lo_off",
                 "need_mask = (start_m < mask_below) | (start_m >= mask_from)"):
        assert expr in src, expr


def _emulate(q, k, v, do, causal, scale, window, block_m):
    """The kernel's loop in float64 NumPy: per program and warpgroup, the query tiles of
    :func:`dkdv_tile_plan` for each query head of the group, padding rows (q = dO = 0,
    lse = +inf, delta = 0) and padding keys (k = v = 0) as the copy engine delivers them, a
    mask only where the plan says so, dK and dV stored for real keys."""
    from flashtext.kernels.gluon_forward import _window_bounds

    z, h, n_q, d = q.shape
    h_kv, n_k = k.shape[1], k.shape[2]
    group = h // h_kv
    o, lse = reference.attention(q, k, v, causal=causal, scale=scale, return_lse=True,
                                 window=window)
    delta = np.sum(do * o, axis=-1)
    left, right = _window_bounds(causal, window)
    has_left, has_right = window[0] >= 0, causal or window[1] >= 0
    lo_off, hi_off = n_k - n_q - left, n_k - n_q + right
    rows_pad = -(-n_q // block_m) * block_m - n_q
    keys_pad = -(-n_k // gb.BLOCK_N) * gb.BLOCK_N - n_k

    def pad(a, extra, value=0.0):
        width = [(0, 0)] * a.ndim
        width[2] = (0, extra)
        return np.pad(a, width, constant_values=value)

    qp, dop = pad(q, rows_pad), pad(do, rows_pad)
    lse2 = pad(np.where(np.isneginf(lse), np.inf, lse), rows_pad, np.inf)
    deltap = pad(delta, rows_pad)
    kp, vp = pad(k, keys_pad), pad(v, keys_pad)
    dk, dv = np.zeros_like(kp), np.zeros_like(vp)
    for b in range(z):
        for hk in range(h_kv):
            for start_n in range(0, n_k, gb.BLOCK_N):
                lo, hi, masks = gb.dkdv_tile_plan(start_n, n_q, n_k, block_m, causal, window)
                for wg, (mask_below, mask_from) in enumerate(masks):
                    keys = np.arange(start_n + wg * gb.WG_N, start_n + (wg + 1) * gb.WG_N)
                    kk, vv = kp[b, hk, keys], vp[b, hk, keys]
                    for hq in range(hk * group, (hk + 1) * group):
                        for i in range(lo, hi):
                            rows = np.arange(i * block_m, (i + 1) * block_m)
                            qq, dd = qp[b, hq, rows], dop[b, hq, rows]
                            s_t = scale * (kk @ qq.T)
                            if i * block_m < mask_below or i * block_m >= mask_from:
                                seen = np.ones(s_t.shape, dtype=bool)
                                if has_right:
                                    seen &= keys[:, None] <= rows[None, :] + hi_off
                                if has_left:
                                    seen &= keys[:, None] >= rows[None, :] + lo_off
                                s_t = np.where(seen, s_t, -np.inf)
                            with np.errstate(over="ignore", invalid="ignore"):
                                p_t = np.exp(s_t - lse2[b, hq, rows][None, :])
                                ds_t = p_t * (vv @ dd.T - deltap[b, hq, rows][None, :])
                            dv[b, hk, keys] += p_t @ dd
                            dk[b, hk, keys] += scale * (ds_t @ qq)
    return dk[:, :, :n_k], dv[:, :, :n_k]


@pytest.mark.parametrize("n_q, n_k, h, h_kv, causal, window", [
    (1, 1, 2, 1, False, (-1, -1)), (70, 300, 2, 2, True, (-1, -1)),
    (300, 70, 4, 2, True, (-1, -1)), (200, 260, 2, 1, False, (40, 7)),
    (150, 400, 2, 2, False, (30, 0)), (129, 129, 2, 2, True, (20, -1)),
    (100, 200, 2, 2, False, (-1, 10))])
@pytest.mark.parametrize("block_m", [64, 128])
def test_the_plan_reproduces_the_gradients(n_q, n_k, h, h_kv, causal, window, block_m):
    """The kernel's loop emulated in float64 gives the reference dK and dV: skipped tiles hold
    nothing, unmasked tiles need no mask, padding rows and keys add nothing."""
    g = np.random.default_rng(n_q + n_k)
    q, do = (g.standard_normal((2, h, n_q, 16)) for _ in range(2))
    k, v = (g.standard_normal((2, h_kv, n_k, 16)) for _ in range(2))
    dk, dv = _emulate(q, k, v, do, causal, 0.3, window, block_m)
    _, dk_ref, dv_ref = reference.attention_backward(q, k, v, do, causal=causal, scale=0.3,
                                                     window=window)
    np.testing.assert_allclose(dk, dk_ref, atol=1e-10, rtol=1e-10)
    np.testing.assert_allclose(dv, dv_ref, atol=1e-10, rtol=1e-10)


_COMPILE = textwrap.dedent("""
    import json, torch
    from flashtext.bench.static_compile import sass_of
    from flashtext.kernels.gluon_backward import compile_sm90_dkdv
    out = {}
    for dtype in (torch.float16, torch.bfloat16):
        for d in (64, 128):
            for causal in (False, True):
                window = (200, -1) if causal and d == 128 else (-1, -1)
                c = compile_sm90_dkdv(d, dtype, causal, window)
                sass = sass_of(c.asm["cubin"])
                counts = {k: sass.count(k) for k in ("HGMMA", "USETMAXREG", "HMMA",
                                                     "UTMALDG", "UTMASTG", "MUFU.EX2")} \\
                    if sass is not None else None
                ptx = c.asm["ptx"]
                out[f"{dtype} {d} {causal}"] = dict(sass=counts, shared=c.metadata.shared,
                    wgmma=ptx.count("wgmma.mma_async"),
                    inc240=ptx.count("setmaxnreg.inc.sync.aligned.u32 \\t240"))
    for d, defer in ((64, False), (128, False), (64, True)):  # dQ fused in (deferred a tile)
        c = compile_sm90_dkdv(d, torch.float16, True, fuse_dq=True, defer_dq=defer)
        sass = sass_of(c.asm["cubin"])
        name = f"{'deferred' if defer else 'fused'} {d}"
        out[name] = dict(shared=c.metadata.shared, wgmma=c.asm["ptx"].count("wgmma.mma_async"),
                         sass=None if sass is None else {
                             k: sass.count(k) for k in ("HGMMA", "UTMAREDG", "RED.")})
    print(json.dumps(out))
""")


@pytest.mark.skipif(not gb.HAVE_GLUON, reason="this Triton has no Gluon")
def test_compiles_for_sm90_without_a_gpu():
    """Triton compiles (and its bundled ptxas assembles) every variant for sm_90 on any
    machine; in a fresh process, because the interpreter, on here, would take over."""
    env = dict(os.environ, TRITON_INTERPRET="0")
    out = subprocess.run([sys.executable, "-c", _COMPILE], env=env, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    results = json.loads(out.stdout.strip().splitlines()[-1])
    fused = {name: results.pop(name) for name in ("fused 64", "fused 128")}
    deferred = results.pop("deferred 64")
    # the deferred share is one more copy of the dQ GEMMs (in the loop and after it)
    assert deferred["wgmma"] == fused["fused 64"]["wgmma"] + 2 * 2 * 64 // 16
    assert deferred["shared"] == fused["fused 64"]["shared"]
    if deferred["sass"] is not None:
        assert deferred["sass"]["UTMAREDG"] >= 2 and deferred["sass"]["RED."] == 0
    assert len(results) == 8
    for name, r in fused.items():
        d = int(name.split()[1])
        block_m, _ = gb.tile_config(d)
        # per consumer, beside the four above: its 64 x 64 share of dQ, over 2 halves of keys
        assert r["wgmma"] == 2 * (2 * d // 16 + 2 * block_m // 16 + 2 * 64 // 16), name
        assert r["shared"] <= 227 * 1024, name
        if r["sass"] is not None:  # added by the copy engine (reduce-add), not by atomics
            assert r["sass"]["UTMAREDG"] >= 1 and r["sass"]["RED."] == 0, name
            assert r["sass"]["HGMMA"] == r["wgmma"], name
    for name, r in results.items():
        d = int(name.split()[1])
        block_m, _ = gb.tile_config(d)
        # per consumer: S^T and dP^T (d / 16 k-steps each), dV and dK (BLOCK_M / 16 each)
        assert r["wgmma"] == 2 * (2 * d // 16 + 2 * block_m // 16), name
        assert r["inc240"] == 2, name  # both consumers get 240 registers
        assert r["shared"] <= 227 * 1024, name
        if r["sass"] is None:
            pytest.skip("no cuobjdump to read the SASS with")
        sass = r["sass"]
        assert sass["HGMMA"] == r["wgmma"] and sass["HMMA"] == 0, name
        assert sass["USETMAXREG"] > 0 and sass["MUFU.EX2"] > 0, name
        assert sass["UTMALDG"] >= 4 and sass["UTMASTG"] >= 2, name  # Q, dO, K, V; dK, dV


# ---------------------------------------------------------------- GPU: against float64


def _check(q, k, v, do, causal, scale=None, window=(-1, -1), fused=False):
    """Run the kernel (lse from the forward, delta from the backward's preprocessing) and hold
    dK and dV to the accuracy rule, and with ``fused`` the dQ it adds into a zeroed fp32
    buffer as well. Returns (dk, dv)."""
    from flashtext.kernels.api import attention_forward
    from flashtext.kernels.backward import preprocess

    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    o, lse = attention_forward(q, k, v, causal=causal, sm_scale=scale, window_size=window)
    delta = preprocess(o, do)
    assert gb.gluon_dkdv_supported(q, k, v, causal, window)
    dq_accum = torch.zeros(q.shape, dtype=torch.float32, device=q.device) if fused else None
    dk, dv, _ = gb.launch_dkdv(q, k, v, do, lse, delta, causal, scale, window,
                               dq_accum=dq_accum)
    torch.cuda.synchronize()
    _, lse_ref = reference.attention(q, k, v, causal=causal, scale=scale, return_lse=True,
                                     window=window)
    refs = dict(zip(("dq", "dk", "dv"), reference.attention_backward(
        q, k, v, do, causal=causal, scale=scale, window=window), strict=True))
    leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    o_pt, _ = torch_attention(*leaves, causal=causal, sm_scale=scale, window=window)
    theirs = dict(zip(("dq", "dk", "dv"), torch.autograd.grad(o_pt, leaves, do), strict=True))
    # dQ as the backward hands it on: the fp32 sum rounded to q's dtype
    got = {"dk": dk, "dv": dv, **({"dq": dq_accum.to(q.dtype)} if fused else {})}
    ours = {name: _max_abs(_np(t), refs[name]) for name, t in got.items()}
    theirs = {name: _max_abs(_np(theirs[name]), refs[name]) for name in got}
    finite = lse_ref[np.isfinite(lse_ref)]
    sizes = {"lse": float(np.max(np.abs(finite), initial=0.0))}
    sizes.update({name: float(np.max(np.abs(refs[name]), initial=0.0)) for name in got})
    sizes.update(cancellation_scale(q, k, v, do, causal, scale, window))
    err = Errors("gluon dkdv" + " + dq" * fused, q.dtype, ours, theirs, sizes, approx_exp=True)
    assert not err.failures(), err.failures()
    return dk, dv


def _max_abs(a, b):
    return float(np.max(np.abs(a - b), initial=0.0)) if np.isfinite(a).all() else math.inf


@sm90
@gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("d", gb.HEAD_DIMS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n_q, n_k", [(1, 1), (17, 1000), (1000, 17), (129, 129),
                                      (300, 700), (256, 256)])
@pytest.mark.parametrize("fused", [False, True], ids=["dkdv", "dkdv+dq"])
def test_ragged_lengths(dtype, d, causal, n_q, n_k, fused):
    case = Case(2, 3, n_q, n_k, d, causal, dtype, seed=n_q + n_k + d)
    _check(*make_inputs(case, DEVICE), causal, fused=fused)


MODEL_SWEEP = gpu_model_sweep(gb.HEAD_DIMS)


def test_model_sweep_has_gqa_and_windows():
    assert_has_gqa_and_windows(MODEL_SWEEP)


@sm90
@gpu
@pytest.mark.parametrize("case", MODEL_SWEEP, ids=Case.label)
@pytest.mark.parametrize("fused", [False, True], ids=["dkdv", "dkdv+dq"])
def test_model_sweep(case, fused):
    """The real-model cases (grouped K/V heads, sliding windows) through the dK/dV kernel."""
    _check(*make_inputs(case, DEVICE), case.causal, window=case.window, fused=fused)


@sm90
@gpu
@pytest.mark.parametrize("window", [(64, 0), (100, 30), (-1, 50), (200, -1), (0, 0)])
@pytest.mark.parametrize("causal", [False, True])
def test_sliding_windows(window, causal):
    case = Case(2, 2, 333, 600, 128, causal, "float16", seed=7)
    q, k, v, do = make_inputs(case, DEVICE)
    _check(q, k, v, do, causal, window=window)
    _check(q, k, v, do, causal, window=window, fused=True)


@sm90
@gpu
@pytest.mark.parametrize("h, h_kv", [(8, 1), (8, 2), (6, 3)])
def test_gqa_sums_over_the_group(h, h_kv):
    case = Case(2, h, 257, 513, 64, True, "bfloat16", seed=h * 10 + h_kv, heads_kv=h_kv)
    q, k, v, do = make_inputs(case, DEVICE)
    for fused in (False, True):  # dQ: each query head's own, never summed over the group
        _check(q, k, v, do, True, fused=fused)
        _check(q, k, v, do, False, window=(128, 16), fused=fused)


@sm90
@gpu
def test_keys_no_query_sees_get_zero_gradients():
    # a window leaves the first keys unseen when N_k > N_q + left: whole key blocks visit no
    # query tile and must still write dK = dV = 0
    q, k, v, do = make_inputs(Case(1, 2, 100, 700, 64, False, "float16", seed=2), DEVICE)
    for fused in (False, True):
        dk, dv = _check(q, k, v, do, False, window=(50, 0), fused=fused)
        assert torch.all(dk[:, :, :550] == 0) and torch.all(dv[:, :, :550] == 0)


@sm90
@gpu
def test_queries_that_see_no_key():
    # causal with N_q > N_k: the first N_q - N_k queries see nothing (lse = -inf)
    q, k, v, do = make_inputs(Case(1, 2, 700, 50, 128, True, "float16", seed=4), DEVICE)
    _check(q, k, v, do, True)
    _check(q, k, v, do, True, fused=True)  # and their dQ rows stay 0


@sm90
@gpu
@pytest.mark.parametrize("causal", [False, True])
def test_long_sequences_wrap_the_ring_many_times(causal):
    # 32 query tiles x 2 query heads per program over a ring of 3 slots; float64 reference
    # of moderate size (its backward holds several N_q x N_k arrays per head)
    case = Case(1, 4, 2048, 2048, 128, causal, "bfloat16", seed=3, heads_kv=2)
    q, k, v, do = make_inputs(case, DEVICE)
    _check(q, k, v, do, causal)
    _check(q, k, v, do, causal, fused=True)


@sm90
@gpu
@pytest.mark.parametrize("sm_scale", [-0.3, 0.0, 2.0])
def test_scale_sign_and_size(sm_scale):
    q, k, v, do = make_inputs(Case(1, 2, 200, 300, 64, False, "float16", seed=11), DEVICE)
    _check(q, k, v, do, False, scale=sm_scale)
    _check(q, k, v, do, True, scale=sm_scale)
    _check(q, k, v, do, False, scale=sm_scale, fused=True)  # dQ carries sm_scale too


@sm90
@gpu
@pytest.mark.parametrize("overrides", [dict(stages=3), dict(block_m=64, stages=4)], ids=str)
def test_tile_variants_agree(overrides):
    q, k, v, do = make_inputs(Case(2, 2, 1000, 777, 64, True, "bfloat16", seed=5), DEVICE)
    from flashtext.kernels.api import attention_forward
    from flashtext.kernels.backward import preprocess

    o, lse = attention_forward(q, k, v, causal=True, sm_scale=0.125)
    delta = preprocess(o, do)
    dk0, dv0, _ = gb.launch_dkdv(q, k, v, do, lse, delta, True, 0.125)
    dk1, dv1, _ = gb.launch_dkdv(q, k, v, do, lse, delta, True, 0.125, **overrides)
    # another compiled kernel (another ring depth or tile height): rounding only
    torch.testing.assert_close(dk1, dk0, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(dv1, dv0, atol=2e-2, rtol=2e-2)
    _check(q, k, v, do, True, scale=0.125)  # and the default variant keeps the rule


@sm90
@gpu
def test_strided_views_and_poisoned_padding():
    # (batch, seq, heads, dim) storage seen as (batch, heads, seq, dim), and views inside
    # NaN-filled buffers: any read past a row or past N turns dK / dV into NaN
    g = torch.Generator().manual_seed(5)
    qs, ks, vs, dos = (torch.randn(2, 300, 4, 128, generator=g).to(DEVICE, torch.float16)
                       for _ in range(4))
    q, k, v, do = (t.transpose(1, 2) for t in (qs, ks, vs, dos))
    assert not q.is_contiguous() and gb.gluon_dkdv_supported(q, k, v, True)
    dk, dv = _check(q, k, v, do, True)
    _check(q, k, v, do, True, fused=True)
    qp, kp, vp, dop = (_poisoned(t.contiguous()) for t in (q, k, v, do))
    from flashtext.kernels.api import attention_forward
    from flashtext.kernels.backward import preprocess

    o, lse = attention_forward(q, k, v, causal=True, sm_scale=128**-0.5)
    dq_p = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    dk_p, dv_p, _ = gb.launch_dkdv(qp, kp, vp, dop, lse, preprocess(o, do), True, 128**-0.5,
                                   dq_accum=dq_p)
    assert torch.isfinite(dk_p).all() and torch.isfinite(dv_p).all()
    assert torch.isfinite(dq_p).all()


@sm90
@gpu
def test_deterministic():
    q, k, v, do = make_inputs(Case(2, 4, 1000, 1000, 128, True, "bfloat16", heads_kv=2),
                              DEVICE)
    from flashtext.kernels.api import attention_forward
    from flashtext.kernels.backward import preprocess

    o, lse = attention_forward(q, k, v, causal=True, sm_scale=0.1)
    delta = preprocess(o, do)
    a = gb.launch_dkdv(q, k, v, do, lse, delta, True, 0.1)
    b = gb.launch_dkdv(q, k, v, do, lse, delta, True, 0.1)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])  # no atomics
    # out=: the same numbers, written into the caller's tensors
    out = (torch.full_like(k, float("nan")), torch.full_like(v, float("nan")))
    c = gb.launch_dkdv(q, k, v, do, lse, delta, True, 0.1, out=out)
    assert c[0] is out[0] and c[1] is out[1]
    assert torch.equal(c[0], a[0]) and torch.equal(c[1], a[1])
    for bad in ((out[0],), (out[0], out[1][:, :1]), (out[0].float(), out[1]),
                (out[0], out[1].transpose(2, 3).contiguous().transpose(2, 3))):
        with pytest.raises(ValueError, match="out"):
            gb.launch_dkdv(q, k, v, do, lse, delta, True, 0.1, out=bad)
    # with dQ fused in: dK and dV are still each program's own sums (the same bits every
    # run); dQ's shares are added in whatever order the copy engine takes them
    fused = [gb.launch_dkdv(q, k, v, do, lse, delta, True, 0.1, dq_accum=acc)
             for acc in (torch.zeros(q.shape, device=q.device) for _ in range(2))]
    assert all(torch.equal(f[0], fused[0][0]) and torch.equal(f[1], fused[0][1]) for f in fused)
    with pytest.raises(ValueError, match="dq_accum"):
        gb.launch_dkdv(q, k, v, do, lse, delta, True, 0.1, dq_accum=torch.zeros_like(q))


@sm90
@gpu
@pytest.mark.parametrize("d, causal", [(64, False), (128, False), (128, True)])
def test_fused_dq_is_right_on_every_run(d, causal):
    # dQ's shares meet in shared memory and leave through one staging tile per warpgroup, and
    # the last tile's share reads K halves that the warpgroups then overwrite with dK: a
    # missing wait anywhere there shows up as a wrong dQ on some runs, not on all
    from flashtext.kernels.api import attention_forward
    from flashtext.kernels.backward import backward

    q, k, v, do = make_inputs(Case(2, 8, 2048, 2048, d, causal, "bfloat16", seed=9), DEVICE)
    o, lse = attention_forward(q, k, v, causal=causal)
    scale = d ** -0.5
    want = backward(do, q, k, v, o, lse, causal, scale)[0]  # Triton's dQ pass
    tol = 4 * 2.0**-8 * float(want.abs().max())
    for run in range(10):
        dq = backward(do, q, k, v, o, lse, causal, scale, dkdv_kernel="gluon", fuse_dq=True)[0]
        assert float((dq - want).abs().max()) <= tol, run


@sm90
@gpu
@pytest.mark.parametrize("case", [Case(2, 8, 2048, 2048, 64, True, "bfloat16", seed=9),
                                  Case(1, 4, 333, 1000, 64, True, "float16", seed=3),
                                  Case(2, 8, 1500, 1500, 128, True, "float16", heads_kv=2,
                                       seed=4),
                                  Case(1, 4, 700, 700, 64, False, "bfloat16", seed=5)],
                         ids=["d64-causal", "d64-ragged", "d128-gqa", "d64-full"])
def test_deferred_dq_matches_the_triton_pass(case):
    # each tile's dQ share one tile later: the same sums, in a different order; the last
    # tile's share comes after the loop, and must still land before dK overwrites K
    from flashtext.kernels.api import attention_forward
    from flashtext.kernels.backward import backward, preprocess

    q, k, v, do = make_inputs(case, DEVICE)
    o, lse = attention_forward(q, k, v, causal=case.causal)
    scale = case.head_dim ** -0.5
    want_dq, want_dk, want_dv = backward(do, q, k, v, o, lse, case.causal, scale)
    for run in range(5):
        acc = torch.zeros(q.shape, dtype=torch.float32, device=DEVICE)
        dk, dv, _ = gb.launch_dkdv(q, k, v, do, lse, preprocess(o, do), case.causal, scale,
                                   dq_accum=acc, defer_dq=True)
        for name, got, want in (("dq", acc, want_dq), ("dk", dk, want_dk), ("dv", dv, want_dv)):
            err = float((got.float() - want.float()).abs().max())
            assert err <= 4 * 2.0**-8 * float(want.abs().max()), (run, name, err)


@sm90
@gpu
def test_supported_says_no_to_what_it_cannot_run():
    q = torch.zeros(1, 2, 64, 128, device=DEVICE, dtype=torch.float16)
    assert gb.gluon_dkdv_supported(q, q, q, True)
    q256 = torch.zeros(1, 2, 64, 256, device=DEVICE, dtype=torch.float16)
    assert not gb.gluon_dkdv_supported(q256, q256, q256, False)  # head_dim 256
    assert not gb.gluon_dkdv_supported(q.float(), q.float(), q.float(), True)  # fp32
    k3 = torch.zeros(1, 3, 64, 128, device=DEVICE, dtype=torch.float16)
    assert not gb.gluon_dkdv_supported(q, k3, k3, False)  # 2 query heads over 3 kv heads
    assert not gb.gluon_dkdv_supported(q, q, q, False, window=(-2, 0))
    assert not gb.gluon_dkdv_supported(q[:, :, :0], q, q, False)  # empty
    lse = torch.zeros(1, 2, 64, device=DEVICE)
    with pytest.raises(ValueError, match="lse"):
        gb.launch_dkdv(q, q, q, q, lse[:, :, :3], lse, False, 0.1)


@sm90
@gpu
def test_the_gluon_backward_holds_no_more_memory_than_the_triton_one():
    # the backward hands its own (dK, dV) to the Gluon kernel (launch_dkdv(out=)), so no second
    # pair is alive: the peak is the same as the all-Triton backward's; with dQ fused in, it
    # holds the fp32 buffer dQ is added into as well, and nothing else
    from flashtext.kernels.api import attention_forward
    from flashtext.kernels.backward import backward

    q, k, v, do = make_inputs(Case(2, 8, 2048, 2048, 128, True, "float16", seed=5), DEVICE)
    o, lse = attention_forward(q, k, v, causal=True)
    scale = q.shape[-1] ** -0.5
    runs = {"triton": dict(dkdv_kernel="triton"), "gluon": dict(dkdv_kernel="gluon"),
            "fused": dict(dkdv_kernel="gluon", fuse_dq=True)}
    for how in runs.values():  # compile all first: no peak holds one-time work
        backward(do, q, k, v, o, lse, True, scale, **how)
    peaks = {}
    for name, how in runs.items():
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        grads = backward(do, q, k, v, o, lse, True, scale, **how)
        torch.cuda.synchronize()
        peaks[name] = torch.cuda.max_memory_allocated() - base
        del grads
    assert peaks["gluon"] <= peaks["triton"], peaks
    assert peaks["fused"] <= peaks["triton"] + 4 * q.numel(), peaks


@sm90
@gpu
@pytest.mark.parametrize("fused", [False, True])
def test_a_repeated_launch_takes_the_compiled_kernel_and_gives_the_same_bits(fused):
    """After the first call of a shape dK/dV is launched through the compiled kernel's own
    launcher (fastpath): the same code, so the same bits (dQ is added by the copy engine in
    any order, so it is held to the accuracy rule instead, by _check)."""
    from flashtext.kernels import fastpath
    from flashtext.kernels.api import attention_forward
    from flashtext.kernels.backward import preprocess

    q, k, v, do = make_inputs(Case(2, 4, 300, 300, 128, True, "float16"), DEVICE)
    o, lse = attention_forward(q, k, v, causal=True, sm_scale=0.125)
    delta = preprocess(o, do)
    fastpath.COMPILED.clear()
    runs = []
    for _ in range(2):
        dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device) if fused else None
        runs.append(gb.launch_dkdv(q, k, v, do, lse, delta, True, 0.125, dq_accum=dq))
    assert [key for key in fastpath.COMPILED if key[0][0] is gb._attn_bwd_dkdv_ws]
    assert runs[1][2] is runs[0][2]
    assert torch.equal(runs[0][0], runs[1][0]) and torch.equal(runs[0][1], runs[1][1])
    _check(q, k, v, do, True, 0.125, fused=fused)
