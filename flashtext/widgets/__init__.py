"""Interactive figures for the chapters, each degrading to a static figure without a frontend.

One module per family of widgets; :mod:`flashtext.widgets.base` holds the shared rule for when
to show a live widget and when to draw a static figure instead.
"""

from flashtext.widgets.base import interactive, show

__all__ = ["interactive", "show"]
