"""Every slot has one owner (issue 52): only ``engine/counting/mode.py`` changes a counting mode's
attributes (other files go through its methods: ``resolve``, ``wrap_runner``/``unwrap_runner``,
``divert``, ``bind``), and each part of ``CountingState`` is written only by the engine files
its table (``state.WRITERS``) lists. Read from the source (AST): an assignment, an augmented
one, a ``del``, an item set or a mutating method called on the part."""

import ast
import pathlib

import pytest

import dispatch_flops
from dispatch_flops.engine.counting import mode, state

PACKAGE = pathlib.Path(dispatch_flops.__file__).parent
# parts whose dict is not the state's own: the accumulator forward_acc points at is a ledger
# frame's, where counting adds records (through a local name: ``acc = state.forward_acc``)
SHARED = frozenset(("forward_acc",))
MUTATORS = frozenset(("append", "extend", "insert", "pop", "popitem", "clear", "remove",
                      "update", "setdefault", "sort", "reverse", "__setitem__", "__delitem__"))


def _mode_attributes() -> frozenset:
    """Every attribute a counting mode class in mode.py sets on itself."""
    tree = ast.parse(pathlib.Path(mode.__file__).read_text())
    found = set()
    for cls in ast.walk(tree):
        if isinstance(cls, ast.ClassDef) and cls.name.endswith("CountingMode"):
            for node in ast.walk(cls):
                if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and \
                        isinstance(node.value, ast.Name) and node.value.id == "self":
                    found.add(node.attr)
    return frozenset(found)


def _last_name(node: ast.AST) -> str:
    """``relay.mode`` -> "mode", ``bottom`` -> "bottom", ``self._mode`` -> "_mode"."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Subscript):
        return _last_name(node.value)
    return ""


def _names_a_mode(node: ast.AST) -> bool:
    name = _last_name(node).lower()
    return "mode" in name or name in ("bottom", "counting")


def _names_a_state(node: ast.AST) -> bool:
    return _last_name(node).lstrip("_").endswith("state")


def _aliases(tree: ast.AST) -> dict:
    """``{local name: the attribute expression it names}`` for ``x = <obj>.<attr>`` (a list or
    dict of a mode or a state taken into a local name, then changed through it)."""
    found = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and \
                isinstance(node.targets[0], ast.Name) and isinstance(node.value, ast.Attribute):
            found[node.targets[0].id] = node.value
    return found


def _written(tree: ast.AST):
    """``(object expression, attribute, line)`` of every attribute the code writes: assigned,
    augmented, deleted, an item of it set or deleted, or a mutating method called on it,
    itself or through a local name it was taken into (``book = state.records``)."""
    aliases = _aliases(tree)
    for node in ast.walk(tree):
        targets: list = []
        if isinstance(node, (ast.Assign, ast.Delete)):
            targets = list(node.targets)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                node.func.attr in MUTATORS:
            targets = [node.func.value]
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                node.func.id == "setattr" and len(node.args) >= 2 and \
                isinstance(node.args[1], ast.Constant):
            yield node.args[0], node.args[1].value, node.lineno
        for target in targets:
            for part in (target.elts if isinstance(target, (ast.Tuple, ast.List)) else [target]):
                while isinstance(part, ast.Subscript):  # x.attr[k] = v writes x.attr
                    part = part.value
                if isinstance(part, ast.Name) and part is not target and \
                        part.id in aliases or isinstance(node, ast.Call) and \
                        isinstance(part, ast.Name) and part.id in aliases:
                    part = aliases[part.id]  # changed through a local name: not rebound
                    if part.attr in SHARED:
                        continue
                if isinstance(part, ast.Attribute):
                    yield part.value, part.attr, node.lineno


def mode_writes(source: str, filename: str) -> list:
    """The writes of a counting mode's attributes in ``source`` (file ``filename``), outside
    mode.py: ``mode.runner = x``, ``mode.__dict__[...] = f``, ``setattr(mode, "x", v)``."""
    if filename == "mode.py":
        return []
    attributes = _mode_attributes() | {"__dict__"}
    return [f"{filename}:{line}: {ast.unparse(obj)}.{attr}"
            for obj, attr, line in _written(ast.parse(source))
            if attr in attributes and _names_a_mode(obj)]


def state_writes(source: str, filename: str) -> list:
    """The writes of a ``CountingState`` part in ``source`` by a file its table does not
    list as that part's writer."""
    stem = filename.removesuffix(".py")
    found = []
    for obj, attr, line in _written(ast.parse(source)):
        if attr not in state.WRITERS:
            continue
        mine = stem == "state" and isinstance(obj, ast.Name) and obj.id == "self"
        if (mine or _names_a_state(obj)) and stem not in state.WRITERS[attr]:
            found.append(f"{filename}:{line}: {ast.unparse(obj)}.{attr}")
    return found


def _sources():
    for path in sorted(PACKAGE.rglob("*.py")):
        yield path.read_text(), path.name


def test_every_state_part_has_its_writers_listed():
    assert set(state.WRITERS) == set(state.CountingState.__slots__)


def test_only_mode_py_changes_a_counting_mode():
    found = [w for source, name in _sources() for w in mode_writes(source, name)]
    assert not found, "a counting mode's attribute written outside mode.py (add a method " \
                      f"there): {found}"


def test_state_parts_are_written_only_by_their_listed_writers():
    found = [w for source, name in _sources() for w in state_writes(source, name)]
    assert not found, f"a CountingState part written outside its writers (state.WRITERS): {found}"


@pytest.mark.parametrize("code", [
    "bottom.runner = Relay(bottom.runner)",
    "relay.mode.runner = relay.runner",
    "self.mode.__dict__['__torch_dispatch__'] = handler",
    "setattr(mode, 'runner', None)",
    "tracker.mode.state = other",
    "wrappers = self.mode._wrappers\nwrappers.append(relay)",
])
def test_the_mode_guard_finds_what_it_guards(code):
    assert mode_writes(code, "counter.py")
    assert not mode_writes(code, "mode.py")


@pytest.mark.parametrize("code, writer", [
    ("tracker.state.forward_acc = acc", "tracker.py"),
    ("self.state.recomputing = False", "tracker.py"),
    ("state.boundary_seqs.append(1)", "steps.py"),
    ("del state.boundary_frames[1:]", "steps.py"),
    ("book = self.state.records\nbook.append(rec)", "step_replay.py"),
    ("tags = state.p2p_tags\ntags[1] = (t, acc)", "state.py"),
    ("state.stepping, state.in_step = True, ()", "state.py"),
])
def test_the_state_guard_finds_what_it_guards(code, writer):
    """Each write is found in a file its part does not list, and passes in one it does."""
    assert state_writes(code, "compiled.py")
    mine = code.replace("state.", "self.") if writer == "state.py" else code
    assert not state_writes(mine, writer)
