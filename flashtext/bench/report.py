"""Reading benchmark results: loading (ours or the H200 anchors), ratios against the kernel's
targets (:data:`TARGETS`), text tables, and the TFLOP/s-vs-N and memory-vs-N figures.

Results are a list of *rows*, one per (provider, mode, dtype, d, causal, n); see
:func:`flashtext.bench.sweep.run` for what a row holds. The anchors file
(``flashtext/data/h200_peers_fp16.json``, peers measured on one H200) is converted into the same
rows so the figures and tables treat both alike.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from flashtext import recorded
from flashtext.bench.core import SHORT_DTYPE
from flashtext.bench.providers import PROVIDERS

# The book's recorded full sweep of its current kernel version on the H200. `make bench` writes
# bench_h200.json; each kernel version's sweep is kept under its own name (bench_h200_v0, _v1,
# _v2, ...; BENCHMARKS.md has one entry per version), and this names the newest.
RECORDED_NAME = "bench_h200_v11"
ANCHORS_NAME = "h200_peers_fp16"  # peers measured on one H200, fp16 (its provenance inside)
PEERS = ("cudnn", "flash", "flex")
LABELS = {**{name: p.label for name, p in PROVIDERS.items()},
          "tutorial": "Triton tutorial kernel"}


# ------------------------------------------------------------------------------ results

@dataclass
class Results:
    """Benchmark rows plus what describes them (GPU, versions, settings, ceilings)."""

    meta: dict[str, Any]
    rows: list[dict[str, Any]]

    @classmethod
    def from_payload(cls, data: dict[str, Any]) -> Results:
        """Accept a ``flashtext.bench`` JSON or the anchors' JSON (converted to rows)."""
        if data.get("kind") == "flashtext.bench":
            meta = {k: v for k, v in data.items() if k != "rows"}
            return cls(meta, [dict(r) for r in data["rows"]])
        if "rows" in data and "providers" in data and "setting" in data:
            return cls(*_anchor_rows(data))
        raise ValueError("data is neither a flashtext.bench result nor the anchors' format "
                         f"(keys: {sorted(data)})")

    @property
    def is_anchor(self) -> bool:
        return self.meta.get("kind") == "anchors"

    def ok(self, **where: Any) -> list[dict[str, Any]]:
        """Rows with a time (status "ok") matching every ``field=value`` given."""
        return [r for r in self.rows if r["status"] == "ok"
                and all(r.get(k) == v for k, v in where.items())]

    def value(self, provider: str, mode: str, dtype: str, d: int, causal: bool, n: int,
              key: str = "tflops") -> float | None:
        hits = self.ok(provider=provider, mode=mode, dtype=dtype, d=d, causal=causal, n=n)
        return hits[0].get(key) if hits else None

    def axis(self, key: str) -> list[Any]:
        """Distinct values of ``key`` over all rows, sorted (fp16 before bf16)."""
        order = {"float16": 0, "bfloat16": 1, "float32": 2}
        return sorted({r[key] for r in self.rows}, key=lambda x: order.get(x, x)
                      if key == "dtype" else x)

    @property
    def tokens(self) -> int:
        """batch * N of these results (16384 for the anchors and the full sweep)."""
        return (self.meta.get("settings") or {}).get("tokens", 16384)

    def anchor_setting(self) -> bool:
        """Measured at the anchors' setting, so the anchors can be drawn beside them."""
        s = self.meta.get("settings") or {}
        return self.is_anchor or (s.get("tokens"), s.get("hidden")) == (16384, 2048)

    def providers(self) -> list[str]:
        """The providers present, in the harness's order (ours first; legends follow it),
        whatever order a merged file holds its rows in."""
        order = {name: i for i, name in enumerate([*PROVIDERS, "tutorial"])}
        seen = dict.fromkeys(r["provider"] for r in self.rows)
        return sorted(seen, key=lambda p: order.get(p, len(order)))

    def failures(self) -> list[dict[str, Any]]:
        """Rows that did not produce a trustworthy time (skips by design left out)."""
        return [r for r in self.rows if r["status"] not in ("ok", "skipped")
                or r.get("correct") is False]


def _anchor_rows(data: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    from flashtext.cost import attention_flops

    tokens, hidden = 16384, 2048  # the anchors' setting, stated in data["setting"]
    assert "16384" in data["setting"] and "2048" in data["setting"], data["setting"]
    rows = []
    for a in data["rows"]:
        for key, value in a.items():
            if key in ("d", "N", "causal"):
                continue
            provider, _, mode = key.rpartition("_")
            mode = {"fwd": "fwd", "fwdbwd": "fwd_bwd"}[mode]
            batch, heads = tokens // a["N"], hidden // a["d"]
            flops = attention_flops(batch, heads, a["N"], a["d"], causal=a["causal"], mode=mode)
            rows.append({"provider": provider, "mode": mode, "dtype": data["dtype"],
                         "d": a["d"], "causal": a["causal"], "n": a["N"], "batch": batch,
                         "heads": heads, "status": "ok", "reason": None, "flops": flops,
                         "tflops": value, "ms": flops / (value * 1e12) * 1e3})
    meta = {k: v for k, v in data.items() if k != "rows"}
    meta["kind"] = "anchors"
    return meta, rows


def stamp(payload: dict[str, Any]) -> dict[str, Any]:
    """Provenance for a payload measured in this process (what recorded.save adds on disk)."""
    import datetime

    import flashtext

    env = flashtext.environment()
    return {"gpu": env.device_name if env.is_gpu else "cpu",
            "date": datetime.date.today().isoformat(), "torch": env.torch,
            "triton": env.triton, **payload}


def load(name: str = RECORDED_NAME) -> Results:
    """Recorded results by name (``flashtext/data/<name>.json``), provenance checked."""
    return Results.from_payload(recorded.load(name))


def load_anchors() -> Results:
    return load(ANCHORS_NAME)


def anchors_or_none() -> Results | None:
    """The anchors, or None where they are not installed (context only, never required)."""
    try:
        return load_anchors()
    except FileNotFoundError:
        return None


def recorded_results() -> Results:
    """What a CPU reader sees: the full H200 run of ``make bench`` once it is recorded, the
    peers-only anchors until then. Re-running a notebook picks the newer file up."""
    try:
        return load(RECORDED_NAME)
    except FileNotFoundError:
        return load_anchors()


# ------------------------------------------------------------------------------ targets, ratios

@dataclass(frozen=True)
class Target:
    """One of the kernel's targets: ours / peer >= ratio (> ratio if strict) wherever it
    applies (mode, head dims, N >= n_min; both dtypes, causal and not)."""

    text: str
    mode: str
    ds: tuple[int, ...]
    peer: str
    ratio: float
    n_min: int = 0
    strict: bool = False
    soft: bool = False  # "where possible": reported, not counted as a miss

    def applies(self, mode: str, d: int, n: int) -> bool:
        return mode == self.mode and d in self.ds and n >= self.n_min

    def met(self, ratio: float) -> bool:
        return ratio > self.ratio if self.strict else ratio >= self.ratio


TARGETS = (
    Target("fwd, d=128, N>=2k: >= 1.05x SDPA cuDNN", "fwd", (128,), "cudnn", 1.05, 2048),
    Target("fwd, d=128, N>=2k: >= 1.5x SDPA flash (FA2)", "fwd", (128,), "flash", 1.5, 2048),
    Target("fwd, d=128, N>=2k: ahead of FlexAttention", "fwd", (128,), "flex", 1.0, 2048,
           strict=True),
    Target("fwd, d=64, N>=2k: >= 1.0x SDPA cuDNN", "fwd", (64,), "cudnn", 1.0, 2048),
    Target("fwd, d=64, N>=1k: >= 1.3x SDPA flash (FA2)", "fwd", (64,), "flash", 1.3, 1024),
    Target("fwd+bwd: >= 1.0x FlexAttention", "fwd_bwd", (64, 128), "flex", 1.0),
    Target("fwd+bwd: >= 1.3x SDPA flash (FA2)", "fwd_bwd", (64, 128), "flash", 1.3),
    Target("fwd+bwd, N>=2k: >= 0.9x SDPA cuDNN", "fwd_bwd", (64, 128), "cudnn", 0.9, 2048),
)


def ratio_rows(res: Results, ours: str = "ours", peers: Iterable[str] = PEERS
               ) -> list[dict[str, Any]]:
    """For every configuration where ``ours`` has a time: its TFLOP/s, each peer's, and the
    ratio ours / peer (the same as peer time / our time, since both do the same FLOPs)."""
    out = []
    for r in res.ok(provider=ours):
        key = {k: r[k] for k in ("mode", "dtype", "d", "causal", "n")}
        row = {**key, "ours": r["tflops"], "ours_ms": r["ms"],
               "correct": r.get("correct"), "t_compute_ms": r.get("t_compute_ms"),
               "t_memory_ms": r.get("t_memory_ms")}
        for p in peers:
            t = res.value(p, **key)
            row[p] = t
            row[f"ours/{p}"] = r["tflops"] / t if t else None
        out.append(row)
    return out


def evaluate_targets(res: Results, targets: Iterable[Target] = TARGETS
                     ) -> list[dict[str, Any]]:
    """Each target: how many configurations meet it, the worst ratio and where, and which
    configurations had no number for ours or the peer (a gap is never counted as met)."""
    ratios = ratio_rows(res)
    wanted = [(m, dt, d, c, n) for m in res.axis("mode") for dt in res.axis("dtype")
              for d in res.axis("d") for c in res.axis("causal") for n in res.axis("n")]
    out = []
    for t in targets:
        hits = [r for r in ratios if t.applies(r["mode"], r["d"], r["n"])]
        scored = [r for r in hits if r[f"ours/{t.peer}"] is not None]
        met = [r for r in scored if t.met(r[f"ours/{t.peer}"]) and r["correct"] is not False]
        have = {(r["mode"], r["dtype"], r["d"], r["causal"], r["n"]) for r in scored}
        missing = [w for w in wanted if t.applies(w[0], w[2], w[4]) and w not in have]
        worst = min(scored, key=lambda r: r[f"ours/{t.peer}"], default=None)
        if not scored:
            status = "no data"
        elif len(met) == len(scored):
            # every configuration with a number meets it, but some have none: not a verdict
            status = "met" if not missing else "met where measured"
        else:
            status = "partly met (soft target)" if t.soft else "missed"
        out.append({"target": t.text, "status": status, "met": len(met),
                    "scored": len(scored), "missing": len(missing),
                    "worst_ratio": worst[f"ours/{t.peer}"] if worst else None,
                    "worst_at": _where(worst) if worst else None,
                    "misses": [r for r in scored if r not in met]})
    return out


def memory_growth(res: Results, mode: str = "fwd_bwd") -> list[dict[str, Any]]:
    """Peak bytes per token at the largest N over the smallest N, per provider and setting.

    At a fixed number of tokens a kernel that never stores N x N scores stays near 1x; one
    that does (the math backend) grows like N."""
    out = []
    for p in res.providers():
        for dt in res.axis("dtype"):
            for d in res.axis("d"):
                for c in res.axis("causal"):
                    pts = sorted((r["n"], r["peak_bytes_per_token"]) for r in
                                 res.ok(provider=p, mode=mode, dtype=dt, d=d, causal=c)
                                 if r.get("peak_bytes_per_token"))
                    if len(pts) >= 2:
                        out.append({"provider": p, "dtype": dt, "d": d, "causal": c,
                                    "n_range": (pts[0][0], pts[-1][0]),
                                    "bytes_per_token": (pts[0][1], pts[-1][1]),
                                    "growth": pts[-1][1] / pts[0][1]})
    return out


def _where(r: dict[str, Any]) -> str:
    kind = "causal" if r["causal"] else "full"
    return f"{r['mode']} {SHORT_DTYPE.get(r['dtype'], r['dtype'])} d={r['d']} N={r['n']} {kind}"


# ------------------------------------------------------------------------------ text tables

def _n_label(n: int) -> str:
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)


def _fmt(x: float | None, spec: str = ".0f") -> str:
    if x is None:
        return "-"
    return format(x, ".2g" if spec == ".0f" and abs(x) < 10 else spec)


def summary_text(res: Results) -> str:
    """The end-of-run report: ratio tables against the targets, target verdicts, memory,
    correctness and failures. Compact enough to read at the end of a terminal log."""
    lines: list[str] = []
    ns = res.axis("n")
    ratios = ratio_rows(res)
    lines.append("TFLOP/s of ours, and ours / peer (ratio > 1: ours is faster); "
                 "* marks a ratio under its target, ! a wrong result")
    for mode in res.axis("mode"):
        for dt in res.axis("dtype"):
            for d in res.axis("d"):
                for c in res.axis("causal"):
                    sel = {r["n"]: r for r in ratios if (r["mode"], r["dtype"], r["d"],
                                                        r["causal"]) == (mode, dt, d, c)}
                    if not sel:
                        continue
                    head = f"{mode:7s} {SHORT_DTYPE.get(dt, dt)} d={d:<3d} " \
                           f"{'causal' if c else 'full  '}"
                    lines.append(head + " N=" + "".join(f"{_n_label(n):>7s}" for n in ns))
                    cells = [(_fmt(sel[n]["ours"]) + ("!" if sel[n]["correct"] is False
                                                     else "")) if n in sel else "-"
                             for n in ns]
                    lines.append(f"  {'ours TFLOP/s':27s}" + "".join(f"{x:>7s}" for x in cells))
                    for p in PEERS:
                        cells = []
                        for n in ns:
                            rr = sel.get(n, {}).get(f"ours/{p}")
                            flag = "*" if rr is not None and any(
                                t.peer == p and t.applies(mode, d, n) and not t.met(rr)
                                for t in TARGETS) else ""
                            cells.append(_fmt(rr, ".2f") + flag)
                        lines.append(f"  {'ours / ' + LABELS[p]:27s}"
                                     + "".join(f"{x:>7s}" for x in cells))
    lines.append("")
    lines.append(targets_text(res))
    growth = memory_growth(res)
    if growth:
        lines.append("")
        lines.append("Peak memory per token, fwd+bwd, largest N over smallest N "
                     "(flat ~1x; math grows like N):")
        for p in dict.fromkeys(g["provider"] for g in growth):
            gs = [g["growth"] for g in growth if g["provider"] == p]
            rng = next(g["n_range"] for g in growth if g["provider"] == p)
            lines.append(f"  {LABELS.get(p, p):22s} {min(gs):6.2f}x .. {max(gs):6.2f}x "
                         f"(N {rng[0]} -> {rng[1]})")
    lines.append("")
    wrong = [r for r in res.rows if r.get("correct") is False]
    for r in wrong[:20]:
        errs = ", ".join(f"{k} {v:.2g}" if isinstance(v, float) else f"{k} {v}"
                         for k, v in r["max_error"].items())
        lines.append(f"  WRONG RESULT {r['provider']} {_where(r)}: scaled max errors {errs} "
                     f"(tolerance {r['tolerance']:g})")
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for r in res.rows:
        if r["status"] != "ok":
            groups.setdefault((r["provider"], r["status"], str(r["reason"])[:110]), []).append(r)
    if groups:
        lines.append("Rows without a time, grouped (provider, status, reason, how many):")
    for (p, status, reason), rs in groups.items():
        lines.append(f"  {p:9s} {status:11s} x{len(rs):<3d} {reason}")
    timed = [r for r in res.ok() if not r.get("borrowed_from")]
    checked = [r for r in timed if "correct" in r]
    if checked:
        rest = "" if len(checked) == len(timed) else " (the rest were not checked)"
        lines.append(f"{len(checked) - len(wrong)} of {len(checked)} timed rows passed their "
                     f"float64 check{rest}.")
    else:
        lines.append("No float64 checks in these results.")
    if (res.meta.get("environment") or {}).get("timer") == "perf_counter":
        lines.insert(0, "CPU SMOKE TEST (Triton interpreter, CPU clock): the harness ran end to "
                        "end; these times and ratios mean nothing.")
    return "\n".join(lines)


def targets_text(res: Results) -> str:
    """One line per target: met / met where measured / missed / no data, how many
    configurations, the worst ratio and where."""
    lines = ["Targets:"]
    for t in evaluate_targets(res):
        worst = "" if t["worst_ratio"] is None else \
            f"; worst {t['worst_ratio']:.2f}x at {t['worst_at']}"
        gap = f"; {t['missing']} configurations without a number" if t["missing"] else ""
        lines.append(f"  [{t['status']:>18s}] {t['target']}: {t['met']}/{t['scored']}"
                     f"{worst}{gap}")
    return "\n".join(lines)


def anchor_comparison(res: Results, anchors: Results | None = None) -> str:
    """This run's fp16 numbers next to the anchors': per provider and mode, the median of
    (this run / anchor). Peers far from 1.0x mean this GPU or software stack differs (clocks,
    thermals, versions) and the anchors are only context; ours is printed against the anchors'
    cuDNN for orientation."""
    anchors = anchors or anchors_or_none()
    if anchors is None:
        return ""
    lines = ["fp16 against the anchors (median over matching configurations):"]
    for p in [p for p in res.providers() if p in anchors.providers() or p == "ours"]:
        for mode in ("fwd", "fwd_bwd"):
            ref = "cudnn" if p == "ours" else p
            ratios = []
            for r in res.ok(provider=p, mode=mode, dtype="float16"):
                if r.get("borrowed_from"):
                    continue
                a = anchors.value(ref, mode, "float16", r["d"], r["causal"], r["n"])
                if a:
                    ratios.append(r["tflops"] / a)
            if ratios:
                ratios.sort()
                med = ratios[len(ratios) // 2]
                lines.append(f"  {LABELS.get(p, p):22s} {mode:7s} {med:5.2f}x the anchors' "
                             f"{LABELS[ref]} ({len(ratios)} configurations)")
    return "\n".join(lines) if len(lines) > 1 else ""


def markdown_tables(res: Results) -> str:
    """Markdown for BENCHMARKS.md: the target verdicts, then every miss with the two roofline
    numbers first (FLOPs over the measured matmul ceiling, bytes over the measured copy
    bandwidth), our time and the peer's."""
    out = ["| target | status | met | worst ratio | where |", "|---|---|---|---|---|"]
    evaluated = evaluate_targets(res)
    for t in evaluated:
        worst = "-" if t["worst_ratio"] is None else f"{t['worst_ratio']:.2f}x"
        out.append(f"| {t['target']} | {t['status']} | {t['met']}/{t['scored']} | {worst} | "
                   f"{t['worst_at'] or '-'} |")
    out += ["", "| config | FLOPs / ceiling (ms) | bytes / ceiling (ms) | ours (ms) | "
            "peer | peer (ms) | ours / peer | target |", "|---|---|---|---|---|---|---|---|"]
    for t, spec in zip(evaluated, TARGETS, strict=True):
        for r in t["misses"]:
            peer_t = r[spec.peer]
            peer_ms = r["ours_ms"] * r[f"ours/{spec.peer}"] if peer_t else None
            out.append(f"| {_where(r)} | {_fmt(r['t_compute_ms'], '.3f')} | "
                       f"{_fmt(r['t_memory_ms'], '.4f')} | {r['ours_ms']:.3f} | "
                       f"{LABELS[spec.peer]} | {_fmt(peer_ms, '.3f')} | "
                       f"{r[f'ours/{spec.peer}']:.2f} | {spec.ratio:g} |")
    band = roof_band(res, res.axis("dtype")[0]) if res.rows else None
    out += ["", "What ours must reach (the peers of this run, hard targets only):", "",
            bars_markdown(res, (band[0] * 1e12, band[1] * 1e12) if band else None)]
    return "\n".join(out)


def target_bars(res: Results, matmul_flops: tuple[float, float] | None = None
                ) -> list[dict[str, Any]]:
    """The TFLOP/s our kernel must reach in each configuration to meet every (hard) target,
    given the peers' numbers in ``res``, and which peer sets that bar; with the measured
    matmul ceiling range (FLOP/s), also the bar as a fraction of it."""
    out = []
    for mode in res.axis("mode"):
        for dt in res.axis("dtype"):
            for d in res.axis("d"):
                for c in res.axis("causal"):
                    for n in res.axis("n"):
                        peers = {p: res.value(p, mode, dt, d, c, n) for p in PEERS}
                        bars = [(t.ratio * peers[t.peer], t) for t in TARGETS
                                if t.applies(mode, d, n) and not t.soft and peers[t.peer]]
                        if not bars:
                            continue
                        bar, t = max(bars, key=lambda b: b[0])
                        row = {"mode": mode, "dtype": dt, "d": d, "causal": c, "n": n,
                               **peers, "bar": bar, "set_by": f"{t.ratio:g}x {LABELS[t.peer]}"}
                        if matmul_flops:
                            row["bar_share"] = (bar * 1e12 / matmul_flops[1],
                                                bar * 1e12 / matmul_flops[0])
                        out.append(row)
    return out


def bars_markdown(res: Results, matmul_flops: tuple[float, float] | None = None) -> str:
    lines = ["| pass | dtype | d | mask | N | cuDNN | FA2 | Flex | bar for ours | set by | "
             "bar / matmul ceiling |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in target_bars(res, matmul_flops):
        share = "-" if "bar_share" not in r else \
            f"{r['bar_share'][0]:.0%}-{r['bar_share'][1]:.0%}"
        lines.append(f"| {r['mode'].replace('_', '+')} | {SHORT_DTYPE.get(r['dtype'])} | "
                     f"{r['d']} | {'causal' if r['causal'] else 'full'} | {r['n']} | "
                     f"{_fmt(r['cudnn'], '.1f')} | {_fmt(r['flash'], '.1f')} | "
                     f"{_fmt(r['flex'], '.1f')} | {r['bar']:.1f} | {r['set_by']} | {share} |")
    return "\n".join(lines)


# ------------------------------------------------------------------------------ figures

STYLE = {
    "ours": dict(color="#d62728", marker="o", lw=2.6, zorder=5),
    "triton": dict(color="#e377c2", marker="o", lw=1.3, ls=":"),
    "gluon": dict(color="#17becf", marker="o", lw=1.3, ls=":"),
    "cudnn": dict(color="#1f77b4", marker="s", lw=1.6),
    "flash": dict(color="#2ca02c", marker="^", lw=1.6),
    "flex": dict(color="#9467bd", marker="D", lw=1.6),
    "efficient": dict(color="#8c564b", marker="v", lw=1.3),
    "math": dict(color="#7f7f7f", marker="x", lw=1.3),
    "tutorial": dict(color="#ff7f0e", marker="P", lw=1.3),
}


def _log2_axis(ax, ns: list[int], tokens: int) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(ns)
    ax.set_xticklabels([_n_label(n) for n in ns])
    ax.set_xlabel(f"sequence length N (batch x N = {_n_label(tokens)} tokens)")


def _figure_legend(fig, axes) -> None:
    """One legend for a grid of panels, below it, each label once."""
    seen: dict[str, Any] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            seen.setdefault(label, handle)
    if not seen:
        return
    fig.legend(list(seen.values()), list(seen), loc="lower center", ncol=min(5, len(seen)),
               fontsize=8, frameon=False)


def plot_tflops(res: Results, *, dtype: str, d: int, causal: bool, mode: str, ax=None,
                anchors: Results | None = None, roof: tuple[float, float] | None = None,
                legend: bool = True):
    """TFLOP/s against N for every provider at one (dtype, d, causal, mode). ``anchors``
    adds the anchors' peers as thin dashed lines; ``roof`` shades the measured matmul
    ceiling (low, high) in TFLOP/s, chapter 1's compute roof."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(6, 4))
    ns = res.axis("n")
    for p in res.providers():
        pts = sorted((r["n"], r["tflops"]) for r in
                     res.ok(provider=p, mode=mode, dtype=dtype, d=d, causal=causal))
        if pts:
            wrong = any(r.get("correct") is False for r in
                        res.ok(provider=p, mode=mode, dtype=dtype, d=d, causal=causal))
            ax.plot(*zip(*pts, strict=True), **STYLE.get(p, {}),
                    label=LABELS.get(p, p) + (" (WRONG RESULTS)" if wrong else ""))
    if anchors is not None and not res.is_anchor and res.anchor_setting():
        for p in anchors.providers():
            pts = sorted((r["n"], r["tflops"]) for r in
                         anchors.ok(provider=p, mode=mode, dtype=dtype, d=d, causal=causal))
            if pts:
                style = {**STYLE.get(p, {}), "lw": 0.9, "ls": "--", "marker": "", "alpha": 0.7}
                ax.plot(*zip(*pts, strict=True), **style,
                        label=f"{LABELS.get(p, p)} (anchor)")
                ns = sorted(set(ns) | {n for n, _ in pts})
    if roof is not None:
        lo, hi = roof
        if hi - lo < 1:  # one value measured in this run: a line, not a band
            ax.axhline(lo, color="k", ls=":", lw=1)
        else:  # the recorded range of several matmul measurements
            ax.axhspan(lo, hi, color="k", alpha=0.08, lw=0)
        ax.text(0.01, lo, " matmul ceiling (measured)", fontsize=7, va="bottom",
                transform=ax.get_yaxis_transform())
    if ns:
        _log2_axis(ax, ns, res.tokens)
    ax.set_ylim(bottom=0)
    ax.set_ylabel("TFLOP/s")
    kind = "causal" if causal else "non-causal"
    name = "forward" if mode == "fwd" else "forward + backward"
    ax.set_title(f"{name}, {SHORT_DTYPE.get(dtype, dtype)}, d={d}, {kind}", fontsize=9)
    ax.grid(alpha=0.3)
    if legend:
        ax.legend(fontsize=7, loc="lower right")
    return ax


def roof_band(res: Results, dtype: str) -> tuple[float, float] | None:
    """The compute roof to draw: the matmul FLOP/s measured in this run, or for recorded H200
    results without one, the H200's measured bf16 matmul range from flashtext.hardware."""
    from flashtext.hardware import H200

    ceilings = res.meta.get("ceilings") or {}
    peak = (ceilings.get("matmul_flops") or {}).get(dtype)
    if peak:
        return peak / 1e12, peak / 1e12
    if "H200" in str(res.meta.get("gpu", "")) and H200.measured_matmul_flops:
        lo, hi = H200.measured_matmul_flops
        return lo / 1e12, hi / 1e12
    return None


def figure_tflops(res: Results, *, modes: Iterable[str] | None = None,
                  dtypes: Iterable[str] | None = None, ds: Iterable[int] | None = None,
                  causals: Iterable[bool] | None = None, anchors: Results | None = None):
    """A grid of :func:`plot_tflops` panels: rows (mode, dtype), columns (d, causal)."""
    import matplotlib.pyplot as plt

    modes = list(modes or res.axis("mode"))
    dtypes = list(dtypes or res.axis("dtype"))
    cols = [(d, c) for d in (ds or res.axis("d")) for c in (causals or res.axis("causal"))]
    rows = [(m, dt) for m in modes for dt in dtypes]
    fig, axes = plt.subplots(len(rows), len(cols), figsize=(4.2 * len(cols), 3.3 * len(rows)),
                             squeeze=False, sharey="row")
    for i, (mode, dt) in enumerate(rows):
        for j, (d, c) in enumerate(cols):
            plot_tflops(res, dtype=dt, d=d, causal=c, mode=mode, ax=axes[i][j],
                        anchors=anchors, roof=roof_band(res, dt), legend=False)
    fig.suptitle(_figure_title(res), fontsize=10)
    _figure_legend(fig, axes.ravel())
    fig.tight_layout(rect=(0, 0.4 / (3.3 * len(rows)), 1, 1))
    return fig


def _figure_title(res: Results) -> str:
    what = "peers only (anchors)" if res.is_anchor else "flashtext.bench"
    timer = (res.meta.get("environment") or {}).get("timer")
    note = "  [CPU smoke test: timings mean nothing]" if timer == "perf_counter" else ""
    return (f"{res.meta.get('gpu', '?')}, {res.meta.get('date', '?')}, torch "
            f"{res.meta.get('torch', '?')}, triton {res.meta.get('triton', '?')}: {what}{note}")


def plot_roofline(res: Results, *, mode: str = "fwd", dtype: str = "float16", ax=None,
                  ceilings: tuple[float, float] | None = None):
    """Chapter 1's roofline with every timed row of ``res`` on it: x = FLOPs over the bytes no
    kernel can avoid, y = TFLOP/s achieved. ``ceilings`` = (matmul FLOP/s, bandwidth B/s);
    default: the ones measured in the run, else the H200's measured ones."""
    import matplotlib.pyplot as plt
    import numpy as np

    from flashtext import roofline
    from flashtext.hardware import H200

    if ax is None:
        _, ax = plt.subplots(figsize=(7, 4.2))
    if ceilings is None:
        measured = res.meta.get("ceilings") or {}
        peak = (measured.get("matmul_flops") or {}).get(dtype)
        ceilings = (peak, measured["copy_bandwidth"]) if peak else (
            H200.measured_matmul_flops[1], H200.measured_copy_bandwidth)
    peak, bandwidth = ceilings
    gpu = replace(H200, name="measured ceilings", matmul_flops=peak, hbm_bandwidth=bandwidth)
    x = np.logspace(1, 4.3, 200)
    ax.loglog(x, roofline.attainable(gpu, x) / 1e12, "k-", lw=1.5,
              label=f"roof: {peak / 1e12:.0f} TFLOP/s, {bandwidth / 1e12:.2f} TB/s")
    ax.axvline(peak / bandwidth, color="grey", ls=":", lw=1)
    for p in res.providers():
        rows = [r for r in res.ok(provider=p, mode=mode, dtype=dtype)]
        if rows:
            ax.plot([r["flops"] / _min_bytes(r) for r in rows], [r["tflops"] for r in rows],
                    ls="none", ms=5, alpha=0.8, marker=STYLE.get(p, {}).get("marker", "o"),
                    color=STYLE.get(p, {}).get("color"), label=LABELS.get(p, p))
    ax.set_ylim(bottom=20)
    ax.set_xlabel("FLOPs per unavoidable byte (log)")
    ax.set_ylabel("TFLOP/s (log)")
    name = "forward" if mode == "fwd" else "forward + backward"
    ax.set_title(f"{name}, {SHORT_DTYPE.get(dtype, dtype)}: every d, mask and N on the "
                 f"roofline (ridge {peak / bandwidth:.0f} FLOP/B)", fontsize=9)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, loc="lower right")
    return ax


def _min_bytes(r: dict[str, Any]) -> float:
    from flashtext.bench.core import DTYPES, attention_min_bytes

    if "min_bytes" in r:
        return r["min_bytes"]
    return attention_min_bytes(r["batch"], r["heads"], r["n"], r["d"],
                               DTYPES[r["dtype"]].itemsize, r["mode"])


def plot_memory(res: Results, *, dtype: str, d: int, causal: bool, mode: str, ax=None,
                legend: bool = True):
    """Peak memory per token (bytes allocated by one call / (batch x N)) against N."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(6, 4))
    ns = res.axis("n")
    drawn = False
    for p in res.providers():
        pts = sorted((r["n"], r["peak_bytes_per_token"] / 1024) for r in
                     res.ok(provider=p, mode=mode, dtype=dtype, d=d, causal=causal)
                     if r.get("peak_bytes_per_token"))
        if pts:
            drawn = True
            ax.plot(*zip(*pts, strict=True), **STYLE.get(p, {}), label=LABELS.get(p, p))
    _log2_axis(ax, ns, res.tokens)
    ax.set_yscale("log")
    ax.set_ylabel("peak KiB per token (log)")
    name = "forward" if mode == "fwd" else "forward + backward"
    ax.set_title(f"memory of one {name} call, {SHORT_DTYPE.get(dtype, dtype)}, d={d}, "
                 f"{'causal' if causal else 'non-causal'}", fontsize=9)
    ax.grid(alpha=0.3, which="both")
    if not drawn:
        ax.text(0.5, 0.5, "no memory measured in these results", transform=ax.transAxes,
                ha="center")
    elif legend:
        ax.legend(fontsize=7)
    return ax


def figure_memory(res: Results, *, dtype: str | None = None, d: int | None = None,
                  causal: bool = False):
    """Memory against N for fwd and fwd+bwd side by side."""
    import matplotlib.pyplot as plt

    dtype = dtype or res.axis("dtype")[0]
    d = d or max(res.axis("d"))
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.3))
    for ax, mode in zip(axes, ("fwd", "fwd_bwd"), strict=True):
        plot_memory(res, dtype=dtype, d=d, causal=causal, mode=mode, ax=ax, legend=False)
    fig.suptitle(_figure_title(res), fontsize=9)
    _figure_legend(fig, axes)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    return fig
