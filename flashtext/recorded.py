"""Results measured on a real GPU, stored in the repo and shown to readers on a CPU.

Each file in ``flashtext/data/`` is JSON with at least ``gpu``, ``date``, ``torch``, ``triton``
(and whatever the measurement needs). :func:`load` reads one; :func:`show_banner` prints the
"recorded on ..." banner that must stand above every recorded figure; :func:`save` is used by the
measurement scripts (``scripts/``) that produce them on the GPU.
"""

from __future__ import annotations

import datetime as _dt
import json
from pathlib import Path
from typing import Any

from flashtext.show import banner

DATA_DIR = Path(__file__).parent / "data"
REQUIRED_KEYS = ("gpu", "date", "torch", "triton")


def path(name: str) -> Path:
    return DATA_DIR / (name if name.endswith(".json") else f"{name}.json")


def load(name: str) -> dict[str, Any]:
    """Load recorded results ``name`` (e.g. ``"h200_memory_wall"``) and check their provenance."""
    p = path(name)
    if not p.exists():
        available = ", ".join(sorted(f.stem for f in DATA_DIR.glob("*.json"))) or "none"
        raise FileNotFoundError(f"no recorded results named {name!r}; available: {available}")
    data = json.loads(p.read_text())
    missing = [k for k in REQUIRED_KEYS if k not in data]
    if missing:
        raise ValueError(f"recorded results {name!r} lack provenance keys {missing}")
    return data


def provenance(data: dict[str, Any]) -> str:
    return (f"Measured on {data['gpu']} on {data['date']} with torch {data['torch']}, "
            f"triton {data['triton']}.")


def show_banner(data: dict[str, Any], live: bool = False) -> None:
    """Print the banner that says where numbers come from."""
    if live:
        return
    from flashtext.device import on_gpu

    if on_gpu():
        note = "These are the stored numbers of that run, not a measurement of this GPU."
    else:
        note = "This machine has no CUDA GPU: these are stored numbers, not a live measurement."
    banner(provenance(data) + "\n" + note)


def save(name: str, payload: dict[str, Any]) -> Path:
    """Write results measured on this machine, stamped with GPU, versions and date."""
    import torch
    import triton

    record = {
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
        "date": _dt.date.today().isoformat(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        **payload,
    }
    p = path(name)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(record, indent=1) + "\n")
    return p
