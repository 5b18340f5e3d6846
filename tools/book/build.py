"""Build the book as an offline static website: ``build/book/`` from ``chapters/*.ipynb``.

The chapters are rendered with their stored outputs (nothing is re-executed) by Sphinx, myst-nb
and sphinx-book-theme (configured in ``tools/book/conf.py``). This script prepares the Sphinx
source folder ``build/book-src/`` and runs Sphinx on it:

* copies of the committed notebooks (never the notebooks themselves), with any live-widget
  output removed, so a page never asks for the widget JavaScript;
* a front page made from the README: its title, its opening paragraphs and the chapter table,
  each chapter linked to its page;
* MathJax, from the ``jupyter-server-mathjax`` package, so that math is typeset by the site
  itself and no page needs the network.

A copy is rewritten only when its content changes, so Sphinx rebuilds only what changed.
Run with ``make book``; open ``build/book/index.html``.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONF_DIR = Path(__file__).resolve().parent
CHAPTERS = ROOT / "chapters"
BUILD = ROOT / "build"
SRC = BUILD / "book-src"
OUT = BUILD / "book"
DOCTREES = BUILD / "book-doctrees"

# Outputs of live widgets: on a page they would need require.js and the widget manager from a
# CDN. Committed notebooks have none (their widgets stored a static figure); drop them anyway.
WIDGET_MIMES = ("application/vnd.jupyter.widget-view+json",
                "application/vnd.jupyter.widget-state+json")
# nbval's per-cell directives (``# NBVAL_CHECK_OUTPUT``) are test machinery, not the lesson
NBVAL_LINE = re.compile(r"^[ \t]*#[ \t]*NBVAL_[A-Z_]+[ \t]*\n?", re.MULTILINE)


@dataclass(frozen=True)
class Chapter:
    number: str  # "00"
    title: str  # "How to use this book", as in the README's table
    idea: str  # the table's third column (markdown)
    path: Path  # chapters/00_how_to_use.ipynb

    @property
    def docname(self) -> str:
        return f"chapters/{self.path.stem}"


@dataclass(frozen=True)
class Readme:
    title: str
    intro: str  # the paragraphs before the first "## " heading
    chapters: list[Chapter]


class BookError(Exception):
    """The book cannot be built; the message says why and what to fix."""


def read_readme(readme: Path = ROOT / "README.md", chapters_dir: Path = CHAPTERS) -> Readme:
    """Title, opening paragraphs and chapter table of the README, matched to the notebooks."""
    text = readme.read_text(encoding="utf-8")
    lines = text.splitlines()
    if not lines or not lines[0].startswith("# "):
        raise BookError(f"{readme.name} must start with a '# ' title line")
    title = lines[0][2:].strip()
    first_h2 = next((i for i, ln in enumerate(lines) if ln.startswith("## ")), len(lines))
    intro = "\n".join(lines[1:first_h2]).strip()

    try:
        start = lines.index("## The chapters")
    except ValueError:
        raise BookError(f"{readme.name} has no '## The chapters' section with the chapter "
                        "table the front page is made from") from None
    rows = []
    for ln in lines[start + 1:]:
        if ln.startswith("## "):
            break
        cells = [c.strip() for c in ln.strip().strip("|").split("|")]
        # number, title, idea; further columns (the modules a chapter imports) are for
        # maintainers, not the front page
        if ln.startswith("|") and len(cells) >= 3 and re.fullmatch(r"\d\d", cells[0]):
            rows.append(cells[:3])
    if not rows:
        raise BookError(f"no chapter rows ('| 00 | title | idea |') under '## The chapters' "
                        f"in {readme.name}")

    notebooks = {p.name[:2]: p for p in sorted(chapters_dir.glob("[0-9][0-9]_*.ipynb"))}
    listed = [r[0] for r in rows]
    missing = [n for n in listed if n not in notebooks]
    unlisted = [notebooks[n].name for n in notebooks if n not in listed]
    if missing or unlisted:
        raise BookError(
            "the README's chapter table and chapters/ disagree: "
            + "; ".join(filter(None, [
                missing and f"no notebook for chapter(s) {', '.join(missing)}",
                unlisted and f"not in the table: {', '.join(unlisted)}"])))
    return Readme(title, intro, [Chapter(n, t, idea, notebooks[n]) for n, t, idea in rows])


def front_page(readme: Readme) -> str:
    """The site's index.md (MyST markdown): the README's opening, the chapter table, how to run
    the book, and the (hidden) table of contents that gives every page its previous / next."""
    table = ["| # | Chapter | The idea |", "|---|---|---|"]
    for ch in readme.chapters:
        table.append(f"| {ch.number} | [{ch.title}]({ch.docname}.ipynb) "
                     f"| {ch.idea} |")
    toctree = "\n".join(ch.docname for ch in readme.chapters)
    return f"""# {readme.title}

{readme.intro}

## The chapters

{chr(10).join(table)}

## Run it yourself

This site shows every chapter with the outputs stored in the repository, from one run on a
CPU; the widgets appear as their static figure. To run the cells, answer the checkpoints and
do the exercises, open the book in JupyterLab: on a Linux machine with Python 3.11+, `make`
and git, in a clone of the repository,

```bash
make lab     # creates the environment if it is missing, then opens JupyterLab on chapters/
```

`make progress` lists the exercises you have done; `make book` rebuilds this site.

```{{toctree}}
:hidden:
:maxdepth: 2
:caption: Chapters

{toctree}
```
"""


def _write_if_changed(path: Path, data: bytes) -> bool:
    """Write only on change: an unchanged mtime is what keeps Sphinx's rebuild incremental."""
    if path.exists() and path.read_bytes() == data:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return True


def site_copy(notebook: Path) -> bytes:
    """The notebook as the site renders it: stored outputs kept, live-widget outputs and widget
    state dropped (the committed notebooks have none; a stray one must not pull in a CDN), and
    nbval's directive lines left out of the code."""
    nb = json.loads(notebook.read_text(encoding="utf-8"))
    nb.get("metadata", {}).pop("widgets", None)
    for cell in nb.get("cells", []):
        if cell.get("cell_type") == "code":
            source = "".join(cell.get("source", ""))
            cell["source"] = NBVAL_LINE.sub("", source)
        outputs = []
        for out in cell.get("outputs", []):
            data = out.get("data")
            if data is not None:
                for mime in WIDGET_MIMES:
                    data.pop(mime, None)
                if not data:
                    continue  # only a widget view: nothing static to show
            outputs.append(out)
        if "outputs" in cell:
            cell["outputs"] = outputs
    return (json.dumps(nb, indent=1, ensure_ascii=False) + "\n").encode()


def mathjax_dir() -> Path:
    """MathJax's files as the jupyter-server-mathjax package ships them (pinned in
    requirements.txt)."""
    try:
        import jupyter_server_mathjax
    except ImportError:
        raise BookError("jupyter-server-mathjax is missing: `make env` installs it "
                        "(requirements.txt)") from None
    static = Path(jupyter_server_mathjax.__file__).parent / "static"
    if not (static / "MathJax.js").is_file():
        raise BookError(f"no MathJax.js in {static}")
    return static


def prepare_sources(readme: Readme, src: Path = SRC) -> int:
    """Lay out the Sphinx source folder; return how many files changed since the last build."""
    changed = 0
    wanted = set()
    for ch in readme.chapters:
        target = src / "chapters" / ch.path.name
        wanted.add(target)
        changed += _write_if_changed(target, site_copy(ch.path))
    for stale in (src / "chapters").glob("*.ipynb"):  # a chapter renamed or removed
        if stale not in wanted:
            stale.unlink()
            changed += 1
    changed += _write_if_changed(src / "index.md", front_page(readme).encode())

    mathjax = src / "_static" / "mathjax"
    source = mathjax_dir()
    stamp = mathjax / ".from"
    if not stamp.exists() or stamp.read_text() != str(source):
        shutil.rmtree(mathjax, ignore_errors=True)
        shutil.copytree(source, mathjax)
        stamp.write_text(str(source))
        changed += 1
    return changed


def build(out: Path = OUT, fresh: bool = False, jobs: str = "1") -> None:
    """Prepare the sources and run Sphinx's HTML builder into ``out``."""
    try:
        import myst_nb  # noqa: F401
        import sphinx_book_theme  # noqa: F401
        from sphinx.cmd.build import build_main
    except ImportError as e:
        raise BookError(f"{e.name} is missing: `make env` installs the website's tools "
                        "(requirements.txt; a GPU runner's wheelhouse leaves them out, so build "
                        "the site on the CPU machine)") from None

    t0 = time.monotonic()
    readme = read_readme()
    changed = prepare_sources(readme)
    args = ["-b", "html", "-c", str(CONF_DIR), "-d", str(DOCTREES), "-q", "-j", jobs]
    if fresh:
        args += ["-E", "-a"]
    rc = build_main([*args, str(SRC), str(out)])
    if rc:
        raise BookError(f"sphinx-build exited with {rc} (its messages are above)")
    pages = len(readme.chapters) + 1
    print(f"book: {pages} pages in {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}"
          f" ({changed} source file(s) changed) in {time.monotonic() - t0:.1f} s; "
          f"open {out / 'index.html'}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT, help="output folder (build/book)")
    parser.add_argument("--fresh", action="store_true",
                        help="rebuild every page, not only the changed ones")
    parser.add_argument("-j", "--jobs", default="1", help="Sphinx's parallel jobs (or 'auto')")
    args = parser.parse_args(argv)
    try:
        build(args.out.resolve(), fresh=args.fresh, jobs=args.jobs)
    except BookError as e:
        print(f"make book: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
