"""One home for text (docs/architecture.md, "Two things to know first"): every text a result
or a workflow prints is laid out in ``views/``. ``results/`` and ``workflows/`` compute
figures; their text methods hand the object to the views (results through the presenter,
``results.present``; workflows by calling ``dispatch_flops.views``), and they lay out no text.

Laying out text, as this test reads the source: importing ``tabulate`` or ``textwrap``; a
format spec with an alignment or a width (``f"{x:>7}"``, ``f"{x:<{w}}"``, ``"{:>5}".format``,
``format(x, "<9")``, ``"%-10s" % x``); ``str.ljust`` / ``rjust`` / ``center``; joining lines
(``"\\n".join``). Messages (errors, warnings, reprs) and the one-line phrases they quote are
not layouts and stay beside the code that raises them.

A text method: a function returning ``str`` whose name says it renders (``__str__``,
``table``, ``render*``, ``*_table``, ``*_text``). Each of its ``return`` statements returns a
call into the views, another text method of ``self`` (``__str__``: ``self.table()``), or a
string enum's own value (``str.__str__(self)``); a stub (a ``Protocol``'s ``...``) has none."""

from __future__ import annotations

import ast
import pathlib
import re
import string

import pytest

import dispatch_flops

PACKAGE = pathlib.Path(dispatch_flops.__file__).parent
ROOMS = ("results", "workflows")
LAYOUT_MODULES = {"tabulate", "textwrap"}
PADDING_METHODS = {"ljust", "rjust", "center"}
TEXT_METHOD = re.compile(r"(__str__|table|render\w*|\w+_table|\w+_text)")
# Python's format-spec mini-language; a nested field (``{w}``) reads as the digit 9
_SPEC = re.compile(r"(?P<align>.?[<>=^])?[-+ ]?z?#?(?P<zero>0)?(?P<width>\d*)[_,]?(\.\d+)?"
                   r"[a-zA-Z%]?")
_PERCENT_WIDTH = re.compile(r"%(\([^)]*\))?[-+ #0]*(\d+|\*)")


def _pads(spec: str) -> bool:
    """Whether a format spec aligns or pads to a width (an unreadable spec counts as one)."""
    match = _SPEC.fullmatch(spec)
    return match is None or bool(match["align"] or match["zero"] or match["width"])


def _spec_text(node: ast.AST) -> str:
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "9" for v in node.values)
    return ""


def _is_str(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


def layouts(tree: ast.AST) -> list[str]:
    """Each place ``tree`` lays out text, as ``"line N: what"``."""
    found = []
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""]
            found += [f"line {line}: imports {n}" for n in names
                      if n.split(".")[0] in LAYOUT_MODULES]
        elif isinstance(node, ast.FormattedValue) and node.format_spec is not None:
            if _pads(_spec_text(node.format_spec)):
                found.append(f"line {line}: pads an f-string field")
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod) and \
                _is_str(node.left) and _PERCENT_WIDTH.search(node.left.value):
            found.append(f"line {line}: pads a %-format")
        elif isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name) and func.id == "format" and len(node.args) == 2 \
                    and _is_str(node.args[1]) and _pads(node.args[1].value):
                found.append(f"line {line}: pads with format()")
            if not isinstance(func, ast.Attribute):
                continue
            if func.attr in PADDING_METHODS:
                found.append(f"line {line}: pads with str.{func.attr}")
            elif func.attr == "join" and _is_str(func.value) and "\n" in func.value.value:
                found.append(f"line {line}: joins lines")
            elif func.attr == "format" and _is_str(func.value) and any(
                    spec and _pads(spec)
                    for _, _, spec, _ in string.Formatter().parse(func.value.value)):
                found.append(f"line {line}: pads with str.format")
    return found


def _views_names(tree: ast.AST) -> set:
    """Names bound by imports from ``dispatch_flops.views``."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                "dispatch_flops.views"):
            names.update(a.asname or a.name for a in node.names)
        elif isinstance(node, ast.Import):
            names.update(a.asname or a.name for a in node.names
                         if a.name.startswith("dispatch_flops.views"))
    return names


def _root(node: ast.AST) -> ast.AST:
    while isinstance(node, (ast.Attribute, ast.Call)):
        node = node.value if isinstance(node, ast.Attribute) else node.func
    return node


def _returns(function: ast.AST) -> list:
    """The ``return`` statements of ``function`` itself (not of functions nested in it)."""
    out, todo = [], list(ast.iter_child_nodes(function))
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        if isinstance(node, ast.Return):
            out.append(node)
        todo.extend(ast.iter_child_nodes(node))
    return out


def undelegated(tree: ast.AST) -> list[str]:
    """Each text method of ``tree`` that returns anything but a call into the views (or
    another text method of ``self``), as ``"name (line N)"``."""
    views = _views_names(tree)

    def delegates(value) -> bool:
        if not isinstance(value, ast.Call):
            return False
        func = value.func
        if ast.unparse(func).startswith("present.presenter()."):
            return True
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and \
                func.value.id == "self" and TEXT_METHOD.fullmatch(func.attr):
            return True
        if ast.unparse(value) == "str.__str__(self)":
            return True
        root = _root(func)
        return isinstance(root, ast.Name) and root.id in views

    found = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or \
                not TEXT_METHOD.fullmatch(node.name) or node.returns is None or \
                ast.unparse(node.returns).strip("'\"") != "str":
            continue
        body = node.body[1:] if ast.get_docstring(node) is not None else node.body
        if all(isinstance(b, ast.Expr) and isinstance(b.value, ast.Constant) and
               b.value.value is Ellipsis for b in body):
            continue  # a stub: nothing rendered
        returns = _returns(node)
        if not returns or not all(delegates(r.value) for r in returns):
            found.append(f"{node.name} (line {node.lineno})")
    return found


def _sources() -> list:
    return sorted(p for room in ROOMS for p in (PACKAGE / room).rglob("*.py"))


@pytest.mark.parametrize("path", _sources(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_results_and_workflows_lay_out_no_text(path):
    """No module of results/ or workflows/ lays out text: that is views/' work."""
    assert layouts(ast.parse(path.read_text())) == []


@pytest.mark.parametrize("path", _sources(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_text_methods_hand_over_to_the_views(path):
    """Every text method of results/ and workflows/ returns a call into the views."""
    assert undelegated(ast.parse(path.read_text())) == []


def test_the_rooms_have_text_methods_to_check():
    """The checks above read real code: the rooms' known text methods are found."""
    names = {node.name for path in _sources() for node in ast.walk(ast.parse(path.read_text()))
             if isinstance(node, ast.FunctionDef) and TEXT_METHOD.fullmatch(node.name)}
    assert {"__str__", "table", "experts_table", "mfu_text", "hfu_text", "get_table"} <= names


LAID_OUT = '''
import textwrap
from tabulate import tabulate

def experts_text(stats) -> str:
    lines = [f"{'Layer':<{width}}  Experts"]
    lines.append(f"{s.calls:>5}  {s.padding:7.1%}")
    return "\\n".join(lines)

def other(x):
    return x.ljust(9), "{:>5}".format(x), format(x, "<9"), "%-10s" % x, "{:,}".format(x)
'''

HANDED_OVER = '''
from dispatch_flops.results import present
from dispatch_flops.views.text import throughput_text
from dispatch_flops.views import text

class Reading:
    def __str__(self) -> str:
        return throughput_text(self)

    def table(self) -> str:
        if self.empty:
            raise ValueError("nothing to show")
        return text.generation_table(self)

    def mfu_text(self) -> str:
        return present.presenter().utilisation_text(self)

    def as_text(self) -> str:
        return self.table()

class Presenter(Protocol):
    def table(self, profile) -> str: ...

class Phase(str, enum.Enum):
    def __str__(self) -> str:
        return str.__str__(self)

def write_text(path, text) -> None:  # writes text, renders none
    path.write_text(text)

def line(x) -> str:  # a message, not a layout
    return f"{x:.2f} ms, {x:,} calls, {x:.1%} of {x!r}"
'''

RENDERED_HERE = '''
class Reading:
    def __str__(self) -> str:
        return f"{self.steps} steps"

    def table(self) -> str:
        if self.timed:
            return render_timed(self)
        return present.presenter().table(self)
'''


def test_the_criterion_flags_layouts_and_passes_messages():
    """Each kind of layout is flagged once, every format spec without a width passes."""
    found = layouts(ast.parse(LAID_OUT))
    assert [f.split(": ", 1)[1] for f in found].count("pads an f-string field") == 3
    for kind in ("imports textwrap", "imports tabulate", "joins lines", "pads with str.ljust",
                 "pads with str.format", "pads with format()", "pads a %-format"):
        assert any(f.endswith(kind) for f in found), kind
    assert len(found) == 10
    assert layouts(ast.parse(HANDED_OVER)) == []


def test_the_criterion_flags_text_methods_that_render():
    """A text method that builds its own string, or hands it anywhere but the views on one
    of its paths, is flagged; delegations through the presenter or a views import pass."""
    assert undelegated(ast.parse(HANDED_OVER)) == []
    assert undelegated(ast.parse(RENDERED_HERE)) == ["__str__ (line 3)", "table (line 6)"]


def test_generation_rows_are_labelled_with_the_workflows_phases():
    """views.text labels a generation's rows without importing the workflow above it: its
    labels are the workflow's ENCODER, PREFILL and DECODE."""
    from dispatch_flops.views import text
    from dispatch_flops.workflows import generation

    assert (text._ENCODER, text._PREFILL, text._DECODE) == (
        generation.ENCODER, generation.PREFILL, generation.DECODE)
