"""The package's shape, guarded: every module imports; no import cycle (lazy imports
included); imports only go down the rooms (docs/architecture.md); the formula library never
imports the engine; a counter and a Profile answer the same views with the same signatures."""

import ast
import functools
import importlib
import inspect
import pathlib
import pkgutil
from dataclasses import fields

import pytest
import torch

import dispatch_flops
from dispatch_flops import FlopCounter, Profile
from dispatch_flops.results import combine, queries
from dispatch_flops.results.facts import ModuleFacts, RunFacts

PACKAGE = pathlib.Path(dispatch_flops.__file__).parent
FORMULAS = pathlib.Path(dispatch_flops.formulas.__file__).parent

# Each room's layer, bottom first: a module may import its own room and lower layers only.
# engine and views share a layer: neither imports the other (both read results).
LAYERS = {
    "formulas": 0,
    "results": 1,
    "engine": 2, "views": 2,
    "counter": 3, "models": 3,
    "workflows": 4,
    "compat": 5,
    "integrations": 6,
    "export": 7, "plot": 7, "distributed": 7,  # the public paths of moved modules
    "__init__": 8,  # dispatch_flops itself: re-exports every room
    "__main__": 9,
}


def _type_only(tree: ast.AST) -> set:
    """The import statements under ``if TYPE_CHECKING:``: read by type checkers, never run."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            out.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return out


def _imports(path: pathlib.Path, package: str, module: str) -> set:
    """Modules of ``package`` that ``path`` imports when it runs, lazily inside functions
    too (imports for type checkers only are left out)."""
    tree = ast.parse(path.read_text())
    found = set()
    here = module.rsplit(".", 1)[0] if not path.name == "__init__.py" else module
    type_only = _type_only(tree)
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = here.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            names = [target] + [f"{target}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        found.update(n for n in names if n == package or n.startswith(package + "."))
    return found


def _modules(root: pathlib.Path, package: str) -> dict:
    """``{dotted name: path}`` of every module under ``root`` (packages by their name)."""
    out = {}
    for path in root.rglob("*.py"):
        parts = path.relative_to(root).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join((package,) + parts)] = path
    return out


def _graph(modules: dict, package: str) -> dict:
    """``{module: modules of the package it imports}`` of ``{module: path}``; ``from pkg.mod
    import name`` names ``pkg.mod``."""
    graph = {}
    for name, path in modules.items():
        targets = set()
        for m in _imports(path, package, name):
            while m not in modules and "." in m:
                m = m.rsplit(".", 1)[0]
            if m in modules and m != name:
                targets.add(m)
        graph[name] = targets
    return graph


def _cycles(graph: dict) -> list:
    cycles, state = [], {}

    def visit(node, trail):
        state[node] = "open"
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                cycles.append(trail[trail.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, trail + [nxt])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return cycles


def _room(module: str, package: str) -> str:
    parts = module.split(".")
    return "__init__" if len(parts) == 1 else parts[1]


def _upward(graph: dict, package: str, layers: dict) -> list:
    """Imports that go up, or sideways into another room of the same layer."""
    bad = []
    for module, targets in graph.items():
        room = _room(module, package)
        for target in targets:
            other = _room(target, package)
            if other != room and layers[other] >= layers[room]:
                bad.append(f"{module} ({room}) imports {target} ({other})")
    return sorted(bad)


def _package_graph() -> dict:
    modules = _modules(PACKAGE, "dispatch_flops")
    # the formula library: installed as dispatch_flops.formulas, kept at the top of the repo
    modules.update(_modules(FORMULAS, "dispatch_flops.formulas"))
    return _graph(modules, "dispatch_flops")


def test_every_room_has_a_layer():
    rooms = {_room(m, "dispatch_flops") for m in _package_graph()}
    assert rooms == set(LAYERS), rooms ^ set(LAYERS)


def test_no_import_cycle_inside_the_package():
    assert not _cycles(_package_graph())


def test_imports_only_go_down_the_rooms():
    assert not _upward(_package_graph(), "dispatch_flops", LAYERS)


def test_the_formula_library_never_imports_the_engine():
    for path in FORMULAS.rglob("*.py"):
        outside = {m for m in _imports(path, "dispatch_flops", "dispatch_flops.formulas.x")
                   if not m.startswith("dispatch_flops.formulas")}
        assert not outside, (path.name, outside)


def test_the_shape_tests_find_what_they_guard(tmp_path):
    """The checks above can fail: a lazy import cycle, and an import up the rooms or sideways
    between engine and views, are reported."""
    (tmp_path / "results").mkdir()
    (tmp_path / "engine").mkdir()
    (tmp_path / "views").mkdir()
    for room in ("results", "engine", "views"):
        (tmp_path / room / "__init__.py").write_text("")
    (tmp_path / "results" / "a.py").write_text("def f():\n    from pkg.engine.b import g\n")
    (tmp_path / "engine" / "b.py").write_text("from pkg.results.a import f\n"
                                              "from pkg.views import c\n")
    (tmp_path / "views" / "c.py").write_text("from ..results import a\n")
    graph = _graph(_modules(tmp_path, "pkg"), "pkg")
    assert graph["pkg.engine.b"] == {"pkg.results.a", "pkg.views", "pkg.views.c"}
    assert graph["pkg.views.c"] == {"pkg.results", "pkg.results.a"}
    assert _cycles(graph) == [["pkg.engine.b", "pkg.results.a", "pkg.engine.b"]]
    layers = {"results": 1, "engine": 2, "views": 2}
    assert _upward(graph, "pkg", layers) == [
        "pkg.engine.b (engine) imports pkg.views (views)",
        "pkg.engine.b (engine) imports pkg.views.c (views)",
        "pkg.results.a (results) imports pkg.engine.b (engine)"]


def test_every_module_of_the_package_imports():
    """No module left behind that nothing uses and that no longer imports (a removed name)."""
    failed = []
    for info in pkgutil.walk_packages(dispatch_flops.__path__, "dispatch_flops."):
        try:
            importlib.import_module(info.name)
        except Exception as e:  # noqa: BLE001 - the test reports any failure
            failed.append((info.name, repr(e)))
    assert not failed, failed


def test_public_import_paths_are_the_moved_modules():
    import dispatch_flops.distributed
    import dispatch_flops.export
    import dispatch_flops.plot
    from dispatch_flops.views import export, plot
    from dispatch_flops.workflows import distributed

    assert dispatch_flops.export is export and dispatch_flops.plot is plot
    assert dispatch_flops.distributed is distributed


def test_the_package_ships_its_types():
    assert (PACKAGE / "py.typed").is_file()


# ---- one set of views, written out ------------------------------------------------------


@pytest.mark.parametrize("name", queries.VIEWS)
def test_a_counter_and_a_profile_answer_the_same_view(name):
    """Every view of ``ProfileViews`` is on both, with one signature (a real one: an IDE and
    mypy read it), and a docstring."""
    mine, theirs = getattr(FlopCounter, name), getattr(Profile, name)
    if isinstance(mine, property):
        assert isinstance(theirs, property) and mine.fget is theirs.fget
        return
    assert inspect.signature(mine, eval_str=True) == inspect.signature(theirs, eval_str=True)
    assert "args" not in inspect.signature(mine).parameters
    assert mine.__doc__ or name.startswith("__")


def test_views_have_real_signatures():
    parameters = inspect.signature(FlopCounter.table).parameters
    assert list(parameters) == ["self", "depth", "columns", "width", "ops", "ranks",
                                "group"]
    assert {"imbalance", "logical", "graph_runs", "in_graphs"} <= set(queries.VIEWS)
    public = {n for n in dir(Profile) if not n.startswith("_")}
    facts = {"from_dict", "from_json", "merge", "per_step", "with_medians", "replace", "memo",
             "alike",
             "rows", "trace", "timing", "attention", "repeats", "steps", "wall_s",
             "root_label", "has_model", "saved_activations", "dtype", "to_profile"}
    # what a Profile answers beyond the shared views is its data and its combinations
    assert public - set(queries.VIEWS) == facts


# ---- how each fact of a run combines ----------------------------------------------------


def test_every_fact_has_its_combination_rule():
    """A new field of ModuleFacts or RunFacts cannot be forgotten by merge / per_step /
    since / with_medians: each has one line in combine's table."""
    assert set(combine.MODULE_RULES) == {f.name for f in fields(ModuleFacts)}
    assert set(combine.RUN_RULES) == {f.name for f in fields(RunFacts)}


# ---- size and seams ----------------------------------------------------------------------

CLASS_LINES_MAX = 450


def test_no_class_is_over_450_lines():
    """Every class in the package and the formula library fits in 450 lines (decorators and
    docstring included): a class that grows past it is carved (engine.counting.dtensor,
    engine.counting.exotic, engine.counting.steps are the mode's and the tracker's carved
    parts)."""
    over = {}
    for root in (PACKAGE, FORMULAS):
        for path in root.rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ClassDef):
                    start = min([node.lineno] + [d.lineno for d in node.decorator_list])
                    lines = node.end_lineno - start + 1
                    if lines > CLASS_LINES_MAX:
                        over[f"{path.name}:{node.name}"] = lines
    assert over == {}


def _subpackage(path: pathlib.Path) -> str:
    """The room of a module: its subpackage (``engine``, ``results``, ...); a top-level
    module (``counter``, ``models``) is a room of its own."""
    parts = path.relative_to(PACKAGE).parts
    return parts[0] if len(parts) > 1 else path.stem


def _defined_private_names(tree: ast.AST) -> set:
    """The ``_names`` a module defines for its objects: functions, methods and classes,
    class-level names and ``__slots__``, attributes it sets on ``self``/``cls``."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and \
                isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
            names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            pass
    for node in ast.walk(tree):  # __slots__ = ("_a", "_b")
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__slots__" for t in node.targets):
            names.update(e.value for e in ast.walk(node.value)
                         if isinstance(e, ast.Constant) and isinstance(e.value, str))
    return {n for n in names if _private(n)}


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _root(node: ast.AST) -> str:
    """The name an attribute chain starts from (``torch`` for ``torch._ops.OpOverload``)."""
    while isinstance(node, (ast.Attribute, ast.Call, ast.Subscript)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else ""


@functools.cache
def _torch_names() -> frozenset:
    """Private names torch's own objects carry (modules, tensors, autograd nodes): reading
    them is the package's business with torch, not a reach into another room."""
    node = torch.ones(1, requires_grad=True).exp().grad_fn
    return frozenset(dir(torch.nn.Module) + list(vars(torch.nn.Module())) +
                     dir(torch.Tensor) + dir(node))


def _private_reaches(path: pathlib.Path, tree: ast.AST, own: set, others: set) -> list:
    """``<line>: <what>`` for each reach into another room's private names in one module."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and \
                node.module.startswith("dispatch_flops."):
            module = node.module
            mine = ".".join(("dispatch_flops",) + path.relative_to(PACKAGE)
                            .with_suffix("").parts)
            for alias in node.names:
                if _private(alias.name) and module != mine:
                    found.append(f"{node.lineno}: from {module} import {alias.name}")
        name = None
        if isinstance(node, ast.Attribute) and not (
                isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
            name = node.attr
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                node.func.id in ("getattr", "setattr", "hasattr", "delattr") and \
                len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and \
                isinstance(node.args[1].value, str) and not (
                    isinstance(node.args[0], ast.Name) and node.args[0].id in ("self", "cls")):
            name = node.args[1].value
        if name is not None and _private(name) and name in others and name not in own \
                and name not in _torch_names() and _root(node) not in ("torch", "sys"):
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_room_reaches_into_another_rooms_private_names():
    """No module uses a private (``_name``) attribute of an object another room of the
    package made, nor imports a private name from another module.

    The rule, pragmatic: an attribute ``x._name`` (or ``getattr(x, "_name")``) read or
    written on anything but ``self``/``cls`` is a reach-in when ``_name`` is defined in
    another room (a subpackage, or a top-level module such as ``counter``) and nowhere in
    the module's own room; names only torch's objects carry (``module._parameters``,
    ``func._schema``) are defined in no room and pass. ``from dispatch_flops.<module> import
    _name`` of a module other than its own is a reach-in wherever it is (a private name is
    its module's). Dunder names pass; tests are exempt."""
    trees = {path: ast.parse(path.read_text()) for path in PACKAGE.rglob("*.py")
             if path.resolve().is_relative_to(PACKAGE.resolve())
             and FORMULAS.resolve() not in path.resolve().parents}
    by_room: dict = {}
    for path, tree in trees.items():
        by_room.setdefault(_subpackage(path), set()).update(_defined_private_names(tree))
    found = {}
    for path, tree in trees.items():
        room = _subpackage(path)
        others = set().union(*(names for r, names in by_room.items() if r != room))
        reaches = _private_reaches(path, tree, by_room[room], others)
        if reaches:
            found[str(path.relative_to(PACKAGE))] = reaches
    assert found == {}
