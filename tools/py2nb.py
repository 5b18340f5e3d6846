"""Authoring aid: turn a percent-format script into a chapter notebook.

    python tools/py2nb.py draft.py chapters/NN_name.ipynb

Cells start with ``# %%`` (code) or ``# %% [markdown]`` (markdown, each line prefixed ``# ``).
``# %% tags=["raises-exception"]`` style tags are kept. The notebook is the source of truth once
written; the draft is not committed. Then run ``make notebooks NB=chapters/NN_name.ipynb``.
"""

from __future__ import annotations

import json
import re
import sys

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HEADER = re.compile(r"^# %%(?P<md> \[markdown\])?(?:\s+tags=(?P<tags>\[.*\]))?\s*$")


def convert(text: str) -> nbformat.NotebookNode:
    cells, kind, tags, buf = [], None, [], []

    def flush():
        if kind is None:
            return
        body = "\n".join(buf).strip("\n")
        if kind == "md":
            body = "\n".join(line[2:] if line.startswith("# ") else line.lstrip("#")
                             for line in body.splitlines())
            cell = new_markdown_cell(body)
        else:
            cell = new_code_cell(body)
        if tags:
            cell.metadata["tags"] = tags
        cells.append(cell)

    for line in text.splitlines():
        m = HEADER.match(line)
        if m:
            flush()
            kind = "md" if m.group("md") else "code"
            tags = json.loads(m.group("tags")) if m.group("tags") else []
            buf = []
        elif kind is not None:
            buf.append(line)
    flush()
    nb = new_notebook(cells=cells)
    nb.metadata = {"kernelspec": {"display_name": "Python 3 (ipykernel)", "language": "python",
                                  "name": "python3"}, "language_info": {"name": "python"}}
    return nb


if __name__ == "__main__":
    src, dst = sys.argv[1], sys.argv[2]
    nbformat.write(convert(open(src).read()), dst)
    print(f"wrote {dst}")
