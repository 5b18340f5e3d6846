"""Sphinx configuration of the book's website (``make book``; sources laid out by build.py).

Every asset a page loads is served by the site itself: MathJax comes from the
jupyter-server-mathjax package (copied into ``_static/mathjax`` by build.py), the theme ships its
own fonts and icons, and no widget JavaScript is ever requested.
"""

import hashlib
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # the book's own extension, flashtext_book.py

project = "flashtext"
html_title = "flashtext"
language = "en"

extensions = ["myst_nb", "sphinx.ext.mathjax", "flashtext_book"]
# a change to the book's extension re-reads every page (Sphinx compares config values, not code)
flashtext_book_digest = hashlib.sha256((HERE / "flashtext_book.py").read_bytes()).hexdigest()
root_doc = "index"
exclude_patterns = ["_build", "**.ipynb_checkpoints"]
suppress_warnings = ["mystnb.unknown_mime_type"]

# The committed notebooks carry their outputs (one top-to-bottom CPU run, widgets as static
# figures): render those, never execute.
nb_execution_mode = "off"
nb_merge_streams = True  # print() calls of one cell read as one block, as in JupyterLab
nb_output_stderr = "show"
nb_ipywidgets_js = {}  # no require.js / widget manager from a CDN, even if a widget slipped in
nb_mime_priority_overrides = [
    ("html", "application/vnd.jupyter.widget-view+json", None),
    ("html", "application/vnd.jupyter.widget-state+json", None),
]
myst_enable_extensions = ["dollarmath", "amsmath"]
myst_heading_anchors = 3

# MathJax 2.7 from the jupyter-server-mathjax package, with the configuration the classic
# Jupyter notebook used for it (STIX-Web fonts, shipped in the package). Sphinx writes inline
# math as \( \) and display math as \[ \]; only those delimiters are typeset, so a literal "$"
# in the prose stays a dollar. myst-nb marks a notebook's page "tex2jax_ignore" (so that nothing
# in the outputs is taken for TeX) and Sphinx's math elements have the class "math": process
# those, as myst-parser configures MathJax 3 to.
mathjax_path = "mathjax/MathJax.js?config=TeX-AMS-MML_HTMLorMML-full"
mathjax2_config = {
    "tex2jax": {
        "inlineMath": [["\\(", "\\)"]],
        "displayMath": [["\\[", "\\]"]],
        "processEscapes": False,
        "processEnvironments": True,
        "processClass": "tex2jax_process|mathjax_process|math",
    },
    "HTML-CSS": {
        "availableFonts": [],
        "imageFont": None,
        "preferredFont": None,
        "webFont": "STIX-Web",
        "linebreaks": {"automatic": True},
        "scale": 90,  # matched to the text's x-height, STIX reads larger than the body font
    },
    # no fast preview: its font-based preview asks for MathJax's TeX fonts, which the package
    # does not ship (it ships STIX-Web); HTML-CSS output is what the reader gets anyway
    "fast-preview": {"disabled": True},
    # The NativeMML output (which styles the hidden MathML that AssistiveMML adds for screen
    # readers) declares web fonts from MathJax's TeX font folder, which the package does not
    # ship: the same rules with a local() source, so the browser fetches nothing missing.
    "NativeMML": {"styles": {
        f"@font-face /*{i}*/": {"font-family": f"MathJax_{name}-WEB",
                                "src": f"local('MathJax_{name}')",
                                **({"font-weight": "bold"} if bold else {})}
        for i, name, bold in [(1, "Caligraphic", False), (2, "Caligraphic", True),
                              (3, "AMS", False), (4, "Script", False),
                              (5, "Fraktur", False), (6, "Fraktur", True)]
    }},
    "messageStyle": "none",
}

html_theme = "sphinx_book_theme"
html_static_path = [str(HERE / "static")]
html_css_files = ["flashtext-book.css"]
html_copy_source = True  # the download button offers the chapter's .ipynb
html_show_sourcelink = False
html_last_updated_fmt = None
html_sidebars = {"**": ["navbar-logo.html", "sbt-sidebar-nav.html"]}  # search is in the header
html_theme_options = {
    "home_page_in_toc": True,
    "show_navbar_depth": 1,
    "show_toc_level": 2,
    "use_download_button": True,
    "use_fullscreen_button": False,
    "navigation_with_keys": True,
    "search_bar_text": "Search the book...",
    "footer_content_items": ["extra-footer.html"],
    "extra_footer": "Outputs are the ones stored in the repository. To run a chapter: "
                    "<code>make lab</code>.",
}
