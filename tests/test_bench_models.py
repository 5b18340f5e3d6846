"""The real-model benchmark (flashtext.bench.models) on the CPU path: every mode runs, checks
its own result against the fp32 reference, and records why anything could not run."""

from __future__ import annotations

import json

import pytest
import torch

from flashtext.bench import core, models

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


def _slow_mode(monkeypatch, calls: int, seconds: float) -> None:
    """A fake clock, a fake timer, and a mode "slow" whose every call takes ``seconds``."""
    from types import SimpleNamespace

    clock = [0.0]
    monkeypatch.setattr(models.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(models, "time_call", lambda *a, **kw: SimpleNamespace(
        ms=1.0, ms_q20=1.0, ms_q80=1.0, reps=1, timer="fake"))
    # on a GPU each row also reads the host and GPU clocks, calling the call again: not here
    monkeypatch.setattr(core, "host_and_gpu_ms", lambda *a, **kw: (1.0, 1.0))

    def slow(runner, providers):
        for i in range(calls):
            runner.measure({"mode": "slow", "i": i},
                           lambda: clock.__setitem__(0, clock[0] + seconds), None, flops=1.0)

    monkeypatch.setitem(models.MODES, "slow", slow)


def test_a_slow_mode_does_not_starve_the_modes_after_it(monkeypatch):
    _slow_mode(monkeypatch, calls=5, seconds=40.0)

    def fast(runner, providers):
        for i in range(3):
            runner.measure({"mode": "fast", "i": i}, lambda: None, None, flops=1.0)

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


def test_each_mode_reports_its_share_time_and_skipped_rows(monkeypatch):
    _slow_mode(monkeypatch, calls=3, seconds=30.0)
    spent = {}
    models.run(TINY, ("slow",), ("ours",), budget_s=50.0, spent=spent)
    # calls start at 0 and 30; the third would start at 60, past the 50 s share
    assert spent == {"slow": {"share_s": 50.0, "seconds": 60.0, "rows": 3, "skipped": 1}}


def test_flexattention_is_built_only_when_its_row_runs(monkeypatch):
    import torch.nn.attention.flex_attention as fa

    built = []
    monkeypatch.setattr(fa, "create_block_mask", lambda *a, **kw: built.append(a) or "mask")
    monkeypatch.setattr(models, "_flex", lambda: lambda q, k, v, block_mask, enable_gqa: (
        block_mask, enable_gqa))
    call = models._flex_call(1, 2, 8, 8, causal=True)
    assert built == []  # a row skipped for time compiles nothing
    q = k = v = torch.zeros(1, 2, 8, 4)
    assert call(q, k, v) == ("mask", False) and call(q, k, v) == ("mask", False)
    assert len(built) == 1  # once per configuration


def _row(mode, provider, n, status="ok", ms=1.0):
    return {"mode": mode, "provider": provider, "n": n, "dtype": "float16", "status": status,
            "ms": ms, "reason": "time budget" if status == "skipped" else None}


def test_merge_finishes_a_recording_without_losing_measured_rows():
    stamp = {"gpu": "NVIDIA H200", "torch": "2.11", "triton": "3.6"}
    old = {**stamp, "kernel_sources": {"sha256": "a"}, "modes": {"gqa": {"skipped": 1}},
           "rows": [_row("gqa", "ours", 1, ms=5.0), _row("gqa", "ours", 2, "skipped"),
                    _row("window", "ours", 1, "skipped")]}
    new = {**stamp, "kernel_sources": {"sha256": "b"}, "modes": {"window": {"skipped": 0}},
           "rows": [_row("window", "ours", 1, ms=3.0), _row("gqa", "ours", 1, "skipped")]}
    merged = models.merge(old, new)
    by = {(r["mode"], r["n"]): r for r in merged["rows"]}
    assert len(merged["rows"]) == 3
    assert by["window", 1]["ms"] == 3.0  # measured now: replaces the skipped row
    assert by["gqa", 1]["ms"] == 5.0  # skipped now: the measured row stays
    assert by["gqa", 2]["status"] == "skipped"  # not measured in either run
    assert set(merged["modes"]) == {"gqa", "window"} and len(merged["runs"]) == 2
    assert merged["kernel_sources"] == {"sha256": "a"}  # recorded.save compares it with now
    with pytest.raises(SystemExit, match="gpu"):
        models.merge(old, {**new, "gpu": "NVIDIA A100"})
    # the first run's ceilings describe the file; a later run's stay in its own record
    first, later = {"copy_bandwidth": 4.2e12}, {"copy_bandwidth": 4.3e12, "matmul": 7e14}
    both = models.merge({**old, "ceilings": first}, {**new, "ceilings": later})
    assert both["ceilings"] == {"copy_bandwidth": 4.2e12, "matmul": 7e14}
    assert [r["ceilings"] for r in both["runs"]] == [first, later]


def test_main_merges_a_second_run_into_the_recording(monkeypatch, tmp_path, capsys):
    from flashtext import recorded

    monkeypatch.setattr(recorded, "path", lambda name: tmp_path / f"{name}.json")
    ours = ["--quick", "--providers", "ours", "--out", "m"]  # on a GPU too: no compiles of peers
    assert models.main([*ours, "--modes", "decode"]) == 0
    assert models.main([*ours, "--modes", "gqa"]) == 0
    assert models.main([*ours, "--modes", "window", "--merge"]) == 0
    dense = json.loads((tmp_path / "m.json").read_text())
    assert {r["mode"] for r in dense["rows"]} == {"gqa", "window"}  # merged, not replaced
    assert dense["runs"][-1]["argv"][-3:] == ["--modes", "window", "--merge"]
    assert json.loads((tmp_path / "m_decode.json").read_text())["modes"].keys() == {"decode"}
    assert "INCOMPLETE" not in capsys.readouterr().out


def test_a_starved_run_says_how_to_finish_it(monkeypatch, tmp_path, capsys):
    from flashtext import recorded

    monkeypatch.setattr(recorded, "path", lambda name: tmp_path / f"{name}.json")
    models.main(["--quick", "--providers", "ours", "--modes", "decode", "gqa", "--out", "m",
                 "--budget-min", "1e-9"])
    out = capsys.readouterr().out
    assert ("INCOMPLETE: the time budget skipped rows of decode, gqa; finish with python -m "
            "flashtext.bench.models --modes decode gqa --merge --out m") in out


def test_gpu_rows_carry_the_host_and_gpu_clocks_and_survive_their_failure(monkeypatch):
    timing = core.summarize([0.5, 0.5, 0.5], "do_bench")
    monkeypatch.setattr(models, "time_call", lambda *a, **kw: timing)
    clocks = iter([(0.2, 0.05), RuntimeError("no events")])

    def fake_clocks(call, median_ms, grads):
        assert median_ms == timing.ms  # sized from the do_bench time just measured
        got = next(clocks)
        if isinstance(got, Exception):
            raise got
        return got

    monkeypatch.setattr(core, "host_and_gpu_ms", fake_clocks)
    run = models.Runner(TINY, budget_s=None)
    run.gpu = True
    first = run.measure({"mode": "decode", "provider": "ours"}, lambda: None, None, kv_bytes=1e6)
    assert (first["host_ms"], first["gpu_ms"], first["status"]) == (0.2, 0.05, "ok")
    second = run.measure({"mode": "decode", "provider": "ours"}, lambda: None, None, kv_bytes=1e6)
    assert second["status"] == "ok" and second["ms"] == timing.ms  # the timing stands
    assert "host_ms" not in second and "no events" in second["clocks_error"]
    run.gpu = False  # the interpreter's rows: no clocks to ask for
    third = run.measure({"mode": "decode", "provider": "ours"}, lambda: None, None, kv_bytes=1e6)
    assert "host_ms" not in third and "clocks_error" not in third
