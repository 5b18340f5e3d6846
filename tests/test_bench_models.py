"""The real-model benchmark (flashtext.bench.models) on the CPU path: every mode runs, checks
its own result against the fp32 reference, and records why anything could not run."""

from __future__ import annotations

from flashtext.bench import models

TINY = models.Plan(gqa=((1, 2, 1, 32),), window=((1, 64, 8),), varlen=(1, 60, 8, 30),
                   decode=((1, 48),), decode_heads=(2, 1), d=16, dtype="float32",
                   warmup_ms=0.0, rep_ms=0.0)


def test_every_mode_runs_and_is_checked():
    rows = models.run(TINY, tuple(models.MODES), ("ours", "math"))
    assert {r["mode"] for r in rows} == {"gqa", "window", "varlen", "decode"}
    assert all(r["status"] == "ok" for r in rows), [r for r in rows if r["status"] != "ok"]
    checked = [r for r in rows if "correct" in r]
    assert checked and all(r["correct"] for r in checked)
    providers = {(r["mode"], r["provider"], r.get("cache")) for r in rows}
    assert {("decode", "ours", "dense"), ("decode", "ours", "paged"),
            ("window", "ours_causal", None), ("varlen", "ours_padded", None)} <= providers
    assert all(r["kv_bytes"] > 0 for r in rows if r["mode"] == "decode")


def test_a_wrong_kernel_is_caught(monkeypatch):
    import flashtext.kernels as kernels

    real = kernels.flash_decode
    monkeypatch.setattr(kernels, "flash_decode", lambda *a, **kw: real(*a, **kw) * 1.5)
    rows = models.run(TINY, ("decode",), ("ours",))
    assert rows and all(r["correct"] is False for r in rows)


def test_the_packed_lengths_fill_the_total_within_bounds():
    lengths = models._lengths(32768, 128, 8192)
    assert sum(lengths) == 32768 and all(128 <= n <= 8192 + 128 for n in lengths)


def test_a_slow_mode_does_not_starve_the_modes_after_it(monkeypatch):
    from types import SimpleNamespace

    clock = [0.0]  # seconds; each call of the slow mode takes 40 of them
    monkeypatch.setattr(models.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(models, "time_call", lambda *a, **kw: SimpleNamespace(
        ms=1.0, ms_q20=1.0, ms_q80=1.0, reps=1, timer="fake"))

    def slow(runner, providers):
        for i in range(5):
            runner.measure({"mode": "slow", "i": i},
                           lambda: clock.__setitem__(0, clock[0] + 40.0), None, flops=1.0)

    def fast(runner, providers):
        for i in range(3):
            runner.measure({"mode": "fast", "i": i}, lambda: None, None, flops=1.0)

    monkeypatch.setitem(models.MODES, "slow", slow)
    monkeypatch.setitem(models.MODES, "fast", fast)
    rows = models.run(TINY, ("slow", "fast"), ("ours",), budget_s=100.0)
    status = {(r["mode"], r["i"]): r["status"] for r in rows}
    # the slow mode may use half the budget: its calls start at 0 and 40, the third would
    # start at 80, past its 50 s
    assert [status["slow", i] for i in range(5)] == ["ok", "ok"] + ["skipped"] * 3
    assert all(status["fast", i] == "ok" for i in range(3))  # the 20 s left are its own
    assert {r["reason"] for r in rows if r["status"] == "skipped"} == {"time budget"}


def test_the_default_order_runs_every_mode():
    assert sorted(models.RUN_ORDER) == sorted(models.MODES)
