"""Nsight Compute (``ncu``) for the measurement scripts: find it, run a driver under it, read its
raw CSV, and group the kernels it profiled by the configuration that launched them.

A script that uses it runs itself as the *driver* under ``ncu --profile-from-start off``: the
driver opens the profiler only around the calls to measure, runs each configuration on its own
CUDA stream (so consecutive kernels on one stream belong to one configuration), and prints the
order of its configurations as one line (:func:`announce_order`) that :func:`profile` reads back.
Used by ``scripts/record_hbm_traffic.py`` and ``scripts/record_ncu_kernels.py``.
"""

from __future__ import annotations

import csv
import glob
import io
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

UNITS = {"byte": 1, "kbyte": 1e3, "mbyte": 1e6, "gbyte": 1e9, "tbyte": 1e12,
         "kibyte": 1024, "mibyte": 1024**2, "gibyte": 1024**3}
ORDER_PREFIX = "DRIVER-ORDER "


def find_ncu() -> str | None:
    """The ncu binary: on PATH, else the newest under the usual CUDA and Nsight folders."""
    found = shutil.which("ncu")
    if found:
        return found
    for pattern in ("/opt/nvidia/nsight-compute/*/ncu", "/usr/local/cuda*/bin/ncu",
                    "/usr/local/cuda*/nsight-compute*/ncu", "/opt/nvidia/nsight-compute/ncu"):
        hits = sorted(glob.glob(pattern))
        if hits:
            return hits[-1]
    return None


def ncu_version(ncu: str) -> str:
    out = subprocess.run([ncu, "--version"], capture_output=True, text=True).stdout
    return out.strip().splitlines()[-1] if out.strip() else "unknown"


def _number(text: str) -> float:
    return float(text.replace(",", "").strip() or "nan")


def parse_raw_csv(text: str, metrics: list[str]) -> list[dict[str, Any]]:
    """Rows of ncu's raw page (one per kernel): name, stream, and each metric present, in base
    units (bytes, ns) when the second row is a unit row (converted through :data:`UNITS`)."""
    lines = [ln for ln in text.splitlines() if ln.startswith('"')]
    rows = list(csv.reader(io.StringIO("\n".join(lines))))
    if len(rows) < 2:
        raise ValueError("ncu printed no kernel rows")
    header, units = rows[0], rows[1]
    name_col = header.index("Kernel Name" if "Kernel Name" in header else "Function Name")
    has_units = units[name_col] == ""
    body = rows[2:] if has_units else rows[1:]
    kernels = []
    for row in body:
        rec: dict[str, Any] = {"kernel": row[name_col], "stream": row[header.index("Stream")]}
        for m in metrics:
            if m in header:
                col = header.index(m)
                scale = UNITS.get(units[col].strip().lower(), 1) if has_units else 1
                rec[m] = _number(row[col]) * scale
        kernels.append(rec)
    return kernels


def group_by_stream(kernels: list[dict[str, Any]], n_configs: int) -> list[list[dict[str, Any]]]:
    """Consecutive kernels on the same stream belong to one configuration; there must be
    ``n_configs`` groups."""
    groups: list[list[dict[str, Any]]] = []
    for k in kernels:
        if groups and groups[-1][0]["stream"] == k["stream"]:
            groups[-1].append(k)
        else:
            groups.append([k])
    if len(groups) != n_configs:
        raise ValueError(f"expected {n_configs} stream groups, found {len(groups)}")
    return groups


def announce_order(order: list[dict[str, Any]]) -> None:
    """The driver's last word: the configurations it profiled, in order, for :func:`profile`."""
    print(ORDER_PREFIX + json.dumps(order), flush=True)


def profile(ncu: str, driver: list[str], attempts: list[tuple[list[str], list[str]]],
            options: list[str] | tuple[str, ...] = (), timeout: float = 500) -> dict[str, Any]:
    """Run ``driver`` (a command line) under ncu with the raw CSV page, trying each
    (metrics, extra flags) of ``attempts`` until one parses: metrics an older ncu or this GPU
    lacks make it fail, so later attempts ask for fewer. Returns ``{"ok": True, "command",
    "metrics", "seconds", "kernels", "order"}`` or ``{"ok": False, "error"}``: nothing is
    invented when ncu cannot read the counters."""
    if not attempts:
        raise ValueError("attempts must name at least one (metrics, flags) pair")
    err = "not run"
    for metrics, flags in attempts:
        with tempfile.TemporaryDirectory() as tmp:
            log = os.path.join(tmp, "ncu.csv")
            prefix = [ncu, "--profile-from-start", "off", *options, "--metrics",
                      ",".join(metrics), "--csv", "--page", "raw", *flags]
            t0 = time.time()
            proc = subprocess.run([*prefix, "--log-file", log, *driver], capture_output=True,
                                  text=True, timeout=timeout)
            elapsed = time.time() - t0
            text = Path(log).read_text() if os.path.exists(log) else ""
        order = [ln for ln in proc.stdout.splitlines() if ln.startswith(ORDER_PREFIX)]
        if proc.returncode == 0 and order and text.strip():
            try:
                kernels = parse_raw_csv(text, metrics)
            except (ValueError, IndexError) as exc:
                err = f"could not parse ncu output: {exc}; head: {text[:800]}"
                continue
            return {"ok": True, "command": " ".join(prefix), "metrics": metrics,
                    "seconds": round(elapsed, 1), "kernels": kernels,
                    "order": json.loads(order[0].removeprefix(ORDER_PREFIX))}
        err = (f"ncu exited {proc.returncode}; stderr tail: {proc.stderr[-1500:]}; "
               f"stdout tail: {proc.stdout[-800:]}; log head: {text[:800]}")
    return {"ok": False, "error": err}
