"""Arithmetic written in the chapters' prose multiplies out.

A worked example in Markdown shows its arithmetic, "$2 \\cdot 64 \\cdot 16 \\cdot 1024^2 \\cdot
64 = 137.4$ GFLOP", and the cell below it asserts the library's number. Nothing held the prose to
the cell: an expression could say one thing and its result another. This test reads every math
span of the chapters' Markdown, evaluates each side of ``=``, ``\\approx``, ``\\le``, ``<`` ... that
is made of numbers only (symbols make a side unknown and it is skipped), and checks the relation.

A result written as a rounded decimal is allowed its rounding (half a unit in its last digit) and
any power-of-1000 scale (the unit, GB or ms, is outside the math); decimal operands carry their
own rounding into the tolerance. Integers on the left are taken as exact.
"""

from __future__ import annotations

import ast
import math
import operator
import re
from dataclasses import dataclass
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted((ROOT / "chapters").glob("*.ipynb"))

RELATIONS = {"=": operator.eq, r"\approx": operator.eq, r"\le": operator.le,
             r"\leq": operator.le, r"\ge": operator.ge, r"\geq": operator.ge, "<": operator.lt,
             ">": operator.gt}
_REL = re.compile(r"(\\approx|\\leq?|\\geq?|(?<![<>])[=<>](?!=))")
_MATH = re.compile(r"\$\$(.+?)\$\$|\$(.+?)\$", re.S)
_FUNCS = {"ceil": math.ceil, "floor": math.floor, "sqrt": math.sqrt, "exp": math.exp,
          "log": math.log}
UNITS = ("TB/s", "GB/s", "GiB", "MiB", "KiB", "GB", "MB", "KB", "TB", "B", "ms", "us", "µs", "s",
         "GFLOP", "TFLOP", "FLOP/B", "FLOP", "elements", "scores", "bytes")
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
        ast.Div: operator.truediv, ast.Pow: operator.pow}


@dataclass(frozen=True)
class Side:
    value: float
    rel_err: float  # relative rounding carried by its decimal literals
    literal_step: float | None  # a bare number: the place value of its last digit


def _braced(text: str, start: int) -> tuple[str, int]:
    """The content of the {...} group starting at ``text[start]`` and the index after it."""
    assert text[start] == "{"
    depth = 0
    for k in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[k], 0)
        if depth == 0:
            return text[start + 1:k], k + 1
    raise ValueError("unbalanced braces")


def _to_python(tex: str) -> str | None:
    """LaTeX arithmetic as a Python expression, or None when it holds anything but numbers."""
    s = tex.strip().rstrip(".,;:")
    s = re.sub(r"\\text\{\s*(" + "|".join(re.escape(u) for u in UNITS) + r")\s*\}", "", s)
    s = s.replace("{,}", "").replace(r"\,", "").replace(r"\!", "").replace(r"\;", "")
    s = s.replace(r"\quad", "").replace("~", "")
    for big in (r"\bigl", r"\bigr", r"\Bigl", r"\Bigr", r"\left", r"\right", r"\big", r"\Big"):
        s = s.replace(big, "")
    s = s.replace(r"\cdot", "*").replace(r"\times", "*")
    s = s.replace(r"\lceil", "ceil(").replace(r"\rceil", ")")
    s = s.replace(r"\lfloor", "floor(").replace(r"\rfloor", ")")
    out, k = [], 0
    while k < len(s):  # \frac{a}{b}, \sqrt{x}, e^{x}, x^{y}
        if s.startswith(r"\frac", k) and s[k + 5:k + 6] == "{":
            a, k = _braced(s, k + 5)
            b, k = _braced(s, k)
            inner_a, inner_b = _to_python(a), _to_python(b)
            if inner_a is None or inner_b is None:
                return None
            out.append(f"(({inner_a})/({inner_b}))")
        elif s.startswith(r"\sqrt", k) and s[k + 5:k + 6] == "{":
            a, k = _braced(s, k + 5)
            inner = _to_python(a)
            if inner is None:
                return None
            out.append(f"sqrt({inner})")
        elif s[k] == "^":
            if s[k + 1:k + 2] == "{":
                a, k = _braced(s, k + 1)
            else:
                a, k = s[k + 1:k + 2], k + 2
            inner = _to_python(a)
            if inner is None:
                return None
            if out and out[-1] == "e":  # e^{x}
                out[-1] = f"exp({inner})"
            else:
                out.append(f"**({inner})")
        elif s.startswith(r"\ln", k) or s.startswith(r"\log", k) and not s.startswith(
                r"\log_", k):
            k += 3 if s.startswith(r"\ln", k) else 4
            out.append("log")
        else:
            out.append(s[k])
            k += 1
    py = "".join(out).replace("{", "(").replace("}", ")")
    py = re.sub(r"(?<=[\d)])\s*\(", "*(", py)  # 2(3 + 4): implicit product
    py = re.sub(r"\)\s*(?=[\d(]|exp|sqrt|log|ceil|floor)", ")*", py)
    if not py.strip() or re.search(r"[A-Za-z_\\]", re.sub(r"exp|sqrt|log|ceil|floor", "", py)):
        return None
    return py


def _eval(node: ast.AST) -> float:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_eval(node.left), _eval(node.right))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        return -_eval(node.operand) if isinstance(node.op, ast.USub) else _eval(node.operand)
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id in _FUNCS and len(node.args) == 1):
        return _FUNCS[node.func.id](_eval(node.args[0]))
    raise ValueError(f"not arithmetic: {ast.dump(node)}")


def parse_side(tex: str) -> Side | None:
    py = _to_python(tex)
    if py is None:
        return None
    try:
        value = float(_eval(ast.parse(py, mode="eval")))
    except (SyntaxError, ValueError, ZeroDivisionError, OverflowError, TypeError):
        return None
    rel = sum(0.5 * 10.0 ** -len(frac) / max(float(m), 1e-300)
              for m, frac in re.findall(r"(\d+\.(\d+))", py))
    literal = re.fullmatch(r"\s*-?\d+(\.(\d+))?\s*", py)
    step = None
    if literal:
        step = 10.0 ** -len(literal.group(2)) if literal.group(2) else 1.0
        rel = 0.0
    return Side(value, rel, step)


def holds(rel: str, a: Side, b: Side) -> bool:
    """Does ``a rel b`` hold, within the rounding of what is written?"""
    if RELATIONS[rel] is not operator.eq:
        return RELATIONS[rel](a.value, b.value)
    if a.literal_step is None and b.literal_step is None:  # two expressions: equal
        tol = (a.rel_err + b.rel_err) * max(abs(a.value), abs(b.value))
        return math.isclose(a.value, b.value, rel_tol=1e-9) or abs(a.value - b.value) <= tol
    expr, lit = (a, b) if b.literal_step is not None else (b, a)
    for k in range(-5, 6):  # the unit (GB, ms, GFLOP ...) sits outside the math
        scale = 1000.0 ** k
        tol = 0.5 * lit.literal_step * scale * (1 + 1e-9) + expr.rel_err * abs(expr.value)
        if abs(expr.value - lit.value * scale) <= tol:
            return True
    return False


def claims(markdown: str) -> list[tuple[str, str, str, str]]:
    """(span, left, relation, right) for every adjacent pair of a relation chain."""
    found = []
    for m in _MATH.finditer(markdown):
        span = m.group(1) or m.group(2)
        for line in re.split(r"\\\\|,\s*\\quad|\\qquad|;", span.replace("\n", " ")):
            parts = _REL.split(line)
            sides, rels = parts[0::2], parts[1::2]
            for k, rel in enumerate(rels):
                found.append((span.strip(), sides[k], rel, sides[k + 1]))
    return found


def wrong_claims(markdown: str) -> list[str]:
    bad = []
    for span, left, rel, right in claims(markdown):
        a, b = parse_side(left), parse_side(right)
        if a is not None and b is not None and not holds(rel, a, b):
            bad.append(f"${span}$: {left.strip()} = {a.value:.6g}, {right.strip()} = "
                       f"{b.value:.6g}")
    return bad


def checked_count(markdown: str) -> int:
    return sum(parse_side(left) is not None and parse_side(right) is not None
               for _, left, _, right in claims(markdown))


# ----------------------------------------------------------------------------------- the tests

def test_the_checker_catches_what_it_is_for():
    # the worked example's first version: the batch written as 1024, the product 16x too big
    assert wrong_claims(r"$2 \cdot 1024 \cdot 16 \cdot 1024^2 \cdot 64 = 137.4$ GFLOP")
    assert not wrong_claims(r"$2 \cdot 64 \cdot 16 \cdot 1024^2 \cdot 64 = 137.4$ GFLOP")
    assert wrong_claims(r"$B_c = \lceil 49152 / 256 \rceil = 193$")
    assert not wrong_claims(r"$B_c = \lceil 49152 / 256 \rceil = 192$")
    assert not wrong_claims(r"$1024 \times 1{,}048{,}576 \times 2 = 2^{31}$")
    assert wrong_claims(r"$45{,}184 \le 41{,}152$")
    assert not wrong_claims(r"$e^{3-5} = e^{-2} \approx 0.1353$")
    assert wrong_claims(r"$e^{3-5} \approx 0.1363$")
    assert not wrong_claims(r"$\frac{3}{4} = 0.75$, and $137.4 / 2.42 = 56.9$")  # rounded inputs
    assert not wrong_claims(r"$m(x) = \max_i x_i$, $N \times N$")  # symbols: nothing to check


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.name)
def test_prose_arithmetic_multiplies_out(path):
    nb = nbformat.read(path, as_version=4)
    bad = [f"cell {c.get('id')}: {claim}" for c in nb.cells if c.cell_type == "markdown"
           for claim in wrong_claims(c.source)]
    assert bad == [], "\n".join(bad)


def test_the_chapters_have_arithmetic_to_check():
    """The parser still finds the worked examples' arithmetic (a parser that finds nothing
    passes every chapter)."""
    text = {p.name[:2]: "\n".join(c.source for c in nbformat.read(p, as_version=4).cells
                                  if c.cell_type == "markdown") for p in CHAPTERS}
    assert checked_count(text["01"]) >= 7 and checked_count(text["04"]) >= 8
    assert checked_count(text["06"]) >= 6
