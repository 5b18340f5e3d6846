"""When to show a live ipywidget, and when a static figure.

A live widget needs a frontend (JupyterLab) to render; nbval and ``jupyter nbconvert`` have none,
and would store a useless "VBox(...)" text. ``make test`` and ``make notebooks`` set
``FLASHTEXT_STATIC=1``; then :func:`show` draws the widget's static figure instead (the same
figure its first frame shows). In JupyterLab (``make lab``) the live widget appears.

A widget in this book is an object with two methods:

* ``widget()`` -> an ipywidgets container, live;
* ``figure()`` -> a matplotlib Figure of its current state, static.

Both are driven by the same state, so unit tests can set a value and check what changes.
"""

from __future__ import annotations

import os
from typing import Protocol


class BookWidget(Protocol):
    def widget(self): ...

    def figure(self): ...


def interactive() -> bool:
    """True when a live widget can be shown (not under FLASHTEXT_STATIC=1, ipywidgets present)."""
    if os.environ.get("FLASHTEXT_STATIC", "0") == "1":
        return False
    try:
        import ipywidgets  # noqa: F401
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


def show(book_widget: BookWidget) -> None:
    """Display the live widget, or its static figure when there is no frontend.

    The static figure is displayed as PNG bytes, so it is stored in the notebook whatever the
    matplotlib backend (under ``MPLBACKEND=Agg`` a bare Figure would store only its repr).
    """
    from IPython.display import display

    if interactive():
        display(book_widget.widget())
        return
    display(figure_png(book_widget.figure()))
    print("(static figure: open this chapter in JupyterLab, `make lab`, to interact)")


def redraw_into(out, book_widget: BookWidget) -> None:
    """Replace what an ipywidgets ``Output`` shows with the widget's current figure."""
    import matplotlib.pyplot as plt
    from IPython.display import display

    with out:
        out.clear_output(wait=True)
        fig = book_widget.figure()
        display(fig)
        plt.close(fig)


def figure_png(fig, dpi: int = 100):
    """A matplotlib Figure as an IPython PNG image (and close the figure)."""
    import io

    import matplotlib.pyplot as plt
    from IPython.display import Image

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    plt.close(fig)
    return Image(data=buf.getvalue(), format="png")
