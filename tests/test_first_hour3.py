"""The first hour, round 3 (issue 58): op rows cut only as far as the width needs, a warning
when a counter saw nothing, every device argument a name, a spec or a torch device, a bare
tensor for measure's args said plainly, no noise at a Trainer's interpreter exit, a fast
--help, and the test command the README gives."""

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
