"""Module names, guarded: no two modules of the package share a file name, so a name in a
traceback, an import or a review points at one file."""

import importlib
import pkgutil
from collections import defaultdict

import dispatch_flops

# The top-level shims are the public import paths of moved modules: each is bound to the
# module it names (``dispatch_flops.export is dispatch_flops.views.export``), one module
# under two paths, so their names are meant to repeat. Nothing else is exempt.
SHIMS = {
    "dispatch_flops.export": "dispatch_flops.views.export",
    "dispatch_flops.plot": "dispatch_flops.views.plot",
    "dispatch_flops.distributed": "dispatch_flops.workflows.distributed",
}


def _modules() -> list[str]:
    """Every module of the package, the formula library included (``dispatch_flops.formulas``,
    wherever it is installed from)."""
    import dispatch_flops.formulas as formulas

    # the formula library is walked on its own: installed through setuptools' package-dir,
    # it need not sit under dispatch_flops' folder (an editable install maps it there)
    names = {m.name for m in pkgutil.walk_packages(dispatch_flops.__path__, "dispatch_flops.")}
    names.update(m.name for m in pkgutil.walk_packages(formulas.__path__,
                                                        "dispatch_flops.formulas."))
    return sorted(names)


def _doubled(names: list[str]) -> dict[str, list[str]]:
    """The basenames two or more of ``names`` share, packages' ``__init__`` apart (a package
    is named by its folder)."""
    by_basename = defaultdict(list)
    for name in names:
        by_basename[name.rsplit(".", 1)[-1]].append(name)
    return {base: found for base, found in by_basename.items() if len(found) > 1}


def test_no_two_modules_share_a_basename():
    """Apart from the shims, every module's last name is its own."""
    names = [n for n in _modules() if n not in SHIMS]
    assert "dispatch_flops.engine.counting.mode" in names
    assert "dispatch_flops.formulas.matmul" in names
    assert _doubled(names) == {}


def test_the_exempt_shims_are_the_modules_they_name():
    """A shim is exempt only because it is its module under a second path: importing both
    gives one object."""
    for shim, target in SHIMS.items():
        assert importlib.import_module(shim) is importlib.import_module(target)


def test_a_doubled_basename_is_found():
    """The check sees a name two rooms share, and only that one."""
    names = ["dispatch_flops.engine.facts", "dispatch_flops.results.facts",
             "dispatch_flops.results.rows"]
    assert _doubled(names) == {"facts": names[:2]}
