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
