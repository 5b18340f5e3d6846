"""The repository's layout holds: small files, recordings that something reads and a record that
lists them, a `make help` that names every target, a README whose chapter table names the modules
each chapter imports, and a product that speaks only of itself."""

from __future__ import annotations

import ast
import json
import re
import shutil
import subprocess
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "flashtext"
DATA = PACKAGE / "data"
RECORDS = ROOT / "scripts" / "records"
RECORDINGS = ROOT / "scripts" / "RECORDINGS.md"
CHAPTERS = sorted((ROOT / "chapters").glob("*.ipynb"))
MAX_LINES = 700


def chapter_sources() -> dict[str, str]:
    """Each chapter's cell sources (code and markdown), not its stored outputs."""
    return {p.name: "\n".join(c.source for c in nbformat.read(p, as_version=4).cells)
            for p in CHAPTERS}


def python_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*.py") if "__pycache__" not in p.parts)


# ------------------------------------------------------------------------------ size

@pytest.mark.parametrize("path", python_files(PACKAGE), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_over_the_line_limit(path):
    """One module per idea, small enough to read in a sitting: split a file along its seams
    before it passes the limit."""
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{path.relative_to(ROOT)} has {lines} lines (limit {MAX_LINES})"


# ------------------------------------------------------------------------------ recordings

# a name with a placeholder: f"probe_x_{v}" in code, probe_x_*.json in text
_PATTERNED = re.compile(r"[A-Za-z0-9_]{4,}(?:(?:\{[^{}\n]*\}|\*)[A-Za-z0-9_]*)+")
_PLACEHOLDER = re.compile(r"(\{[^{}\n]*\}|\*)")


def _name_patterns(text: str) -> list[re.Pattern]:
    out = []
    for token in _PATTERNED.findall(text):
        parts = _PLACEHOLDER.split(token)
        out.append(re.compile("".join(re.escape(p) if i % 2 == 0 else r"\w+"
                                      for i, p in enumerate(parts))))
    return out


def referenced(stem: str, sources: dict[str, str]) -> list[str]:
    """The sources that name recording ``stem``: as a whole word (``recorded.load("x")``,
    ``x.json`` in a chapter's text), or through a placeholder (``f"x_{v}"``, ``x_*.json``)."""
    word = re.compile(rf"(?<![\w]){re.escape(stem)}(?![\w])")
    return [name for name, text in sources.items() if word.search(text)
            or any(p.fullmatch(stem) for p in _name_patterns(text))]


def readers() -> dict[str, str]:
    """Everything that may read a recording: the chapters, the package's modules, the tests
    (this file excepted: naming a file here must not count as reading it)."""
    out = dict(chapter_sources())
    for path in python_files(PACKAGE) + python_files(ROOT / "tests"):
        if path != Path(__file__).resolve():
            out[str(path.relative_to(ROOT))] = path.read_text()
    return out


def test_every_packaged_recording_is_read_by_something():
    """flashtext/data ships with the package: a file there that no chapter, module or test
    reads is a probe, and belongs in scripts/records/."""
    sources = readers()
    unread = [p.name for p in sorted(DATA.glob("*.json")) if not referenced(p.stem, sources)]
    assert unread == [], f"move to scripts/records/ (and fix BENCHMARKS.md's paths): {unread}"


def test_the_reference_check_sees_a_reader_and_its_absence():
    sources = {"a.ipynb": 'recorded.load("tune_h200")', "b.py": "bench_h200_v3.json"}
    assert referenced("tune_h200", sources) == ["a.ipynb"]
    assert referenced("bench_h200_v3", sources) == ["b.py"]
    assert referenced("bench_h200", sources) == []  # a prefix of another name is not a reader
    patterned = {"c.ipynb": 'recorded.load(f"probe_host_{v}")', "d.md": "`probe_*.json`",
                 "e.py": "x = a * b"}
    assert referenced("probe_host_dd", patterned) == ["c.ipynb", "d.md"]
    assert referenced("probe_bench", patterned) == ["d.md"]
    assert referenced("tune_h200", patterned) == []


def recordings_table() -> dict[str, dict[str, str]]:
    """The rows of RECORDINGS.md's table of files: path -> its columns."""
    rows: dict[str, dict[str, str]] = {}
    header = None
    for line in RECORDINGS.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| file |"):
            header = cells
        elif header and line.startswith("| `") and len(cells) == len(header):
            path = cells[0].strip("`")
            assert path not in rows, f"{path} is listed twice"
            rows[path] = dict(zip(header, cells, strict=True))
    return rows


def test_recordings_md_lists_every_recording_with_its_own_date_and_machine():
    rows = recordings_table()
    on_disk = {str(p.relative_to(ROOT)) for p in [*DATA.glob("*.json"), *RECORDS.glob("*.json")]}
    assert set(rows) - on_disk == set(), "listed but not in the repository"
    assert on_disk - set(rows) == set(), "in the repository but not listed in RECORDINGS.md"
    for path, row in rows.items():
        meta = json.loads((ROOT / path).read_text())
        assert (row["date"], row["on"]) == (meta["date"], meta["gpu"]), path


def test_recordings_md_says_how_to_run_every_script():
    text = RECORDINGS.read_text()
    missing = [p.name for p in sorted((ROOT / "scripts").glob("*.py"))
               if f"`scripts/{p.name}`" not in text]
    assert missing == []


# where a command writes by default, named as such, and kept under another name when committed
RUN_OUTPUTS = {"flashtext/data/bench_h200.json"}  # make bench -> bench_h200_vN.json


def owed_recordings() -> set[str]:
    """What RECORDINGS.md's table of scripts says a script writes but has not run yet: a
    chapter may name such a file (and say it is not recorded yet) before it exists."""
    owed = set()
    for line in RECORDINGS.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and "not run yet" in cells[3]:
            owed |= {f"flashtext/data/{name}.json" for name in re.findall(r"`(\w+)`", cells[2])}
    return owed


def test_an_owed_recording_is_not_there_yet():
    owed = owed_recordings()
    assert "flashtext/data/ring_nccl_h200.json" in owed  # the parser reads the table
    assert [p for p in sorted(owed) if (ROOT / p).exists()] == [], \
        "recorded: say when and how long in RECORDINGS.md instead of 'not run yet'"


def named_paths(text: str) -> set[str]:
    """Repository paths of recordings a document names, globs included (``x_*.json``)."""
    return set(re.findall(r"(?:flashtext/data|scripts/records)/[\w*]+\.json", text))


@pytest.mark.parametrize("doc", ["BENCHMARKS.md", "README.md", "scripts/RECORDINGS.md",
                                 "chapters"])
def test_every_recording_a_document_names_exists(doc):
    text = ("\n".join(chapter_sources().values()) if doc == "chapters"
            else (ROOT / doc).read_text())
    missing = [p for p in sorted(named_paths(text) - RUN_OUTPUTS - owed_recordings())
               if "NAME" not in p and not list(ROOT.glob(p))]
    assert missing == [], f"{doc} names recordings that are not there"


def test_named_paths_finds_globs_and_plain_names():
    found = named_paths("see `flashtext/data/tune_h200.json` and scripts/records/probe_*.json")
    assert found == {"flashtext/data/tune_h200.json", "scripts/records/probe_*.json"}


# ------------------------------------------------------------------------------ make help

def make_targets(makefile: str) -> set[str]:
    """Every rule with a plain name (file targets such as $(VENV)/.ready are not commands)."""
    targets = set()
    for line in makefile.splitlines():
        m = re.match(r"^([A-Za-z][\w.-]*(?:\s+[A-Za-z][\w.-]*)*)\s*:(?![=:])", line)
        if m and not line.startswith(".") and "$" not in m.group(1):
            targets |= set(m.group(1).split())
    return targets


def help_names(text: str) -> set[str]:
    return set(re.findall(r"make ([\w-]+)", text))


def test_make_targets_are_found():
    makefile = "X := 1\nhelp:\n\t@echo hi\nenv: $(READY)\n$(VENV)/.ready: x\na b: c\n"
    assert make_targets(makefile) == {"help", "env", "a", "b"}


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_help_names_every_target():
    targets = make_targets((ROOT / "Makefile").read_text())
    assert {"help", "lab", "test", "env", "clean"} <= targets  # the parser found the rules
    out = subprocess.run(["make", "-s", "help"], cwd=ROOT, capture_output=True, text=True,
                         timeout=120, check=True).stdout
    assert targets - help_names(out) == set(), "add these to the help target"
    assert help_names(out) - targets == set(), "make help names targets that do not exist"


# ------------------------------------------------------------------------------ README modules

# the book's own machinery, used by nearly every chapter: exercises and their checkers, source
# listings, recorded results, and the widgets package's show() (its widget modules are listed)
FRAMEWORK = ("exercises", "show", "recorded", "widgets")


def _is_module(dotted: str) -> bool:
    path = PACKAGE.joinpath(*dotted.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def chapter_modules(nb: nbformat.NotebookNode) -> list[str]:
    """The flashtext modules a chapter's code cells import (``from flashtext.a import b``
    counts ``a.b`` where b is a module, else ``a``), less the book's framework modules."""
    found = set()
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        code = "\n".join(line for line in cell.source.splitlines()
                         if not line.lstrip().startswith(("%", "!")))
        for node in ast.walk(ast.parse(code)):
            if isinstance(node, ast.Import):
                found |= {a.name.removeprefix("flashtext.") for a in node.names
                          if a.name.startswith("flashtext.")}
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] \
                    == "flashtext" and not node.level:
                base = node.module.removeprefix("flashtext").lstrip(".")
                for alias in node.names:
                    sub = f"{base}.{alias.name}" if base else alias.name
                    found.add(sub if _is_module(sub) else base)
    return sorted(m for m in found if m and m not in FRAMEWORK
                  and not m.startswith("exercises."))


def readme_modules() -> dict[str, list[str]]:
    """Chapter number -> the modules README.md's chapter table lists for it."""
    out = {}
    for line in (ROOT / "README.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and re.fullmatch(r"\d\d", cells[0]):
            out[cells[0]] = sorted(re.findall(r"`([\w.]+)`", cells[3]))
    return out


def test_readme_chapter_table_names_the_modules_each_chapter_imports():
    want = {p.name[:2]: chapter_modules(nbformat.read(p, as_version=4)) for p in CHAPTERS}
    got = readme_modules()
    assert set(got) == set(want), "the README's table and chapters/ list different chapters"
    wrong = {n: " ".join(f"`{m}`" for m in want[n]) or "-" for n in want if got[n] != want[n]}
    assert wrong == {}, "README.md's modules column should read (chapter: column):"


def test_chapter_modules_reads_imports_of_modules_and_names():
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        "%matplotlib inline\nimport flashtext.tiled\nfrom flashtext import cost, report\n"
        "from flashtext.kernels import flash_attention\n"
        "from flashtext.kernels.config import TUNED\n"
        "from flashtext.exercises import check\nfrom flashtext.widgets import show")])
    assert chapter_modules(nb) == ["cost", "kernels", "kernels.config", "tiled"]
    nb.cells[0].source += ("\nfrom flashtext.widgets.sram import SramBudget\n"
                           "import flashtext.exercises.ch04")
    assert chapter_modules(nb) == ["cost", "kernels", "kernels.config", "tiled", "widgets.sram"]


# ------------------------------------------------------------------------------ speaks of itself

# The project's own issue numbers, folders outside the repository, branch names. Upstream issues
# ("flash-attention issue #175") are citations and stay.
SELF_REFERENCE = re.compile(r"\bissues?[ -]\d|(?<![\w-])(?:\.\./)?shared/|(?<![\w/.-])next/",
                            re.IGNORECASE)


def product_texts() -> dict[str, str]:
    out = {str(p.relative_to(ROOT)): p.read_text()
           for folder in ("flashtext", "tools", "scripts") for p in sorted(
               (ROOT / folder).rglob("*")) if p.suffix in (".py", ".md", ".txt", ".sh")
           and "__pycache__" not in p.parts}
    for name in ("README.md", "BENCHMARKS.md", "Makefile"):
        out[name] = (ROOT / name).read_text()
    return out


def offending(text: str) -> list[str]:
    return [line.strip()[:120] for line in text.splitlines() if SELF_REFERENCE.search(line)]


@pytest.mark.parametrize("name", sorted(product_texts()))
def test_the_code_and_docs_speak_only_of_the_repository(name):
    assert offending(product_texts()[name]) == []


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.name)
def test_the_chapters_speak_only_of_the_repository(path):
    sources = "\n".join(c.source for c in nbformat.read(path, as_version=4).cells)
    assert offending(sources) == []


def test_the_self_reference_check_catches_and_spares():
    caught = ["Targets (issue 7):", "issue-7 targets", "copied from shared/anchors",
              "see ../shared/x", "branch next/fwd-late-scale", "Issues 3 and 4"]
    spared = ["flash-attention issue #175", "triton issue #4541", "shared memory",
              "the next step", "tl.dot's issue slots", "flashtext/shared_x.py"]
    assert [t for t in caught if not offending(t)] == []
    assert [t for t in spared if offending(t)] == []
