"""Notebooks are stored as the README says: outputs from one clean run, no errors, one kernelspec,
minimal metadata, and every chapter in the chapter shape."""

import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
from notebook_format import problems  # noqa: E402

NOTEBOOKS = sorted((ROOT / "chapters").glob("*.ipynb"))
SECTIONS = ["Hook", "Intuition", "Formalize", "Play", "Worked example", "Checkpoint", "Summary",
            "Exercises"]


def test_there_are_chapters():
    assert NOTEBOOKS, "chapters/ has no notebooks"
    names = [p.name for p in NOTEBOOKS]
    assert all(n[:2].isdigit() and n[2] == "_" for n in names), names
    assert len({n[:2] for n in names}) == len(names), "two chapters share a number"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_stored_format(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    assert problems(nb) == []


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_chapter_shape(path):
    nb = nbformat.read(path, as_version=4)
    headings = [line.lstrip("#").strip() for c in nb.cells if c.cell_type == "markdown"
                for line in c.source.splitlines() if line.startswith("## ")]
    positions = []
    for section in SECTIONS:
        found = [i for i, h in enumerate(headings) if h.startswith(section)]
        assert found, f"{path.name} lacks a '## {section}' section (has {headings})"
        positions.append(found[0])
    assert positions == sorted(positions), f"{path.name}: sections out of order: {headings}"
    first_code = next(c for c in nb.cells if c.cell_type == "code")
    assert "report()" in first_code.source, "the first code cell shows where the book runs"
