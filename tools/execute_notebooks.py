"""Execute chapters in place, top to bottom, and store them in the book's format.

    python tools/execute_notebooks.py chapters/02_streaming_softmax.ipynb [...]

Run through ``make notebooks`` (which sets FLASHTEXT_STATIC=1 so widgets store static figures).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

sys.path.insert(0, str(Path(__file__).parent))
from notebook_format import clean, problems  # noqa: E402


def execute(path: Path, timeout: int = 600) -> float:
    nb = nbformat.read(path, as_version=4)
    start = time.perf_counter()
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", record_timing=False,
                            resources={"metadata": {"path": str(path.parent)}})
    client.execute()
    elapsed = time.perf_counter() - start
    clean(nb)
    nbformat.write(nb, path)
    left = problems(nb)
    if left:
        raise SystemExit(f"{path}: " + "; ".join(left))
    return elapsed


def main(paths: list[str]) -> None:
    for p in paths:
        elapsed = execute(Path(p))
        print(f"{p}: executed in {elapsed:.1f} s")


if __name__ == "__main__":
    main(sys.argv[1:])
