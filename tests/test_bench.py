"""The benchmark harness (flashtext.bench): FLOP and byte accounting, timing statistics, the
float64 check, error handling per provider, ratios against the targets, the JSON it writes,
the figures, and the command line. Everything runs on the CPU in seconds (quick shapes)."""

import json
import math
import time

import numpy as np
import pytest
import torch

from flashtext import recorded
from flashtext import reference as ref
from flashtext.bench import __main__ as cli
from flashtext.bench import ceilings, consistency, core, providers, report, sweep

ON_GPU = torch.cuda.is_available()

TINY = dict(dtypes=("float16",), ds=(64,), causals=(False,), ns=(64,), tokens=128, hidden=64,
            warmup_ms=0.0, rep_ms=1.0, budget_s=None, quick=True)


# ------------------------------------------------------------------------------ accounting

def test_flops_follow_the_standard_count():
    cfg = core.Config("float16", 128, False, 4096, 4, 16)
    assert cfg.flops("fwd") == 4 * 4 * 16 * 4096**2 * 128
    assert cfg.flops("fwd_bwd") == 3.5 * cfg.flops("fwd")
    causal = core.Config("float16", 128, True, 4096, 4, 16)
    assert causal.flops("fwd") == cfg.flops("fwd") / 2
    assert causal.flops("fwd_bwd") == 3.5 * 0.5 * cfg.flops("fwd")


def test_tflops_from_a_timing():
    # 5.5e11 FLOPs in 1 ms is 550 TFLOP/s
    assert core.tflops(5.5e11, 1.0) == pytest.approx(550.0, rel=1e-12)
    assert core.tflops(1e12, 1000.0) == pytest.approx(1.0, rel=1e-12)
    with pytest.raises(ValueError, match="ms"):
        core.tflops(1e12, 0.0)


def test_min_bytes_are_the_compulsory_traffic():
    b, h, n, d = 4, 16, 4096, 128
    fwd = core.attention_min_bytes(b, h, n, d, 2, "fwd")
    assert fwd == 4 * b * h * n * d * 2  # Q, K, V read and O written, once each
    assert core.attention_min_bytes(b, h, n, d, 2, "bwd") == 2 * fwd
    assert core.attention_min_bytes(b, h, n, d, 2, "fwd_bwd") == 3 * fwd
    assert core.Config("bfloat16", d, True, n, b, h).min_bytes("fwd") == fwd  # mask: same bytes
    with pytest.raises(ValueError, match="mode"):
        core.attention_min_bytes(b, h, n, d, 2, "both")


def test_roofline_numbers_use_the_measured_ceilings():
    cfg = core.Config("float16", 128, False, 4096, 4, 16)
    rows = [sweep._row(cfg, "ours", "fwd", "ok", ms=1.0, tflops=0.0)]
    measured = {"matmul_flops": {"float16": 750e12}, "copy_bandwidth": 4.25e12}
    ceilings.add_roofline(rows, measured)
    r = rows[0]
    assert r["t_compute_ms"] == pytest.approx(cfg.flops("fwd") / 750e12 * 1e3)
    assert r["t_memory_ms"] == pytest.approx(cfg.min_bytes("fwd") / 4.25e12 * 1e3)
    assert r["bound"] == "compute" and r["t_compute_ms"] > 10 * r["t_memory_ms"]
    assert r["roof_fraction"] == pytest.approx(r["t_compute_ms"] / 1.0)
    skipped = [sweep._row(cfg, "ours", "fwd", "oom", "x")]
    ceilings.add_roofline(skipped, measured)
    assert "t_compute_ms" not in skipped[0]


# ------------------------------------------------------------------------------ settings

def test_settings_validate_and_order_the_sweep():
    s = core.Settings(dtypes=("fp16", "bf16"), ds=(128, 64), ns=(2048, 512))
    assert s.dtypes == ("float16", "bfloat16")
    cfgs = s.configs()
    assert len(cfgs) == 2 * 2 * 2 * 2
    assert [c.n for c in cfgs[:2]] == [512, 2048]  # N ascending inside a group
    assert cfgs[0] == core.Config("float16", 128, False, 512, 32, 16)
    assert all(c.batch * c.n == 16384 and c.heads * c.d == 2048 for c in cfgs)
    for bad, word in [(dict(dtypes=("fp8",)), "dtype"), (dict(ns=(3000,)), "tokens"),
                      (dict(ds=(96,)), "hidden"), (dict(providers=("xformers",)), "providers"),
                      (dict(modes=("bwd",)), "modes"), (dict(ns=()), "ns"),
                      (dict(causals=(1,)), "causals"), (dict(rep_ms=0), "rep_ms"),
                      (dict(flex_compile="max-autotune"), "flex_compile")]:
        with pytest.raises(ValueError, match=word):
            core.Settings(**bad)


def test_quick_preset_is_tiny_and_overridable():
    s = core.Settings.quick_preset(providers=("math",))
    assert s.quick and s.budget_s is None and max(s.ns) <= 128
    assert s.providers == ("math",)


# ------------------------------------------------------------------------------ timing

def test_summarize_median_and_quantiles():
    t = core.summarize([5.0, 1.0, 3.0, 2.0, 4.0], "do_bench")
    assert (t.ms, t.reps, t.timer) == (3.0, 5, "do_bench")
    assert t.ms_q20 == pytest.approx(1.8) and t.ms_q80 == pytest.approx(4.2)
    assert core.summarize([7.0], "x").ms_q80 == 7.0
    with pytest.raises(ValueError, match="times_ms"):
        core.summarize([], "x")


def test_cpu_timer_resets_gradients_and_counts_calls():
    x = torch.ones(3, requires_grad=True)
    calls = []

    def fn():
        assert x.grad is None  # grad_to_none is honoured before every timed call
        calls.append(1)
        (x * 2).sum().backward()

    t = core.time_call(fn, warmup_ms=0, rep_ms=5, grad_to_none=[x], gpu=False)
    assert t.timer == "perf_counter" and t.reps == len(calls) >= 1 and t.ms > 0


class _FakeCuda:
    """torch.cuda's clocks for host_and_gpu_ms on a CPU: a sleep and events that log, each
    call of the timed function worth ``per_call_ms`` of GPU time between the events."""

    def __init__(self, per_call_ms: float):
        self.per_call_ms, self.log, self.calls = per_call_ms, [], 0

    def call(self):
        self.calls += 1
        self.log.append("call")

    def sleep(self, cycles):
        self.log.append(("sleep", cycles))

    def event(self, enable_timing=False):
        fake = self

        class Event:
            def record(self):
                self.calls_then = fake.calls
                fake.log.append("record")

            def elapsed_time(self, end):
                return (end.calls_then - self.calls_then) * fake.per_call_ms
        return Event()


def test_host_and_gpu_clocks_queue_enough_calls_behind_a_long_enough_sleep(monkeypatch):
    fake = _FakeCuda(per_call_ms=0.25)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "_sleep", fake.sleep)
    monkeypatch.setattr(torch.cuda, "Event", fake.event)
    x = torch.ones(3, requires_grad=True)

    def fn():
        assert x.grad is None  # reset before every call, as do_bench's grad_to_none does
        fake.call()
        time.sleep(0.001)  # ~1 ms of host work a call
        (x * 2).sum().backward()

    host_ms, gpu_ms = core.host_and_gpu_ms(fn, median_ms=3.0, grads=[x])
    assert fake.calls == 2 * 10  # 30 ms of GPU time at 3 ms a call, host clock then GPU clock
    assert gpu_ms == pytest.approx(0.25)  # the events' span over the calls between them
    assert 1.0 <= host_ms < 20.0
    (_, cycles), = [e for e in fake.log if isinstance(e, tuple)]
    assert fake.log.index(("sleep", cycles)) < fake.log.index("record")  # sleep, then events
    assert cycles >= 1.5 * 10 * 1e-3 * 2e9  # outlasts ten ~1 ms queueings at ~2 GHz
    assert x.grad is None
    # 5 calls at least, 50 at most
    fake.calls = 0
    core.host_and_gpu_ms(fake.call, median_ms=100.0)
    assert fake.calls == 2 * 5
    fake.calls = 0
    core.host_and_gpu_ms(fake.call, median_ms=0.01)
    assert fake.calls == 2 * 50


def test_rows_the_host_set_are_named_per_provider():
    cfg = core.Config("float16", 128, False, 512, 32, 16)
    rows = [sweep._row(cfg, "ours", "fwd", "ok", ms=0.30, gpu_ms=0.13, tflops=1.0),
            sweep._row(cfg, "cudnn", "fwd", "ok", ms=0.135, gpu_ms=0.13, tflops=1.0),
            sweep._row(cfg, "ours", "fwd_bwd", "ok", ms=1.0, gpu_ms=0.9, tflops=1.0),
            sweep._row(cfg, "flash", "fwd", "ok", ms=1.0, tflops=1.0)]  # no GPU clock
    res = report.Results({}, rows)
    assert consistency.host_set_rows(res) == [rows[0]]
    text = consistency.host_set_text(res)
    assert "1 of   2, up to 2.31x" in text and "0 of   1" in text and "FA2" not in text
    assert consistency.host_set_text(report.Results({}, rows[3:])) == ""  # a CPU run: nothing


# ------------------------------------------------------------------------------ correctness

@pytest.mark.parametrize("causal", [False, True])
def test_reference_slices_match_the_numpy_float64_reference(causal):
    g = torch.Generator().manual_seed(1)
    q, k, v, do = (torch.randn(3, 2, 24, 16, generator=g, dtype=torch.float16)
                   for _ in range(4))
    got = core.reference_slices(q, k, v, do, causal=causal, scale=0.3)
    assert set(got) == {(0, 0), (2, 1)}  # the first and the last (batch, head)
    for (b, h), entry in got.items():
        args = [x[b, h].double().numpy() for x in (q, k, v)]
        np.testing.assert_allclose(entry["o"][0, 0].numpy(),
                                   ref.attention(*args, causal=causal, scale=0.3),
                                   rtol=1e-10, atol=1e-13)
        grads = ref.attention_backward(*args, do[b, h].double().numpy(), causal=causal,
                                       scale=0.3)
        for name, expected in zip(("dq", "dk", "dv"), grads, strict=True):
            np.testing.assert_allclose(entry[name][0, 0].numpy(), expected, rtol=1e-9,
                                       atol=1e-12)


def test_scaled_error():
    r = torch.tensor([[1.0, -4.0]], dtype=torch.float64)
    assert core.scaled_error(r.half(), r) == 0.0
    assert core.scaled_error(torch.tensor([[1.0, -3.0]]), r) == pytest.approx(0.25)
    assert core.scaled_error(torch.tensor([[float("nan"), 0.0]]), r) == math.inf
    assert core.scaled_error(torch.tensor([[0.5, 0.0]]), torch.zeros(1, 2).double()) == 0.5


def test_classify_errors():
    assert sweep.classify(torch.cuda.OutOfMemoryError("CUDA out of memory."))[0] == "oom"
    assert sweep.classify(RuntimeError("CUDA error: out of memory"))[0] == "oom"
    assert sweep.classify(ImportError("no module"))[0] == "unavailable"
    assert sweep.classify(RuntimeError("No available kernel. Aborting execution."))[0] \
        == "unsupported"
    assert sweep.classify(NotImplementedError("no backward on CPU"))[0] == "unsupported"
    assert sweep.classify(ValueError("head_dim too big"))[0] == "unsupported"
    status, reason = sweep.classify(RuntimeError("illegal memory access\nmore lines"))
    assert status == "error" and reason == "RuntimeError: illegal memory access"


# ------------------------------------------------------------------------------ the sweep

def _fake(monkeypatch, attn_factory, name="ours"):
    """Replace a provider by a fake whose attn is built by ``attn_factory(cfg)``."""
    monkeypatch.setitem(providers.PROVIDERS, name, providers.Provider(
        name, "fake", "a test double",
        lambda cfg, device, s: providers.Prepared(attn_factory(cfg))))


def _math(cfg):
    def attn(q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=cfg.causal,
                                                                scale=cfg.scale)
    return attn


def test_sweep_rows_have_the_schema_and_pass_the_check(monkeypatch):
    _fake(monkeypatch, _math)
    s = core.Settings(**{**TINY, "providers": ("ours", "math", "cudnn"), "ns": (32, 64),
                         "causals": (False, True)})
    payload = sweep.run(s, log=None)
    json.dumps(payload, allow_nan=False)  # strict JSON: no NaN or inf anywhere
    assert payload["kind"] == "flashtext.bench" and payload["partial"] is False
    assert set(payload["providers"]) == {"ours", "math", "cudnn"}
    rows = payload["rows"]
    assert len(rows) == 4 * 3 * 2  # configurations x providers x modes
    assert {r["status"] for r in rows} <= set(sweep.STATUSES)
    for r in rows:
        if r["provider"] == "cudnn" and not ON_GPU:  # no cuDNN on a CPU: recorded, not raised
            assert r["status"] == "unsupported" and "RuntimeError" in r["reason"]
            continue
        if r["provider"] == "cudnn" and r["status"] == "unsupported":  # tiny shapes on a GPU
            continue
        assert r["status"] == "ok" and r["correct"] is True, r
        assert r["tflops"] == pytest.approx(core.tflops(r["flops"], r["ms"]))
        assert ("gpu_ms" in r and "host_ms" in r) == ON_GPU  # the two clocks: GPU runs only
        names = {"o"} if r["mode"] == "fwd" else {"o", "dq", "dk", "dv"}
        assert set(r["max_error"]) == names
        assert max(r["max_error"].values()) < core.TOLERANCE["float16"] / 5


def test_a_wrong_kernel_is_flagged_not_hidden(monkeypatch):
    def forgot_causal(cfg):  # ignores the mask: right on non-causal inputs only
        return lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(
            q, k, v, scale=cfg.scale)

    _fake(monkeypatch, forgot_causal)
    s = core.Settings(**{**TINY, "providers": ("ours",), "causals": (False, True)})
    rows = sweep.run(s, log=None)["rows"]
    verdict = {(r["causal"], r["mode"]): r["correct"] for r in rows}
    assert verdict == {(False, "fwd"): True, (False, "fwd_bwd"): True,
                       (True, "fwd"): False, (True, "fwd_bwd"): False}
    bad = next(r for r in rows if r["causal"] and r["mode"] == "fwd")
    assert bad["max_error"]["o"] > 0.1 and bad["status"] == "ok"  # timed, but flagged
    text = report.summary_text(report.Results({}, rows))
    assert "WRONG RESULT ours" in text


def test_provider_failures_are_recorded_and_the_sweep_goes_on(monkeypatch):
    def raises(exc):
        def factory(cfg):
            def attn(q, k, v):
                raise exc
            return attn
        return factory

    _fake(monkeypatch, raises(RuntimeError("kernel exploded")), "ours")
    _fake(monkeypatch, raises(torch.cuda.OutOfMemoryError("CUDA out of memory")), "flash")
    monkeypatch.setitem(providers.PROVIDERS, "flex", providers.Provider(
        "flex", "x", "x", lambda cfg, device, s: (_ for _ in ()).throw(ImportError("gone"))))
    s = core.Settings(**{**TINY, "providers": ("ours", "flash", "flex", "math")})
    rows = sweep.run(s, log=None)["rows"]
    status = {(r["provider"], r["mode"]): r["status"] for r in rows}
    assert status[("ours", "fwd")] == "error"
    assert status[("flash", "fwd_bwd")] == "oom"
    assert status[("flex", "fwd")] == "unavailable"
    assert status[("math", "fwd")] == status[("math", "fwd_bwd")] == "ok"


def test_rounds_retime_every_provider_in_rotated_orders_and_pool_the_calls(monkeypatch):
    last = []

    def named(name):
        def factory(cfg):
            def attn(q, k, v):
                last.append(name)
                return _math(cfg)(q, k, v)
            return attn
        return factory

    _fake(monkeypatch, named("ours"), "ours")
    _fake(monkeypatch, named("math"), "math")
    timed, clock = [], iter(range(1, 100))

    def fake_time_call(fn, *, warmup_ms, rep_ms, grad_to_none=None, gpu):
        fn()
        timed.append(last[-1])
        t = float(next(clock))
        return core.Timing(t, t, t, 2, "fake", (t, t + 0.5))

    monkeypatch.setattr(sweep, "time_call", fake_time_call)
    s = core.Settings(**{**TINY, "providers": ("ours", "math"), "rounds": 3})
    rows = sweep.run(s, log=None)["rows"]
    # round 0 times each provider's two modes in the sweep's order; then rotated orders
    assert timed == ["ours"] * 2 + ["math"] * 2 + ["math"] * 2 + ["ours"] * 2 + ["ours"] * 2 \
        + ["math"] * 2
    ours_fwd = next(r for r in rows if (r["provider"], r["mode"]) == ("ours", "fwd"))
    assert ours_fwd["ms_rounds"] == [1.0, 7.0, 9.0]  # each round's median, in round order
    assert ours_fwd["reps"] == 6 and ours_fwd["ms"] == 7.25  # the median of all six calls
    assert ours_fwd["tflops"] == pytest.approx(core.tflops(ours_fwd["flops"], 7.25))
    assert all("times" not in r for r in rows) and all(len(r["ms_rounds"]) == 3 for r in rows)
    one = sweep.run(core.Settings(**{**TINY, "providers": ("ours",)}), log=None)["rows"]
    assert all("ms_rounds" not in r and "times" not in r for r in one)
    assert sweep.round_order(["a", "b", "c"], 4) == ["b", "c", "a"]
    clock = iter([1.0, 50.0, 2.0, 60.0, 4.0, 70.0])  # a timer without per-call times

    def medians_only(fn, *, warmup_ms, rep_ms, grad_to_none=None, gpu):
        t = next(clock)
        return core.Timing(t, t, t, 0, "fake")

    monkeypatch.setattr(sweep, "time_call", medians_only)
    rows = sweep.run(core.Settings(**{**TINY, "providers": ("ours",), "rounds": 3}),
                     log=None)["rows"]
    fwd = next(r for r in rows if r["mode"] == "fwd")
    assert fwd["ms_rounds"] == [1.0, 2.0, 4.0] and fwd["ms"] == 2.0  # the middle round
    with pytest.raises(ValueError, match="rounds"):
        core.Settings(**{**TINY, "rounds": 0})


def test_rounds_max_n_times_only_the_short_configurations_again(monkeypatch):
    calls = []

    def counting(fn, *, warmup_ms, rep_ms, grad_to_none=None, gpu):
        calls.append(1)
        return core.Timing(1.0, 1.0, 1.0, 0, "fake")

    monkeypatch.setattr(sweep, "time_call", counting)
    s = core.Settings(**{**TINY, "providers": ("ours",), "ns": (32, 64), "rounds": 3,
                         "rounds_max_n": 32})
    assert (s.rounds_for(32), s.rounds_for(64)) == (3, 1)
    rows = sweep.run(s, log=None)["rows"]
    assert all(len(r["ms_rounds"]) == 3 for r in rows if r["n"] == 32)
    assert all("ms_rounds" not in r for r in rows if r["n"] == 64)
    assert len(calls) == 2 * 3 + 2  # two modes: three passes at N = 32, one at 64
    for bad in (0, True, 2.5):
        with pytest.raises(ValueError, match="rounds_max_n"):
            core.Settings(**{**TINY, "rounds_max_n": bad})
    args = cli.parser().parse_args(["--rounds", "3", "--rounds-max-n", "2k"])
    assert cli.settings_from_args(args, quick=False).rounds_max_n == 2048


def test_skips_and_time_budget(monkeypatch):
    s = core.Settings(**{**TINY, "providers": ("math",), "ns": (32, 64), "math_max_n": 32})
    rows = sweep.run(s, log=None)["rows"]
    assert {r["n"]: r["status"] for r in rows} == {32: "ok", 64: "skipped"}
    assert "math-max-n" in next(r["reason"] for r in rows if r["n"] == 64)
    s = core.Settings(**{**TINY, "providers": ("math",), "ns": (32, 64), "budget_s": 0.0})
    rows = sweep.run(s, log=None)["rows"]  # the budget is checked before each configuration
    assert all(r["status"] == "skipped" and "budget" in r["reason"] for r in rows)


def test_our_kernel_runs_in_the_quick_sweep():
    """The real kernel (on a CPU under the interpreter: one tiny configuration, bf16 skipped)."""
    s = core.Settings(**{**TINY, "providers": ("ours",), "dtypes": ("fp16", "bf16"),
                         "causals": (True,)})
    rows = sweep.run(s, log=None)["rows"]
    fp16 = [r for r in rows if r["dtype"] == "float16"]
    assert all(r["status"] == "ok" and r["correct"] for r in fp16), fp16
    bf16 = [r for r in rows if r["dtype"] == "bfloat16"]
    if ON_GPU:
        assert bf16 and all(r["status"] == "ok" and r["correct"] for r in bf16), bf16
    else:
        assert all(r["status"] == "skipped" and "interpreter" in r["reason"] for r in bf16)


# ------------------------------------------------------------------------------ ratios, targets

def _results(tflops: dict, correct: bool = True) -> report.Results:
    """Results with the given TFLOP/s per (provider, mode, d, causal, n), fp16."""
    rows = []
    for (p, mode, d, causal, n), t in tflops.items():
        cfg = core.Config("float16", d, causal, n, 16384 // n, 2048 // d)
        rows.append(sweep._row(cfg, p, mode, "ok", ms=cfg.flops(mode) / t / 1e9, tflops=t,
                              correct=correct if p == "ours" else True))
    return report.Results({"settings": {"tokens": 16384, "hidden": 2048}}, rows)


def test_ratio_rows():
    res = _results({("ours", "fwd", 128, False, 4096): 600.0,
                    ("cudnn", "fwd", 128, False, 4096): 500.0,
                    ("flash", "fwd", 128, False, 4096): 300.0})
    (r,) = report.ratio_rows(res)
    assert r["ours/cudnn"] == pytest.approx(1.2) and r["ours/flash"] == pytest.approx(2.0)
    assert r["flex"] is None and r["ours/flex"] is None


def test_same_kernels_follows_the_dispatch_rules():
    from flashtext.kernels import dispatch

    for mode in ("fwd", "fwd_bwd"):
        for d in (64, 128):
            for causal in (False, True):
                for n in (512, 1024, 2048, 4096, 16384):
                    fwd = dispatch.prefers_gluon(d, n, n, causal)
                    bwd = dispatch.prefers_gluon_backward(d, n, n, causal)
                    got = consistency.same_kernels(mode, d, n, causal)
                    if mode == "fwd":
                        assert got == ("gluon" if fwd else "triton")
                    else:
                        assert got == {(True, True): "gluon", (False, False): "triton"}.get(
                            (fwd, bwd)), (d, causal, n)
    # the rules' two sides of each line give both answers, and a mixed pair gives none
    assert consistency.same_kernels("fwd", 128, 16384, False) == "gluon"
    assert consistency.same_kernels("fwd", 64, 1024, True) == "triton"
    assert consistency.same_kernels("fwd_bwd", 128, 16384, True) == "gluon"
    assert consistency.same_kernels("fwd_bwd", 64, 512, True) == "triton"
    assert consistency.same_kernels("fwd_bwd", 128, 1024, False) is None  # Gluon fwd, Triton dK/dV


def test_timed_twice_pairs_ours_with_the_column_that_runs_its_kernels():
    res = _results({("ours", "fwd", 128, False, 4096): 600.0,
                    ("gluon", "fwd", 128, False, 4096): 500.0,
                    ("triton", "fwd", 128, False, 4096): 300.0,
                    ("ours", "fwd_bwd", 128, False, 1024): 300.0,
                    ("gluon", "fwd_bwd", 128, False, 1024): 300.0})
    ours_ms, same_ms = consistency.timed_twice(res, "fwd", "float16", 128, False, 4096)
    assert same_ms / ours_ms == pytest.approx(600 / 500)  # the gluon column, not triton's
    assert consistency.timed_twice(res, "fwd", "float16", 128, True, 4096) is None  # not measured
    assert consistency.timed_twice(res, "fwd_bwd", "float16", 128, False, 1024) is None  # mixed


def test_targets_met_missed_and_gaps():
    key = ("fwd", 128, False)
    res = _results({("ours", *key, 2048): 560.0, ("cudnn", *key, 2048): 530.0,
                    ("flash", *key, 2048): 380.0, ("flex", *key, 2048): 560.0,
                    ("ours", *key, 1024): 100.0, ("cudnn", *key, 1024): 500.0})
    verdict = {t["target"]: t for t in report.evaluate_targets(res)}
    cudnn = verdict["fwd, d=128, N>=2k: >= 1.05x SDPA cuDNN"]
    assert cudnn["status"] == "met" and (cudnn["met"], cudnn["scored"]) == (1, 1)  # N=1k exempt
    flash = verdict["fwd, d=128, N>=2k: >= 1.5x SDPA flash (FA2)"]
    assert flash["status"] == "missed" and flash["worst_ratio"] == pytest.approx(560 / 380)
    flex = verdict["fwd, d=128, N>=2k: ahead of FlexAttention"]
    assert flex["status"] == "missed"  # a tie is not "ahead"
    assert verdict["fwd+bwd: >= 1.0x FlexAttention"]["status"] == "no data"
    # bf16 measured for ours and cuDNN at N=2k, fp16 only for ours: met where there is a number
    gap = report.Results(res.meta, res.rows + [
        {**r, "dtype": "bfloat16"} for r in res.rows if r["provider"] in ("ours", "cudnn")
        and r["n"] == 2048] + [{**r, "dtype": "bfloat16", "n": 4096} for r in res.rows
                               if r["provider"] == "ours" and r["n"] == 2048])
    g = {t["target"]: t for t in report.evaluate_targets(gap)}[
        "fwd, d=128, N>=2k: >= 1.05x SDPA cuDNN"]
    assert (g["status"], g["met"], g["missing"]) == ("met where measured", 2, 2)  # 4k: both
    wrong = _results({("ours", *key, 2048): 900.0, ("cudnn", *key, 2048): 500.0},
                     correct=False)
    w = {t["target"]: t for t in report.evaluate_targets(wrong)}
    assert w["fwd, d=128, N>=2k: >= 1.05x SDPA cuDNN"]["status"] == "missed"  # fast but wrong
    lines = report.summary_text(res).splitlines()
    cudnn_line = next(x for x in lines if x.strip().startswith("ours / SDPA cuDNN"))
    assert cudnn_line.split()[-2:] == ["0.20", "1.06"]  # N=1k is below the target's N: no *
    flash_line = next(x for x in lines if x.strip().startswith("ours / SDPA flash"))
    assert flash_line.split()[-1] == "1.47*"


def test_markdown_puts_the_two_roofline_numbers_first():
    key = ("fwd", 128, False, 4096)
    res = _results({("ours", *key): 400.0, ("cudnn", *key): 500.0})
    for r in res.rows:
        r.update(t_compute_ms=0.7, t_memory_ms=0.016)
    md = report.markdown_tables(res)
    assert "| FLOPs / ceiling (ms) | bytes / ceiling (ms) |" in md
    miss = next(line for line in md.splitlines() if line.startswith("| fwd fp16 d=128 N=4096"))
    assert "| 0.700 | 0.0160 |" in miss and "0.80" in miss


def test_memory_growth():
    rows = []
    for n, per_token in ((512, 100.0), (4096, 110.0)):
        cfg = core.Config("float16", 64, False, n, 16384 // n, 32)
        rows.append(sweep._row(cfg, "ours", "fwd_bwd", "ok", ms=1.0, tflops=1.0,
                              peak_bytes_per_token=per_token))
        rows.append(sweep._row(cfg, "math", "fwd_bwd", "ok", ms=1.0, tflops=1.0,
                              peak_bytes_per_token=100.0 * n / 512))
    growth = {g["provider"]: g["growth"] for g in report.memory_growth(report.Results({}, rows))}
    assert growth == {"ours": pytest.approx(1.1), "math": pytest.approx(8.0)}


# ------------------------------------------------------------------------------ anchors, figures

def test_anchors_become_rows():
    raw = recorded.load("h200_peers_fp16")
    res = report.load_anchors()
    assert res.is_anchor
    assert len(res.rows) == sum(len(a) - 3 for a in raw["rows"])
    assert res.value("cudnn", "fwd", "float16", 128, False, 16384) == 575.5
    assert res.value("flash", "fwd_bwd", "float16", 64, True, 1024) == 153.6
    r = res.ok(provider="cudnn", mode="fwd", d=128, causal=False, n=4096)[0]
    assert (r["batch"], r["heads"]) == (4, 16)
    assert core.tflops(r["flops"], r["ms"]) == pytest.approx(552.5)
    with pytest.raises(ValueError, match="neither"):
        report.Results.from_payload({"gpu": "x"})


def test_recorded_results_prefers_the_full_run(tmp_path, monkeypatch):
    monkeypatch.setattr(recorded, "DATA_DIR", tmp_path)
    anchors = json.loads((recorded.Path(core.__file__).parents[1] / "data" /
                          "h200_peers_fp16.json").read_text())
    (tmp_path / "h200_peers_fp16.json").write_text(json.dumps(anchors))
    assert report.recorded_results().is_anchor
    recorded.save(report.RECORDED_NAME, {"kind": "flashtext.bench", "rows": []})
    assert not report.recorded_results().is_anchor


def test_figures_draw():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    anchors = report.load_anchors()
    fig = report.figure_tflops(anchors)
    assert len(fig.axes) == 2 * 4  # (fwd, fwd_bwd) x (d, causal)
    plt.close(fig)
    res = _results({("ours", "fwd", 128, False, n): 500.0 for n in (1024, 2048)})
    ax = report.plot_tflops(res, dtype="float16", d=128, causal=False, mode="fwd",
                            anchors=anchors, roof=(690, 790))
    labels = [line.get_label() for line in ax.get_lines()]
    assert "flashtext (ours)" in labels and "SDPA cuDNN (anchor)" in labels
    plt.close(ax.figure)
    fig = report.figure_memory(res)
    assert "no memory measured" in fig.axes[0].texts[0].get_text()
    plt.close(fig)
    ax = report.plot_roofline(anchors, mode="fwd")
    roof, *points = ax.get_lines()
    assert roof.get_ydata().max() == pytest.approx(790)  # the H200's measured matmul, high end
    cudnn = next(line for line in points if line.get_label() == "SDPA cuDNN")
    assert len(cudnn.get_xdata()) == 20 and min(cudnn.get_xdata()) == 1024 / 4  # causal N/4
    plt.close(ax.figure)


# ------------------------------------------------------------------------------ command line

def test_cli_helpers():
    assert cli._parse_n("2k") == 2048 and cli._parse_n("512") == 512
    assert cli.default_name("NVIDIA H200") == "bench_h200"
    assert cli.default_name("NVIDIA H100 80GB HBM3") == "bench_h100_80gb_hbm3"
    args = cli.parser().parse_args(["--dtype", "fp16,bf16", "--n", "1k", "2k", "--causal",
                                    "true", "--providers", "ours,cudnn", "--budget-min", "0"])
    s = cli.settings_from_args(args, quick=False)
    assert s.dtypes == ("float16", "bfloat16") and s.ns == (1024, 2048)
    assert s.causals == (True,) and s.providers == ("ours", "cudnn") and s.budget_s is None
    assert s.rounds == 1
    assert cli.settings_from_args(cli.parser().parse_args(["--rounds", "3"]), False).rounds == 3


def test_cli_quick_run_writes_json_and_figures(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(recorded, "DATA_DIR", tmp_path / "data")
    monkeypatch.setattr(cli, "ARTIFACTS", tmp_path / "artifacts")
    argv = ["--quick", "--providers", "math", "flash", "--n", "32", "64", "--dtype", "fp16",
            "--out", "bench_test"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert ("CPU SMOKE TEST" in out) != ON_GPU and "Targets:" in out
    data = recorded.load("bench_test")
    assert data["partial"] is False
    assert data["gpu"] == (torch.cuda.get_device_name(0) if ON_GPU else "cpu")
    assert len(data["rows"]) == 2 * 2 * 2 * 2  # N x causal x providers x modes
    assert (tmp_path / "artifacts" / "bench_test.png").exists()
    assert (tmp_path / "artifacts" / "bench_test_memory.png").exists()
    # --merge: measure one N again; its rows are replaced, the others kept, both runs recorded
    assert cli.main(["--quick", "--providers", "math", "--n", "64", "--dtype", "fp16",
                     "--out", "bench_test", "--merge", "--no-plot"]) == 0
    merged = recorded.load("bench_test")
    assert len(merged["rows"]) == 16 and len(merged["runs"]) == 2
    assert cli.main(["--report", "bench_test", "--no-plot", "--markdown"]) == 0
    assert "| target | status |" in capsys.readouterr().out


def test_cli_full_sweep_detection():
    assert cli.full_sweep(core.Settings())
    assert cli.full_sweep(core.Settings(dtypes=("bf16", "fp16"), ds=(64, 128)))
    assert not cli.full_sweep(core.Settings(ds=(128,)))


def test_cli_merge_keeps_rows_a_budget_cut_off():
    cfg = core.Config("float16", 64, False, 512, 32, 32)
    old = {"gpu": "g", "torch": "t", "triton": "x", "started": "a",
           "rows": [sweep._row(cfg, "ours", "fwd", "ok", ms=1.0)]}
    new = {**old, "started": "b",
           "rows": [sweep._row(cfg, "ours", "fwd", "skipped", "time budget of 510 s used up")]}
    merged = cli.merge(old, new)
    assert [r["status"] for r in merged["rows"]] == ["ok"] and len(merged["runs"]) == 2
    redo = {**old, "started": "c", "rows": [sweep._row(cfg, "ours", "fwd", "ok", ms=0.5)]}
    assert [r["ms"] for r in cli.merge(old, redo)["rows"]] == [0.5]


def test_cli_merge_describes_the_whole_sweep():
    """A run that finishes one dtype's rows must not make the file forget the other dtype's
    ceiling or the sweep's other lengths (a merged v5 lost fp16's matmul ceiling)."""
    full = {"dtypes": ["float16", "bfloat16"], "ns": [512, 16384], "budget_s": 426.0}
    old = {"gpu": "g", "torch": "t", "triton": "x", "started": "a", "rows": [],
           "settings": full, "providers": {"ours": "o"},
           "ceilings": {"matmul_flops": {"float16": 700e12, "bfloat16": 712e12}}}
    new = {**old, "started": "b", "settings": {"dtypes": ["bfloat16"], "ns": [16384, 32768],
                                               "budget_s": None, "rounds": 3},
           "providers": {"ours": "o", "gluon": "g"},
           "ceilings": {"matmul_flops": {"bfloat16": 811e12, "float32": 50e12}}}
    merged = cli.merge(old, new)
    assert merged["settings"] == {"dtypes": ["float16", "bfloat16"], "ns": [512, 16384, 32768],
                                  "budget_s": 426.0, "rounds": 3}
    assert merged["ceilings"]["matmul_flops"] == {"float16": 700e12, "bfloat16": 712e12,
                                                  "float32": 50e12}
    assert set(merged["providers"]) == {"ours", "gluon"}
    assert [r["ceilings"]["matmul_flops"].get("bfloat16") for r in merged["runs"]] == [712e12,
                                                                                       811e12]


def test_cli_resume_args_name_what_was_cut_off():
    s = core.Settings()
    cut = [sweep._row(core.Config("bfloat16", d, True, n, 16384 // n, 2048 // d), "ours", "fwd",
                     "skipped", "budget") for d in (64, 128) for n in (8192, 16384)]
    args = cli.resume_args(cut, s, "bench_h200")
    assert args.startswith("--dtype bf16 --d 64 128 --causal true --n 8192 16384 --mode fwd")
    assert args.endswith("--merge --out bench_h200")
    assert cli.settings_from_args(cli.parser().parse_args(args.split()), quick=False).ns == \
        (8192, 16384)
    assert "--rounds" not in args
    rounds = core.Settings(rounds=3, rounds_max_n=2048)
    again = cli.settings_from_args(
        cli.parser().parse_args(cli.resume_args(cut, rounds, None).split()), quick=False)
    assert (again.rounds, again.rounds_max_n) == (3, 2048)  # timed as the first part was


def test_cli_borrowed_peers_give_ratios_without_remeasuring():
    cfg = core.Config("float16", 128, False, 4096, 4, 16)
    ours = sweep._row(cfg, "ours", "fwd", "ok", ms=cfg.flops("fwd") / 600e12 * 1e3, tflops=600.0)
    cudnn_here = sweep._row(cfg, "cudnn", "fwd", "unsupported", "x")
    res = cli.borrow_peers(report.Results({}, [ours, cudnn_here]), "h200_peers_fp16")
    (r,) = report.ratio_rows(res)
    assert r["ours/cudnn"] == pytest.approx(600 / 552.5) and r["ours/flash"] == pytest.approx(
        600 / 336.3)
    assert all(x.get("borrowed_from") == "h200_peers_fp16" for x in res.rows
               if x["provider"] != "ours")


def test_cli_merge_refuses_another_gpu():
    old = {"gpu": "NVIDIA H200", "torch": "2.11", "triton": "3.6", "rows": []}
    with pytest.raises(SystemExit, match="gpu"):
        cli.merge(old, {**old, "gpu": "NVIDIA A100"})


def test_cli_plan_lists_configurations(capsys):
    assert cli.main(["--quick", "--plan", "--n", "64", "--dtype", "fp16"]) == 0
    out = capsys.readouterr().out
    assert "fp16 d=64 N=64 full (B=2, H=1)" in out and "causal" in out


def test_providers_follow_the_harness_order_not_the_file_order():
    rows = [{"provider": p, "status": "ok"} for p in ("math", "efficient", "flex", "ours", "cudnn")]
    res = report.Results({"kind": "flashtext.bench"}, rows)
    assert res.providers() == [p for p in providers.PROVIDERS if p in {r["provider"] for r in rows}]
    assert res.providers()[0] == "ours"
