"""Notebooks are stored as the README says: outputs from one clean run, no errors, one kernelspec,
minimal metadata, and every chapter in the chapter shape."""

import re
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


def promised_functions(text: str) -> list[str]:
    """The functions an exercise's text asks the reader to write ("Write `name(...)`"), in its
    numbered, non-(Think.) items."""
    names = []
    for item in re.split(r"(?=\*\*\d+\.)", text):
        head = re.match(r"\*\*\d+\.([^*]*)\*\*", item)
        if head and "Think" not in head.group(1):
            names += re.findall(r"[Ww]rite `(\w+)\(", item)
    return names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_exercise_the_text_promises_has_a_checker(path):
    """An exercise that asks for a function has a stub cell that calls its checker, and the
    checker exists: text alone is not an exercise."""
    from flashtext.exercises.core import load_all

    registry = load_all()
    nb = nbformat.read(path, as_version=4)
    text = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    checked = set(re.findall(r'check\("(ch\d\d\.\w+)"', "\n".join(
        c.source for c in nb.cells if c.cell_type == "code")))
    chapter = f"ch{path.name[:2]}"
    for name in promised_functions(text):
        assert f"{chapter}.{name}" in checked, f"{path.name}: `{name}` has no check() cell"
    assert checked <= set(registry), f"{path.name}: no checker for {checked - set(registry)}"


def test_promised_functions_are_found():
    text = ("**1. A thing.** Write `alpha(x)` and return it.\n\n**2. (Think.)** Write "
            "`beta(y)` in your head.\n\n**3. Another.** Then write `gamma(z, w)`.")
    assert promised_functions(text) == ["alpha", "gamma"]


def listings(nb: nbformat.NotebookNode) -> list[tuple[str, str, str]]:
    """(cell id, file, text) of every stored ``flashtext.show.source`` listing; its plain-text
    form starts with a ``# flashtext/...`` line naming the file."""
    found = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            header, _, body = out.get("data", {}).get("text/plain", "").partition("\n")
            if header.startswith("# flashtext/") and body:
                found.append((cell.get("id"), header[2:], body))
    return found


def stale_listings(nb: nbformat.NotebookNode) -> list[str]:
    """Stored listings that no longer match the library's file: a notebook run before a change
    to the code it shows would teach the old code."""
    stale = []
    for cell_id, name, body in listings(nb):
        file = ROOT / name
        if body.rstrip("\n") not in (file.read_text() if file.exists() else ""):
            first_def = next((line for line in body.splitlines() if "def " in line), "")
            stale.append(f"cell {cell_id}: {name}: {first_def.strip()!r}")
    return stale


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_stored_source_listings_are_current(path):
    nb = nbformat.read(path, as_version=4)
    showing = {c.get("id") for c in nb.cells
               if c.cell_type == "code" and re.search(r"(?<![\w.])source\(", c.source)}
    assert showing <= {cell_id for cell_id, _, _ in listings(nb)}, "a source() cell has no listing"
    assert stale_listings(nb) == [], f"{path.name}: run `make notebooks NB={path}` to refresh"


def test_a_listing_of_changed_code_is_stale():
    nb = nbformat.read(NOTEBOOKS[0], as_version=4)
    listing = {"text/plain": "# flashtext/show.py\ndef source(obj):\n    return 'the old code'\n"}
    nb.cells.append(nbformat.v4.new_code_cell(outputs=[nbformat.v4.new_output(
        "display_data", data=listing)]))
    assert len(stale_listings(nb)) == 1
    listing["text/plain"] = "# flashtext/show.py\n" + (ROOT / "flashtext/show.py").read_text()
    nb.cells[-1].outputs = [nbformat.v4.new_output("display_data", data=listing)]
    assert stale_listings(nb) == []


# The product speaks of itself alone: no issue of this project ("issue 7"; an upstream citation
# names its repository, "flash-attention issue #175"), no branch, no folder outside the repo.
OUTSIDE_REFERENCES = re.compile(r"\bissue\s+\d+|\bnext/[\w.-]+|(?<![\w/.])shared/|\.\./shared",
                                re.IGNORECASE)


def outside_references(nb: nbformat.NotebookNode) -> list[str]:
    """Mentions of this project's issues, branches or folders outside the repository, in cell
    sources and stored outputs."""
    found = []
    for cell in nb.cells:
        texts = [cell.source] + [o.get("text", "") or o.get("data", {}).get("text/plain", "")
                                 for o in cell.get("outputs", [])]
        for text in texts:
            found += [f"cell {cell.get('id')}: {m.group(0)!r}" for m in
                      OUTSIDE_REFERENCES.finditer(text if isinstance(text, str) else "".join(text))]
    return found


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_chapters_name_no_issue_branch_or_outside_folder(path):
    assert outside_references(nbformat.read(path, as_version=4)) == []


def test_outside_references_are_found():
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("Issue 7 set the targets; see flash-attention issue #175."),
        nbformat.v4.new_code_cell("x = 1", outputs=[nbformat.v4.new_output(
            "stream", text="on branch next/fast-key, data in ../shared/anchors and shared/x\n")])])
    assert [f.split(": ", 1)[1] for f in outside_references(nb)] == [
        "'Issue 7'", "'next/fast-key'", "'../shared'", "'shared/'"]
