"""The book's Sphinx extension: what a chapter page adds to the notebook it renders.

* under each chapter's title, how to run it (``make lab``);
* the "Checkpoint" and "Exercises" sections (and each "Exercise N.M" in them) marked with a
  class and a line that says what they are, so the theme's CSS can set them apart;
* a widget's static figure captioned as such, instead of the raw "(static figure: ...)" text the
  notebook printed under it.

It works on Sphinx's document tree after parsing, so the notebooks are never edited.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from docutils import nodes
from sphinx.application import Sphinx

# what a widget prints under its static figure (flashtext.widgets, under FLASHTEXT_STATIC=1)
STATIC_MARKER = re.compile(r"\(static figure: open this chapter in JupyterLab[^)]*\)\n?")
CHAPTER_DOC = re.compile(r"^chapters/(\d\d)_")

SECTION_KINDS = {
    # heading text (start) -> (class, the line under the heading)
    "Checkpoint": ("ft-checkpoint",
                   "Decide your answer before you read on; in JupyterLab (make lab) the "
                   "checkpoint takes it and says why it is right or wrong."),
    "Exercises": ("ft-exercises",
                  "Do these in JupyterLab (make lab): each check(...) cell tests your code on "
                  "hard inputs; make progress lists the ones you have done."),
}
EXERCISE = re.compile(r"^Exercise \d+\.\d+")


def _note(text: str, cls: str) -> nodes.paragraph:
    """A paragraph whose ``make ...`` words are set as code."""
    para = nodes.paragraph(classes=["ft-note", cls])
    for i, part in enumerate(re.split(r"(make \w+|check\(\.\.\.\))", text)):
        if part:
            para += nodes.literal(part, part) if i % 2 else nodes.Text(part)
    return para


def _run_note(docname: str) -> nodes.admonition:
    """A note under the chapter's title: how to run it."""
    name = Path(docname).name + ".ipynb"
    box = nodes.admonition(classes=["note", "ft-run"])
    box += nodes.title("Run this chapter", "Run this chapter")
    para = nodes.paragraph()
    para += nodes.literal("make lab", "make lab")
    para += nodes.Text(" in a clone of the book creates the environment and opens JupyterLab; "
                       "open ")
    para += nodes.literal(name, name)
    para += nodes.Text(" and run all cells. This page shows the outputs stored in the "
                       "repository (one run on a CPU); widgets appear as their static figure.")
    box += para
    return box


def _mark_sections(doctree: nodes.document) -> None:
    for section in doctree.findall(nodes.section):
        title = section.next_node(nodes.title)
        if title is None:
            continue
        heading = title.astext().strip()
        for start, (cls, text) in SECTION_KINDS.items():
            if heading.startswith(start):
                section["classes"].append(cls)
                section.insert(section.index(title) + 1, _note(text, cls + "-note"))
        if EXERCISE.match(heading):
            section["classes"].append("ft-exercise")


def _caption_static_figures(doctree: nodes.document) -> None:
    for block in list(doctree.findall(nodes.literal_block)):
        if "stream" not in block["classes"] or not STATIC_MARKER.search(block.astext()):
            continue
        rest = STATIC_MARKER.sub("", block.astext())
        caption = nodes.paragraph(classes=["ft-widget-note"])
        caption += nodes.Text("A widget, shown here as its static figure: open the chapter "
                              "in JupyterLab (")
        caption += nodes.literal("make lab", "make lab")
        caption += nodes.Text(") to play with it.")
        replacement: list[nodes.Node] = [caption]
        if rest.strip():  # the cell printed more than the marker: keep that as it was
            replacement.insert(0, nodes.literal_block(rest.strip("\n"), rest.strip("\n"),
                                                      classes=block["classes"]))
        block.replace_self(replacement)
        cell = caption.parent
        while cell is not None and "cell" not in cell.get("classes", []):
            cell = cell.parent
        if cell is not None:
            cell["classes"].append("ft-widget")


def doctree_read(app: Sphinx, doctree: nodes.document) -> None:
    docname = app.env.docname
    if not CHAPTER_DOC.match(docname):
        return
    _mark_sections(doctree)
    _caption_static_figures(doctree)
    top = doctree.next_node(nodes.section)
    if top is not None:
        title = top.next_node(nodes.title)
        top.insert(top.index(title) + 1 if title is not None else 0, _run_note(docname))


def config_inited(app: Sphinx, config: Any) -> None:
    # build.py copies MathJax into the source folder's _static/
    config.html_static_path.append(str(Path(app.srcdir) / "_static"))


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_config_value("flashtext_book_digest", "", "env")  # set by conf.py
    app.connect("config-inited", config_inited)
    app.connect("doctree-read", doctree_read)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
