"""Record the correctness sweep's worst errors per dtype on this machine (``make record-accuracy``).

On a CUDA GPU: the large sweep (N up to 2048, head_dim up to 256, fp32/fp16/bf16), written to
``flashtext/data/accuracy_<gpu>.json`` (``accuracy_h200.json`` on an H200). On a CPU: the small
interpreter sweep (fp32/fp16; bf16 tl.dot is wrong in the interpreter), written to
``flashtext/data/accuracy_cpu.json``. Each case compares O, lse, dQ, dK, dV of our kernels and
of PyTorch in the same dtype against float64 (see :mod:`flashtext.kernels.accuracy`); the script
exits non-zero if any case is outside its bound. On the H200 nearly all of its time is Triton
compiling the kernels of each case on one core: `--jobs 12` spreads the cases over worker
processes. About 30 s on a CPU.

    python scripts/record_accuracy.py [--dry-run] [--jobs N]
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import asdict
from pathlib import Path

# appended: a flashtext tree first on PYTHONPATH (scripts/probe_variants.py) wins over the checkout
sys.path.append(str(Path(__file__).resolve().parents[1]))

import flashtext  # noqa: E402  (decides compiled GPU vs interpreter before triton loads)
from flashtext import recorded  # noqa: E402
from flashtext.kernels.accuracy import (  # noqa: E402
    CANCELLATION,
    EXP2_APPROX_ULPS,
    FACTOR,
    MEASURED,
    QUANTITIES,
    RECOMPUTE,
    SCORE_ROUNDING,
    ULPS,
    measure,
    sweep_cases,
)

CRITERION = (f"ours <= {FACTOR} * torch + {ULPS} u |ref| + c u32 (|lse| + a) |ref| (c = "
             f"{SCORE_ROUNDING} for O, {RECOMPUTE} for the gradients, 0 for lse; a = "
             f"{EXP2_APPROX_ULPS} compiled on a GPU, else 0) + {CANCELLATION} u32 * cancellation "
             "scale for dQ and dK (the dP - D noise, flashtext.kernels.accuracy)")


def machine_name() -> str:
    if not flashtext.on_gpu():
        return "cpu"
    name = flashtext.environment().device_name.lower()
    return "h200" if "h200" in name else "".join(c if c.isalnum() else "_" for c in name)


def measure_row(case, device: str) -> tuple[dict, list[str]]:
    """One case: the recorded row (errors of ours and PyTorch, bounds) and its failures. A
    plain function, so that ``--jobs`` workers can run it."""
    errors = measure(case, device, grads=True)
    row = {"case": asdict(case), "ours": errors.ours, "torch": errors.torch,
           "bound": {n: errors.bound(n) for n in QUANTITIES}}
    return row, [f"{case.label()}: {f}" for f in errors.failures()]


def measured_rows(cases: list, device: str, jobs: int):
    """(case, row, failures) in the sweep's order. ``jobs > 1``: that many worker processes
    (spawned: CUDA does not survive a fork), each compiling its own kernels; on the H200
    compiling is nearly all of the time, and one process compiles on one core."""
    if jobs <= 1:
        yield from ((case, *measure_row(case, device)) for case in cases)
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [pool.submit(measure_row, case, device) for case in cases]
        for case, future in zip(cases, futures, strict=True):
            yield (case, *future.result())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="measure, print, do not save")
    parser.add_argument("--jobs", type=int, default=1,
                        help="worker processes (the results do not depend on it)")
    args = parser.parse_args(argv)

    on_gpu = flashtext.on_gpu()
    device = str(flashtext.torch_device())
    dtypes = ("float32", "float16", "bfloat16") if on_gpu else ("float32", "float16")
    cases = sweep_cases("gpu" if on_gpu else "cpu", dtypes)
    print(flashtext.environment().summary())
    print(f"{len(cases)} cases on {device}, {max(args.jobs, 1)} process(es)")

    rows, failures = [], []
    worst: dict[str, dict[str, dict]] = {d: {} for d in dtypes}
    start = time.perf_counter()
    for i, (case, row, failed) in enumerate(measured_rows(cases, device, args.jobs), 1):
        rows.append(row)
        for name in QUANTITIES:
            best = worst[case.dtype].get(name)
            if best is None or row["ours"][name] > best["ours"]:
                worst[case.dtype][name] = {"ours": row["ours"][name],
                                           "torch": row["torch"][name],
                                           "case": case.label()}
        failures += failed
        print(f"[{i:3d}/{len(cases)}] {case.label():48s} "
              + " ".join(f"{n} {row['ours'][n]:.1e}" for n in QUANTITIES), flush=True)
    seconds = time.perf_counter() - start

    print("\nworst |ours - float64| per dtype (PyTorch in the same dtype, same case):")
    for dtype in dtypes:
        print(f"  {dtype:9s} " + "  ".join(
            f"{n} {w['ours']:.1e} (torch {w['torch']:.1e})" for n, w in worst[dtype].items()))
    if failures:
        print("\nOUTSIDE THE BOUND:\n  " + "\n  ".join(failures))

    payload = {
        "what": "correctness sweep: max |ours - float64| vs max |PyTorch same dtype - float64|",
        "criterion": CRITERION,
        "device": flashtext.environment().device_name,
        "interpreter": flashtext.environment().interpreter,
        "python": flashtext.environment().python,
        "numpy": flashtext.environment().numpy,
        "n_cases": len(cases),
        "seconds": round(seconds, 1),
        "failures": failures,
        "worst": worst,
        "cases": rows,
    }
    if not args.dry_run:
        path = recorded.save(f"accuracy_{machine_name()}", payload, measured=MEASURED)
        print(f"\nwrote {path}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
