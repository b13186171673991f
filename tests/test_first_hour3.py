"""The first hour, round 3 (issue 58): op rows cut only as far as the width needs, a warning
when a counter saw nothing, every device argument a name, a spec or a torch device, a bare
tensor for measure's args said plainly, no noise at a Trainer's interpreter exit, a fast
--help, and the test command the README gives."""

import pytest
import torch
from torch import nn

from dispatch_flops import FlopCounter
from helpers import tiny_gpt, tiny_ids


def _trained():
    model = tiny_gpt()
    with FlopCounter(model) as fc:
        model(tiny_ids()).sum().backward()
    return fc


# -- 4: op rows cut only by what is too wide ------------------------------------------------
def test_op_rows_are_cut_only_by_the_excess():
    """The table fills its width: op names lose only what does not fit, and a name that
    fits is whole (issue 58: `aten…kward` in a body 55 columns wide out of 100)."""
    fc = _trained()
    text = fc.table(depth=3, ops=3, columns=["type", "calls", "flops", "percent"], width=100)
    lines = text.splitlines()
    assert max(map(len, lines)) == 100
    ops = [line.split("  ")[0].strip() for line in lines if "↳" in line]
    assert "↳ aten.addmm" in ops and "· ↳ aten.mm" in ops
    wide = fc.table(depth=3, ops=3, columns=["type", "calls", "flops", "percent"], width=200)
    assert "…" not in wide and max(map(len, wide.splitlines())) < 200


# -- 8: measure(model, x) -------------------------------------------------------------------
def test_measure_takes_one_tensor_as_its_args_and_says_what_args_is():
    """One tensor is ``(x,)`` (as paper_table's inputs), not unpacked row by row into the
    forward; a dict or another non-tuple says that ``args`` is a tuple, ``kwargs`` a dict."""
    from dispatch_flops import measure

    model = nn.Linear(4, 3)
    x = torch.randn(2, 4)
    bare = measure(model, x, warmup=0, repeat=1)
    assert bare.total.flops == measure(model, (x,), warmup=0, repeat=1).total.flops > 0
    with pytest.raises(TypeError, match=r"args is a tuple .*\(keyword arguments go in kwargs="):
        measure(model, {"input": x}, warmup=0, repeat=1)
    with pytest.raises(TypeError, match="args is a tuple"):
        measure(model, 3, warmup=0, repeat=1)
    with pytest.raises(TypeError, match="kwargs is a dict"):
        measure(model, (x,), (x,), warmup=0, repeat=1)
