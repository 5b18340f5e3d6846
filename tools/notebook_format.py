"""How the book's notebooks are stored (the policy in README's contributing section).

Notebooks are committed *with outputs* from one top-to-bottom run on the CPU path
(``make notebooks``), so a reader browsing the repo sees figures, and nbval can compare the cells
marked ``# NBVAL_CHECK_OUTPUT``. Stored metadata is kept minimal and identical across chapters.
"""

from __future__ import annotations

import nbformat

KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
LANGUAGE_INFO = {"name": "python"}
ALLOWED_NOTEBOOK_METADATA = {"kernelspec", "language_info"}
ALLOWED_CELL_METADATA = {"tags"}


def clean(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Strip per-machine metadata (widget state, timings, trust) and pin the kernelspec."""
    nb.metadata = nbformat.from_dict({"kernelspec": KERNELSPEC, "language_info": LANGUAGE_INFO})
    for cell in nb.cells:
        cell.metadata = nbformat.from_dict(
            {k: v for k, v in cell.metadata.items() if k in ALLOWED_CELL_METADATA}
        )
        if cell.cell_type == "code":
            for out in cell.get("outputs", []):
                out.get("metadata", {}).pop("application/vnd.jupyter.widget-view+json", None)
                data = out.get("data", {})
                data.pop("application/vnd.jupyter.widget-view+json", None)
    return nb


def problems(nb: nbformat.NotebookNode) -> list[str]:
    """Everything about a stored notebook that breaks the policy."""
    found = []
    if dict(nb.metadata.get("kernelspec", {})) != KERNELSPEC:
        stored = dict(nb.metadata.get("kernelspec", {}))
        found.append(f"kernelspec is {stored}, expected {KERNELSPEC}")
    extra = set(nb.metadata) - ALLOWED_NOTEBOOK_METADATA
    if extra:
        found.append(f"notebook metadata has per-machine keys {sorted(extra)}")
    counts = []
    for i, cell in enumerate(nb.cells):
        extra = set(cell.metadata) - ALLOWED_CELL_METADATA
        if extra:
            found.append(f"cell {i} metadata has keys {sorted(extra)}")
        if cell.cell_type != "code":
            continue
        counts.append(cell.execution_count)
        for out in cell.get("outputs", []):
            if out.output_type == "error":
                found.append(f"cell {i} has a stored error output ({out.get('ename')})")
            if "application/vnd.jupyter.widget-view+json" in out.get("data", {}):
                found.append(f"cell {i} stores a live widget view (run with FLASHTEXT_STATIC=1)")
    if counts and counts != list(range(1, len(counts) + 1)):
        found.append("code cells were not executed once, top to bottom (run `make notebooks`)")
    return found
