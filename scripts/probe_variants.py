"""Time variants of the kernels side by side on one GPU, in one run (predict, change, measure).

    python scripts/probe_variants.py --out-dir DIR --variant NAME=TREE[:VAR=VALUE,...] ...
                                     [--profile] -- <arguments for python -m flashtext.bench>

A variant is a directory TREE holding a ``flashtext`` package (for a branch:
``mkdir -p probe/x && git archive <branch> flashtext | tar -x -C probe/x``) and optional
environment variables. Each runs in a fresh process with TREE first on the import path:
``python -m flashtext.bench --providers ours --no-plot --no-memory --out probe_NAME <args>``
(the benchmark's own method and float64 checks), and with ``--profile`` also
``scripts/profile_kernels.py`` (time per kernel). Results go to DIR/NAME.json and
DIR/NAME_profile.json; a table of our TFLOP/s per configuration and variant closes the run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def parse_variant(text: str) -> tuple[str, Path, dict[str, str]]:
    name, _, rest = text.partition("=")
    tree, _, env_text = rest.partition(":")
    if not name or not tree:
        raise argparse.ArgumentTypeError(f"--variant wants NAME=TREE[:VAR=VALUE,...], got {text!r}")
    env = dict(item.split("=", 1) for item in env_text.split(",") if item) if env_text else {}
    return name, Path(tree).resolve(), env


def run_variant(name: str, tree: Path, env_extra: dict[str, str], bench_args: list[str],
                out_dir: Path, profile: bool) -> dict:
    if not (tree / "flashtext" / "__init__.py").exists():
        raise SystemExit(f"variant {name}: {tree} holds no flashtext package")
    env = dict(os.environ, **env_extra)
    env["PYTHONPATH"] = os.pathsep.join([str(tree), *filter(None, [env.get("PYTHONPATH")])])
    t0 = time.time()
    cmd = [sys.executable, "-m", "flashtext.bench", "--providers", "ours", "--no-plot",
           "--no-memory", "--out", f"probe_{name}", *bench_args]
    proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
    (out_dir / f"{name}.log").write_text(proc.stdout + proc.stderr)
    result = tree / "flashtext" / "data" / f"probe_{name}.json"
    rows = json.loads(result.read_text())["rows"] if result.exists() else []
    if result.exists():
        shutil.copy(result, out_dir / f"{name}.json")
    if profile:
        subprocess.run([sys.executable, str(ROOT / "scripts" / "profile_kernels.py"), "--d", "64",
                        "128", "--json", str(out_dir / f"{name}_profile.json")],
                       cwd=tree, env=env, capture_output=True, text=True)
    print(f"{name}: exit {proc.returncode}, {len(rows)} rows, {time.time() - t0:.0f} s",
          flush=True)
    return {(r["mode"], r["dtype"], r["d"], r["causal"], r["n"]): r for r in rows
            if r.get("tflops")}


def main() -> None:
    argv = sys.argv[1:]
    bench_args = argv[argv.index("--") + 1:] if "--" in argv else []
    own = argv[:argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variant", action="append", type=parse_variant, required=True)
    ap.add_argument("--out-dir", type=Path, required=True)
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args(own)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    results = {name: run_variant(name, tree, env, bench_args, args.out_dir, args.profile)
               for name, tree, env in args.variant}
    names = list(results)
    keys = sorted({k for rows in results.values() for k in rows}, key=str)
    print("mode     dtype    d  causal      N  " + "  ".join(f"{n:>12s}" for n in names))
    for key in keys:
        cells = []
        for n in names:
            r = results[n].get(key)
            cells.append(f"{r['tflops']:7.1f}{'' if r['correct'] else '!WRONG':>5s}" if r
                         else f"{'-':>12s}")
        mode, dtype, d, causal, n_ctx = key
        print(f"{mode:8s} {dtype:8s} {d:3d}  {causal!s:6s} {n_ctx:6d}  " + "  ".join(cells))


if __name__ == "__main__":
    main()
