"""Small display helpers: show library source in a notebook, and banners for recorded results."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any


def source(obj: Callable[..., Any] | type) -> str:
    """Display (and return) the source of a flashtext function or class, so the text of a
    chapter and the library it imports can never drift apart."""
    text = inspect.getsource(obj)
    where = f"# {inspect.getsourcefile(obj).rsplit('flashtext', 1)[-1].lstrip('/')}" \
        if inspect.getsourcefile(obj) else ""
    try:
        from IPython.display import Code, display

        display(Code(f"# flashtext{'/' if where else ''}{where[2:]}\n{text}", language="python"))
    except ImportError:
        print(text)
    return text


def banner(text: str, kind: str = "recorded") -> None:
    """A clear boxed banner, e.g. above results recorded on an H200 shown on a CPU machine."""
    title = {"recorded": "RECORDED RESULTS", "gpu-only": "GPU ONLY", "note": "NOTE"}.get(kind, kind)
    lines = [f"== {title} =="] + [line for line in text.splitlines()]
    width = max(len(line) for line in lines) + 4
    print("+" + "-" * (width - 2) + "+")
    for line in lines:
        print("| " + line.ljust(width - 4) + " |")
    print("+" + "-" * (width - 2) + "+")
