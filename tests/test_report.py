"""The text table fits its width, names modules and types, lists top ops; the phase of work
outside the model; one root name; short reprs."""

import re

import pytest
import torch
from torch import nn

from dispatch_flops import GLOBAL, OTHER, ROOT, FlopCounter
from dispatch_flops.views.table import COLUMN_KEYS, NEVER_CALLED
from helpers import step, tiny_gpt, tiny_ids


def train_step(timing=False, clip=False):
    model = tiny_gpt()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with FlopCounter(model, timing=timing, saved_activations=True) as fc:
        step(model, tiny_ids())
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
    return fc


@pytest.mark.parametrize("timing", [False, True])
@pytest.mark.parametrize("width", [60, 80, 100, 140])
def test_table_fits_its_width_and_keeps_the_essentials(timing, width):
    """Every line fits; the module, FLOPs and % FLOPs columns are always there; a wider
    table never has fewer columns than a narrower one."""
    fc = train_step(timing=timing)
    text = fc.table(depth=3, width=width)
    assert max(map(len, text.splitlines())) <= width
    header = text.splitlines()[0].split()
    assert header[0] == "Module" and "FLOPs" in header
    assert "% FLOPs" in text.splitlines()[0] or "%FLOPs" in header
    if timing:
        assert "Time" in header or "Latency" in header
    narrower = fc.table(depth=3, width=max(40, width - 30)).splitlines()[0].split()
    assert len(narrower) <= len(header)


def test_wide_table_has_every_column_that_applies():
    fc = train_step(timing=True)
    header = fc.table(width=1000).splitlines()[0]
    for name in ("Type", "Calls", "Params", "MACs", "Fwd FLOPs", "Bwd FLOPs", "Opt FLOPs",
                 "Read", "Written", "Saved", "Latency", "% Time", "FLOPS"):
        assert name in header, name


def test_not_a_terminal_means_100_columns(capsys, monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    fc = train_step()
    assert fc.table(depth=3) == fc.table(depth=3, width=100)  # pytest captures stdout


def test_columns_is_honoured_when_piped(capsys, monkeypatch):
    """``COLUMNS=80 python train.py | less``: stdout is not a terminal, COLUMNS still says
    how wide to be."""
    fc = train_step()
    monkeypatch.setenv("COLUMNS", "80")
    assert fc.table(depth=3) == fc.table(depth=3, width=80)
    assert max(map(len, fc.table(depth=3).splitlines())) <= 80
    monkeypatch.setenv("COLUMNS", "not a number")  # ignored, as the terminal size ignores it
    assert fc.table(depth=3) == fc.table(depth=3, width=100)


@pytest.mark.parametrize("width", [60, 80, 100, 120, 160])
def test_type_goes_first_and_notes_follow_the_columns(width):
    """Narrowing drops Type before any figure (Type shown means every column is); at 80
    columns a training step keeps Calls, Params and MACs; each note under the table is there
    only with what it explains (the Other note with the Other column, "Calls -" with Calls),
    and fits the width."""
    fc = train_step()
    every = re.split(r"\s{2,}", fc.table(depth=2, width=1000).splitlines()[0].strip())
    text = fc.table(depth=2, width=width)
    lines = text.splitlines()
    header = lines[0]
    assert max(map(len, lines)) <= width
    if "Type" in header:
        assert len(re.split(r"\s{2,}", header.strip())) == len(every)
    if width == 80:
        assert "Type" not in header and all(c in header for c in ("Calls", "Params", "MACs"))
    footer = "\n".join(lines[lines.index(next(s for s in lines if s.startswith("Coverage"))):])
    assert ("Other:" in footer) == ("Other" in header.split())
    assert ("Calls -:" in footer) == ("Calls" in header.split())


@pytest.mark.filterwarnings('ignore:.*attention="causal".*:FutureWarning')
def test_footer_leaves_out_what_does_not_apply():
    """A forward pass alone, its causal kernel taken to skip the masked pairs: no model vs
    hardware flops line (they are equal), no masked-pairs line, no Other note, no zero
    estimated / unsupported shares in the coverage line."""
    model, ids = tiny_gpt(), tiny_ids()
    with FlopCounter(model, attention="causal") as fc:
        model(ids)
    text = fc.table(width=1000)
    assert "hardware flops" not in text and "Other:" not in text and "Masked" not in text
    coverage = next(s for s in text.splitlines() if s.startswith("Coverage"))
    assert "estimated" not in coverage and "unsupported" not in coverage
    assert "Unsupported ops: none" in text


def test_per_rank_columns_stay_at_100_columns_for_a_ddp_model():
    """A gathered DDP run (its root's type name is 23 characters) keeps its per-rank min and
    max columns at 100 columns: Type goes before them."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from dispatch_flops.workflows.distributed import gathered

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        model = DistributedDataParallel(tiny_gpt())
        runs = []
        for _ in range(2):
            with FlopCounter(model, timing=True) as fc:
                step(model, tiny_ids())
            runs.append(fc.to_profile())
    finally:
        dist.destroy_process_group()
    text = gathered(runs).table(ranks=True, width=100)
    header = text.splitlines()[0].split()
    assert max(map(len, text.splitlines())) <= 100
    assert text.splitlines()[2].startswith("DistributedDataParallel")
    assert {"Fmin", "Fmax", "Tmin", "Tmax"} <= set(header) and "Type" not in header


def test_columns_pick_and_order_and_name_the_choices():
    fc = train_step()
    text = fc.table(depth=1, columns=["flops", "type", "calls"])
    assert text.splitlines()[0].split() == ["Module", "FLOPs", "Type", "Calls"]
    with pytest.raises(ValueError, match="columns are .*'flops'"):
        fc.table(columns=["flops", "joules"])
    with pytest.raises(ValueError, match="does not apply"):
        fc.table(columns=["latency"])  # untimed
    with pytest.raises(ValueError, match="list of column names"):
        fc.table(columns="flops")
    assert set(COLUMN_KEYS) >= {"module", "type", "calls", "flops", "other"}


def test_rows_carry_type_and_mark_never_called_containers():
    fc = train_step()
    types = fc.module_types()
    rows = fc.table(depth=2, columns=["type", "calls"]).splitlines()[2:]
    body = {}
    for line in rows:
        if line.startswith("Coverage"):
            break
        label, kind, calls = line.rsplit(None, 2)
        body[label.strip()] = (kind, calls)
    assert body["GPT"] == ("GPT", "1")
    assert body["blocks"] == ("ModuleList", NEVER_CALLED)  # a container, never called
    assert body["· 0"] == (types["blocks.0"], "1")
    assert body["lm_head"] == ("Linear", "1")
    assert "a container never called itself" in fc.table()


def test_top_ops_per_module_inline():
    """ops=k lists each module's k operators with the most flops, in order, under it."""
    fc = train_step()
    k = 2
    text = fc.table(depth=1, ops=k, columns=["flops"], width=1000)
    lines = text.splitlines()[2:]
    modules = fc.by_module()
    for name in ("lm_head", "blocks"):
        at = next(i for i, line in enumerate(lines) if line.split()[0] == name)
        expected = sorted(((op, s.flops) for op, s in modules[name].by_operator.items()
                           if s.flops), key=lambda t: (-t[1], t[0]))[:k]
        listed = [line.split("↳")[1].split()[0]
                  for line in lines[at + 1: at + 1 + len(expected)]]
        assert listed == [op for op, _ in expected]
    with pytest.raises(ValueError, match="ops must be"):
        fc.table(ops=-1)


def test_deep_names_are_shortened_to_fit():
    """A deep tree with long names: each row names its part of the path, and names too long
    for the width are cut in the middle, never past the width."""
    class Wrap(nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.a_rather_long_module_name = inner

        def forward(self, x):
            return self.a_rather_long_module_name(x)

    model = nn.Linear(4, 4)
    for _ in range(6):
        model = Wrap(model)
    with FlopCounter(model) as fc:
        model(torch.randn(2, 4))
    text = fc.table(depth=20, width=45)
    assert max(map(len, text.splitlines())) <= 45
    rows = [line.split("  ")[0] for line in text.splitlines()[2:] if "·" in line]
    # depth 2 to 6: each names only its own part, cut in the middle when too long
    assert len(rows) == 5
    assert all(r.count("a_rather") <= 1 for r in rows) and any("…" in r for r in rows)


def test_one_root_name():
    """The class name with a model, GLOBAL without; ROOT ("") is the key."""
    fc = train_step()
    assert fc.table().splitlines()[2].split()[0] == "GPT" == fc.root_label
    assert ROOT in fc.by_module()
    with FlopCounter() as bare:
        torch.randn(4, 4) @ torch.randn(4, 4)
    assert bare.root_label == GLOBAL == "global"
    assert bare.table().splitlines()[2].split()[0] == GLOBAL


def test_short_reprs():
    fc = train_step()
    for value, start in ((fc.total, "Stats("), (fc.by_module()["lm_head"], "ModuleStats("),
                         (fc.coverage(), "Coverage(")):
        text = repr(value)
        assert text.startswith(start) and len(text) < 120 and "\n" not in text, text
    assert "'lm_head'" in repr(fc.by_module()["lm_head"])
    assert f"{fc.total.calls} calls" in repr(fc.total)


def test_work_outside_the_model_is_phase_other():
    """Gradient clipping after backward is hardware flops, not model flops: phase other,
    charged to the root; model flops equal those of the same step without it."""
    plain, clipped = train_step(), train_step(clip=True)
    assert clipped.model_flops() == plain.model_flops()
    extra = clipped.by_phase()[OTHER].flops - plain.by_phase()[OTHER].flops
    assert extra > 0
    assert clipped.hardware_flops() - plain.hardware_flops() == extra
    ops = {r.operator for r in clipped.records() if r.phase == OTHER}
    assert "aten.sum" in ops  # the loss, made after the model returned
    assert {"aten.linalg_vector_norm", "aten._foreach_norm"} & ops  # the clipping
    assert all(r.module == ROOT for r in clipped.records() if r.phase == OTHER)
    # without a model there is no outside: everything not backward or optimizer is forward
    with FlopCounter() as bare:
        torch.randn(3, 3, requires_grad=True).sum().backward()
    assert bare.by_phase()[OTHER].calls == 0 and bare.by_phase()["forward"].calls > 0
