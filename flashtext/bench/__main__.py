"""``python -m flashtext.bench``: the command line of the benchmark harness (``make bench``).

Every list flag takes space- or comma-separated values; N accepts ``k`` suffixes (``2k``).
Results go to ``flashtext/data/<out>.json`` (stamped with GPU, versions and date by
:func:`flashtext.recorded.save`; rewritten after every configuration, so an interrupted run
keeps what it measured) and the figures to ``artifacts/<out>.png`` and
``artifacts/<out>_memory.png``. Exit status 1 if our kernel gave a wrong result anywhere.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

import flashtext
from flashtext import recorded
from flashtext.bench import consistency, core, providers, report, sweep

ARTIFACTS = Path("artifacts")


def _split(values: list[str] | None) -> list[str] | None:
    if values is None:
        return None
    return [v for item in values for v in item.split(",") if v]


def _parse_n(text: str) -> int:
    m = re.fullmatch(r"(\d+)([kK]?)", text.strip())
    if not m:
        raise argparse.ArgumentTypeError(f"N must be an integer like 4096 or 4k, got {text!r}")
    return int(m.group(1)) * (1024 if m.group(2) else 1)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m flashtext.bench",
        description="Benchmark flashtext's attention kernel against SDPA's backends and "
                    "FlexAttention (TFLOP/s, memory, correctness). Without a CUDA GPU it "
                    "runs the --quick smoke test instead.",
        epilog="Examples:\n"
               "  make bench                                     # the full sweep (~8 min H200)\n"
               "  make bench BENCH_ARGS='--dtype fp16 --d 128 --mode fwd --providers ours "
               "cudnn flash --out tune'\n"
               "  python -m flashtext.bench --report bench_h200_v2  # tables of a recorded run",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    sel = ap.add_argument_group("what to measure (default: everything)")
    sel.add_argument("--dtype", nargs="+", help="fp16 bf16 (fp32 also accepted)")
    sel.add_argument("--d", nargs="+", help="head dims, e.g. 64 128")
    sel.add_argument("--causal", choices=("both", "true", "false"), default=None,
                     help="causal, non-causal, or both (default both)")
    sel.add_argument("--mode", nargs="+", help="fwd fwd_bwd")
    sel.add_argument("--providers", nargs="+",
                     help=f"any of {' '.join(providers.PROVIDERS)}")
    sel.add_argument("--n", nargs="+", help="sequence lengths, e.g. 512 1k 2k 4k 8k 16k")
    sel.add_argument("--quick", action="store_true",
                     help="CPU smoke test: tiny shapes, one timed call, no timing claims")
    how = ap.add_argument_group("how")
    how.add_argument("--warmup", type=float, default=None, help="do_bench warm-up, ms (25)")
    how.add_argument("--rep", type=float, default=None, help="do_bench measuring time, ms (100)")
    how.add_argument("--rounds", type=int, default=None,
                     help="time each configuration's providers this many times, each round in "
                     "a rotated order, and pool the calls (1)")
    how.add_argument("--rounds-max-n", type=_parse_n, default=None,
                     help="with --rounds: the extra rounds only for N up to this, e.g. 2k "
                     "(every N)")
    how.add_argument("--math-max-n", type=_parse_n, default=None,
                     help="largest N for the math backend (4096)")
    how.add_argument("--no-check", action="store_true", help="skip the float64 checks")
    how.add_argument("--no-memory", action="store_true", help="skip the peak-memory call")
    how.add_argument("--budget-min", type=float, default=None,
                     help="stop starting configurations after this many minutes (8.5; 0 = none)")
    how.add_argument("--flex-compile", choices=sorted(providers.FLEX_COMPILE), default=None,
                     help="auto (default): torch.compile(flex_attention) as the anchors ran it, "
                          "static after the first N, dynamic after; static: a kernel per shape "
                          "(slowest sweep); dynamic: one dynamic-shape kernel")
    how.add_argument("--seed", type=int, default=0)
    out = ap.add_argument_group("output")
    out.add_argument("--out", default=None,
                     help="results name: flashtext/data/NAME.json and artifacts/NAME*.png "
                          "(default bench_<gpu>, e.g. bench_h200, for the full sweep or with "
                          "--merge; bench_<gpu>_subset for a focused selection; --quick "
                          "saves no JSON)")
    out.add_argument("--merge", action="store_true",
                     help="merge into an existing NAME.json (same GPU and versions), replacing "
                          "the rows measured again: finish a sweep in several runs")
    out.add_argument("--no-plot", action="store_true", help="do not draw the PNG figures")
    out.add_argument("--report", metavar="NAME", default=None,
                     help="measure nothing: print the tables of recorded results NAME "
                          "(and redraw their figures)")
    out.add_argument("--peers-from", metavar="NAME", default=None,
                     help="for tuning: take the peers this run did not measure from recorded "
                          "results NAME (e.g. bench_h200_v2 or h200_peers_fp16) when printing "
                          "ratios; the JSON keeps only what this run measured")
    out.add_argument("--markdown", action="store_true",
                     help="also print markdown tables for BENCHMARKS.md")
    out.add_argument("--plan", action="store_true",
                     help="print the configurations that would run, then stop")
    return ap


def settings_from_args(args: argparse.Namespace, quick: bool) -> core.Settings:
    given: dict[str, Any] = {}
    if args.dtype:
        given["dtypes"] = tuple(_split(args.dtype))
    if args.d:
        given["ds"] = tuple(int(x) for x in _split(args.d))
    if args.causal:
        given["causals"] = {"both": (False, True), "true": (True,), "false": (False,)}[
            args.causal]
    if args.mode:
        given["modes"] = tuple(_split(args.mode))
    if args.providers:
        given["providers"] = tuple(_split(args.providers))
    if args.n:
        given["ns"] = tuple(_parse_n(x) for x in _split(args.n))
    if args.warmup is not None:
        given["warmup_ms"] = args.warmup
    if args.rep is not None:
        given["rep_ms"] = args.rep
    if args.rounds is not None:
        given["rounds"] = args.rounds
    if args.rounds_max_n is not None:
        given["rounds_max_n"] = args.rounds_max_n
    if args.math_max_n is not None:
        given["math_max_n"] = args.math_max_n
    if args.no_check:
        given["check"] = False
    if args.no_memory:
        given["memory"] = False
    if args.budget_min is not None:
        given["budget_s"] = args.budget_min * 60 if args.budget_min > 0 else None
    if args.flex_compile:
        given["flex_compile"] = args.flex_compile
    given["seed"] = args.seed
    return core.Settings.quick_preset(**given) if quick else core.Settings(**given)


def default_name(gpu_name: str) -> str:
    """bench_h200 for "NVIDIA H200"; bench_<slug> for any other GPU."""
    words = [w for w in re.split(r"[^a-z0-9]+", gpu_name.lower()) if w and w != "nvidia"]
    return "bench_" + ("_".join(words) or "gpu")


SELECTION = ("dtypes", "ds", "causals", "modes", "ns", "providers")


def full_sweep(settings: core.Settings) -> bool:
    """Whether the selection is the whole default sweep (then it may write bench_<gpu>)."""
    full = core.Settings()
    return all(set(getattr(settings, k)) == set(getattr(full, k)) for k in SELECTION)


def merge(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """New rows replace old rows of the same (provider, mode, dtype, d, causal, n)
    (:func:`flashtext.recorded.merge_runs`: the file's settings, ceilings and providers still
    describe the whole sweep; each run's ceilings stay in its record under ``runs``)."""
    return recorded.merge_runs(
        old, new, lambda r: (r["provider"], r["mode"], r["dtype"], r["d"], r["causal"], r["n"]),
        _run_record)


def _run_record(payload: dict[str, Any]) -> dict[str, Any]:
    return {"started": payload.get("started"),
            "argv": (payload.get("environment") or {}).get("argv"),
            "elapsed_s": payload.get("elapsed_s"), "rows": len(payload.get("rows", [])),
            "ceilings": payload.get("ceilings")}


def save(name: str, payload: dict[str, Any], do_merge: bool) -> Path:
    if do_merge and recorded.path(name).exists():
        import json

        payload = merge(json.loads(recorded.path(name).read_text()), report.stamp(payload))
    ours = "ours" in (payload.get("settings") or {}).get("providers", ())
    return recorded.save(name, {k: v for k, v in payload.items()
                                if k not in ("gpu", "date", "torch", "triton")},
                         measured=("flashtext.kernels.api",) if ours else ())


def resume_args(skipped: list[dict[str, Any]], settings: core.Settings, name: str | None
                ) -> str:
    """Flags that re-run just the configurations a time budget cut off (a superset at worst:
    each flag lists the values the skipped rows have), merged into the same file."""
    def values(key):
        return sorted({r[key] for r in skipped})

    causal = values("causal")
    parts = ["--dtype " + " ".join(core.SHORT_DTYPE[x] for x in values("dtype")),
             "--d " + " ".join(str(x) for x in values("d")),
             "--causal " + ("both" if len(causal) == 2 else str(causal[0]).lower()),
             "--n " + " ".join(str(x) for x in values("n")),
             "--mode " + " ".join(settings.modes),
             "--providers " + " ".join(settings.providers), "--merge"]
    if settings.rounds > 1:  # the rest is timed as the first part was
        parts.append(f"--rounds {settings.rounds}")
        if settings.rounds_max_n is not None:
            parts.append(f"--rounds-max-n {settings.rounds_max_n}")
    return " ".join(parts + ([f"--out {name}"] if name else []))


def draw(res: report.Results, name: str) -> list[Path]:
    """The two PNGs of a run; skipped with a note where matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed here: no figures drawn (the JSON has everything)")
        return []
    ARTIFACTS.mkdir(exist_ok=True)
    anchors = report.anchors_or_none()
    paths = []
    for fig, suffix in ((report.figure_tflops(res, anchors=anchors), ""),
                        (report.figure_memory(res), "_memory")):
        path = ARTIFACTS / f"{name}{suffix}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


def borrow_peers(res: report.Results, name: str) -> report.Results:
    """``res`` plus the peer rows of recorded results ``name`` for configurations ``res`` did
    not measure that peer in, each marked ``borrowed_from``."""
    other = report.load(name)

    def key(r):
        return (r["provider"], r["mode"], r["dtype"], r["d"], r["causal"], r["n"])

    have = {key(r) for r in res.rows if r["status"] == "ok"}
    ours = {key(r)[1:] for r in res.rows if r["provider"] == "ours"}
    extra = [{**r, "borrowed_from": name} for r in other.rows
             if r["provider"] != "ours" and key(r) not in have and key(r)[1:] in ours]
    return report.Results(res.meta, [r for r in res.rows if r["status"] == "ok" or
                                     r["provider"] == "ours"] + extra)


def print_report(res: report.Results, markdown: bool, peers_from: str | None = None) -> None:
    if peers_from:
        res = borrow_peers(res, peers_from)
        print(f"\nNOTE: peers not measured in this run are taken from {peers_from} "
              f"({recorded.provenance(report.load(peers_from).meta)}). Ratios are for tuning "
              "only: the targets count peers measured side by side in one run.")
    print()
    print(report.summary_text(res))
    host = consistency.host_set_text(res)
    if host:
        print("\n" + host)
    text = "" if res.is_anchor else report.anchor_comparison(res)
    if text:
        print()
        print(text)
    if markdown:
        print()
        print(report.markdown_tables(res))


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("MPLBACKEND", "Agg")
    args = parser().parse_args(argv)
    if args.report:
        res = report.load(args.report)
        print(recorded.provenance(res.meta))
        print_report(res, args.markdown, args.peers_from)
        if not args.no_plot:
            for p in draw(res, args.report):
                print(f"figure: {p}")
        return 0
    env = flashtext.report()
    quick = args.quick
    if not quick and not (env.is_gpu and not env.interpreter):
        print("No CUDA GPU with compiled Triton here: running the CPU quick check instead "
              "(--quick). It proves the harness runs; its times mean nothing.")
        quick = True
    try:
        settings = settings_from_args(args, quick)
    except ValueError as exc:
        parser().error(str(exc))
    configs = settings.configs()
    print(f"{len(configs)} configurations x {len(settings.providers)} providers x "
          f"{len(settings.modes)} modes; setting batch*N = {settings.tokens}, heads*d = "
          f"{settings.hidden}; do_bench warmup {settings.warmup_ms:g} ms, rep "
          f"{settings.rep_ms:g} ms; budget "
          f"{'none' if settings.budget_s is None else f'{settings.budget_s / 60:g} min'}")
    if args.plan:
        for c in configs:
            print("  " + c.label())
        return 0
    name = args.out or (None if quick else default_name(env.device_name))
    if name and not args.out and not args.merge and not full_sweep(settings):
        name += "_subset"  # a focused run never overwrites the full results by default
    started = time.strftime("%Y-%m-%d %H:%M:%S")

    def checkpoint(partial: dict[str, Any]) -> None:
        if name:
            save(name, {**partial, "started": started}, args.merge)

    payload = {**sweep.run(settings, on_config=checkpoint), "started": started}
    res = report.Results.from_payload(report.stamp(payload))
    if name:
        path = save(name, payload, args.merge)
        res = report.load(name)  # what was written, merged rows included
        print(f"\nresults: {path}")
    print_report(res, args.markdown, args.peers_from)
    if not args.no_plot:
        for p in draw(res, name or "bench_quick"):
            print(f"figure: {p}")
    skipped = [r for r in res.rows if r["status"] == "skipped" and "budget" in (r["reason"] or "")]
    if skipped:
        print(f"\nTIME BUDGET: {len(skipped)} rows were not measured. Finish them with:\n"
              f"  make bench BENCH_ARGS='{resume_args(skipped, settings, name)}'")
    if payload["cuda_lost"]:
        print(f"\nCUDA CONTEXT LOST: {payload['cuda_lost']}\nRerun that provider alone with "
              "CUDA_LAUNCH_BLOCKING=1 to find the faulting launch.")
    print(f"\nelapsed {payload['elapsed_s']:.0f} s")
    wrong = [r for r in res.rows if r["provider"] in ("ours", "triton", "gluon")
             and r.get("correct") is False]
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
