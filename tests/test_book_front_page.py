"""The website's front page is made from the README's chapter table: it must parse whatever
columns the table carries, on every machine (the site's browser test runs only with Chromium)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _build_module():
    spec = importlib.util.spec_from_file_location("book_build", ROOT / "tools/book/build.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["book_build"] = module  # dataclasses look their module up while being built
    spec.loader.exec_module(module)
    return module


def test_the_readme_table_gives_every_chapter_its_title_and_idea():
    book = _build_module()
    readme = book.read_readme()
    numbers = [c.number for c in readme.chapters]
    assert numbers == sorted(p.name[:2] for p in (ROOT / "chapters").glob("[0-9][0-9]_*.ipynb"))
    # the third column is the idea, never the modules column that follows it
    assert all(c.title and c.idea and "`flashtext" not in c.idea and "`reference`" not in c.idea
               for c in readme.chapters)
    page = book.front_page(readme)
    assert all(c.title in page for c in readme.chapters)
