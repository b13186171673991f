"""torch's private APIs: listed once (engine.torch_private.TABLE, the same list as
docs/internals.md), and a rename of any of them is one warning naming the feature that is off,
or, for one nothing counts without, an ImportError naming the torch version."""

import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from dispatch_flops.engine import torch_private as tp

DOC = Path(__file__).resolve().parents[1] / "docs" / "internals.md"
OPTIONAL = [p for p in tp.TABLE if p.feature != tp.NEEDED]
NEEDED = [p for p in tp.TABLE if p.feature == tp.NEEDED]


def doc_rows() -> dict:
    """``{name: off-without-it cell}`` of the table in docs/internals.md's private-API
    section."""
    text = DOC.read_text()
    section = text[text.index("## torch's private APIs"):]
    rows = {}
    for line in section.splitlines()[1:]:
        if line.startswith("## "):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        found = re.fullmatch(r"`([^`]+)`", cells[0]) if line.startswith("|") else None
        if found:
            rows[found.group(1)] = cells[2]
    return rows


def test_the_doc_lists_exactly_the_table():
    """Every API in the module's table has its row in docs/internals.md and no row names
    one the module does not resolve; a needed one says so, an optional one names its
    feature."""
    rows = doc_rows()
    assert set(rows) == set(tp.BY_NAME)
    for private in tp.TABLE:
        cell = rows[private.name]
        if private.feature == tp.NEEDED:
            assert cell.startswith("nothing counts"), private.name
        else:
            assert private.feature in cell, private.name


@pytest.fixture
def resolved_again(monkeypatch):
    yield
    monkeypatch.undo()
    tp.forget()
    tp.resolve()


def hide(monkeypatch, *names):
    monkeypatch.setattr(tp, "HIDDEN", frozenset(names))
    tp.forget()


@pytest.mark.parametrize("private", OPTIONAL, ids=lambda p: p.name)
def test_an_optional_rename_warns_once_naming_the_feature(private, monkeypatch,
                                                          resolved_again):
    """A torch that lacks the API: its fallback stands in, and one RuntimeWarning names the
    feature that is off, the API and the torch version; a second API of the same feature
    adds no second warning."""
    same = [p.name for p in OPTIONAL if p.feature == private.feature]
    hide(monkeypatch, *same)
    applies = private.applies is None or private.applies()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        found = [tp.lookup(name) for name in same]
    assert found[same.index(private.name)] is private.fallback
    mine = [w for w in caught if issubclass(w.category, RuntimeWarning)]
    if not applies:  # not this build's (CUDA, distributed, torch < 2.9): nothing to say
        # (of it: another API of the same feature, hidden too, may apply and warn)
        assert not [w for w in mine if private.name in str(w.message)]
        return
    assert len(mine) == 1, [str(w.message) for w in mine]
    message = str(mine[0].message)
    assert message.startswith("dispatch_flops: " + private.feature)
    assert torch.__version__ in message and same[0] in message


@pytest.mark.parametrize("private", NEEDED, ids=lambda p: p.name)
def test_a_needed_rename_is_an_import_error_naming_the_version(private, monkeypatch,
                                                               resolved_again):
    hide(monkeypatch, private.name)
    with pytest.raises(ImportError, match=re.escape(torch.__version__)) as raised:
        tp.lookup(private.name)
    assert private.name in str(raised.value) and tp.TESTED in str(raised.value)


def test_every_api_resolves_on_this_torch():
    """The torch the suite runs on has every API this build should have: no warning (dynamo's
    are looked up, and would warn, in tests/test_compiled.py)."""
    tp.forget()
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        tp.resolve()


RENAMED = """
import warnings
warnings.simplefilter("always")
import torch
from torch import nn
from dispatch_flops import FlopCounter
from dispatch_flops.engine import torch_private as tp

model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))
x = torch.randn(3, 8)
with FlopCounter(model, saved_activations=True) as fc:
    model(x).sum().backward()
model.zero_grad(set_to_none=True)
with FlopCounter(model) as checkpointed:
    torch.utils.checkpoint.checkpoint(model, x, use_reentrant=False).sum().backward()
model.zero_grad(set_to_none=True)
compiled = torch.compile(model, backend="eager")
with FlopCounter(model) as in_graph:
    compiled(x).sum().backward()
print("flops", fc.total.flops, checkpointed.total.flops, in_graph.total.flops)
print("warned", sorted(tp.WARNED))
"""


@pytest.mark.slow  # a process that imports dynamo and compiles
def test_every_optional_api_renamed_at_once_still_counts():
    """A torch that renamed every optional API: import, a counted forward and backward (saved
    activations, checkpointing) and a compiled model's counted step raise nothing, count the
    same flops as eager, and each feature is warned about once."""
    env = dict(os.environ, DISPATCH_FLOPS_HIDE_PRIVATE=",".join(p.name for p in OPTIONAL))
    out = subprocess.run([sys.executable, "-c", RENAMED], capture_output=True, text=True,
                         timeout=300, env=env, cwd=Path(__file__).resolve().parents[1])
    assert out.returncode == 0, out.stderr[-3000:]
    flops = [int(v) for v in re.search(r"^flops (.*)$", out.stdout, re.M).group(1).split()]
    assert flops[0] > 0 and flops[1] > flops[0] and flops[2] == flops[0]
    for feature in (tp.COMPILED, tp.COMPILE_HOOKS, tp.SAVED_HOOKS, tp.SKIP, tp.NESTED):
        assert out.stderr.count("dispatch_flops: " + feature) == 1, (feature, out.stderr)
    assert "Traceback" not in out.stderr


def test_a_needed_api_renamed_fails_the_import_clearly():
    env = dict(os.environ, DISPATCH_FLOPS_HIDE_PRIVATE="torch._C._current_autograd_node")
    out = subprocess.run([sys.executable, "-c", "import dispatch_flops"], capture_output=True,
                         text=True, timeout=300, env=env,
                         cwd=Path(__file__).resolve().parents[1])
    assert out.returncode != 0
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: dispatch_flops cannot count on torch " +
                           torch.__version__)
    assert "torch._C._current_autograd_node" in last
