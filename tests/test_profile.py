"""Profile: a finished run as data. Live counter, its Profile and the Profile read back from
JSON answer every view alike; merging runs adds them."""

import re

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from dispatch_flops import PHASES, ROOT, DeviceSpec, FlopCounter, Profile
from helpers import step, tiny_gpt, tiny_ids


def train_step_run(**options):
    """Forward, backward and an AdamW step of the tiny GPT."""
    model = tiny_gpt()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with FlopCounter(model, **options) as fc:
        step(model, tiny_ids())
        optimizer.step()
    return fc


def checkpointed_run():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

        def forward(self, x):
            return self.b(checkpoint(self.a, x, use_reentrant=False))

    model = Net()
    with FlopCounter(model, saved_activations=True) as fc:
        model(torch.randn(4, 8, requires_grad=True)).sum().backward()
    return fc


def no_model_run():
    with FlopCounter(timing=True) as fc:
        torch.randn(4, 8) @ torch.randn(8, 3)
    return fc


RUNS = {
    "train_step": train_step_run,
    "train_step_timed": lambda: train_step_run(timing=True),
    "saved_activations": lambda: train_step_run(saved_activations=True),
    "checkpointed": checkpointed_run,
    "no_model": no_model_run,
}


CPU = DeviceSpec.cpu(1e11, 2e10)


def views(run) -> dict:
    """Every view a Profile offers, as comparable data."""
    out = {
        "total": run.total, "by_phase": run.by_phase(), "records": run.records(),
        "module_names": run.module_names(), "unsupported": run.unsupported_ops(),
        "estimated": run.estimated_ops(), "coverage": run.coverage(),
        "model_flops": run.model_flops(), "hardware_flops": run.hardware_flops(),
        "table": run.table(depth=3), "dict": run.to_dict(), "wall_s": run.wall_s,
        "flop_counts": run.get_flop_counts(), "torch_table": run.get_table(),
        "by_dtype": run.flops_by_dtype(),
        "roofline_operators": run.roofline_by_operator(CPU),
        "roofline_modules": run.roofline_by_module(CPU),
        # a figure on timed runs; on untimed ones the reason there is none
        "mfu": run.mfu_text(CPU), "hfu": run.hfu_text(CPU),
    }
    for phase in (None,) + PHASES:
        out[f"modules {phase}"] = run.by_module(phase=phase)
        out[f"operators {phase}"] = run.by_operator(phase=phase)
    if run.timing:
        out["top_ops"] = run.top_ops_by_time(5)
        out["top_modules"] = run.top_modules_by_time(5)
    return out


@pytest.mark.parametrize("name", sorted(RUNS))
def test_live_profile_and_loaded_views_are_equal(name, tmp_path):
    """Integers exactly and times to the float: the counter, its Profile, and the Profile
    read back from its JSON."""
    fc = RUNS[name]()
    profile = fc.to_profile()
    assert isinstance(profile, Profile) and fc.to_profile() is profile
    fc.to_json(tmp_path / "run.json")
    loaded = Profile.from_json(tmp_path / "run.json")
    assert FlopCounter.from_json(tmp_path / "run.json").to_dict() == loaded.to_dict()
    live = views(fc)
    assert views(profile) == live
    assert views(loaded) == live
    if fc.timing:
        assert live["total"].latency_s > 0 and live["wall_s"] > 0
        assert live["mfu"].startswith("MFU ") and live["hfu"].startswith("HFU ")


def test_views_are_copies():
    """A Profile never changes: editing what a view returned changes no later read."""
    profile = train_step_run().to_profile()
    modules = profile.by_module()
    modules.clear()
    phases = profile.by_phase()
    phases["forward"] = None
    assert profile.by_module() and profile.by_phase()["forward"] is not None
    records = profile.records()
    records.clear()
    assert profile.records()


def steps(model, batches, optimizer=None):
    """One counter per step, as a logger would; a step per batch size."""
    out = []
    for batch in batches:
        with FlopCounter(model) as fc:
            model.zero_grad(set_to_none=True)
            step(model, tiny_ids(batch=batch))
            if optimizer is not None:
                optimizer.step()
        out.append(fc)
    return out


def test_merging_k_identical_steps_multiplies_every_count():
    model = tiny_gpt()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    one = steps(model, [2], optimizer)[0]
    k = 4
    runs = steps(model, [2] * k, optimizer)
    merged = Profile.merge(runs)
    assert merged.steps == k and len(merged.parts) == k
    for phase in (None,) + PHASES:
        expected = one.by_module(phase=phase)
        got = merged.by_module(phase=phase)
        assert set(got) == set(expected)
        for name, m in expected.items():
            assert got[name].calls == k * m.calls
            for side in ("inclusive", "exclusive"):
                a, b = getattr(got[name], side), getattr(m, side)
                assert (a.calls, a.flops, a.macs, a.bytes_read, a.bytes_written) == (
                    k * b.calls, k * b.flops, k * b.macs, k * b.bytes_read, k * b.bytes_written)
        for op, stats in one.by_operator(phase=phase).items():
            assert merged.by_operator(phase=phase)[op].flops == k * stats.flops
    for phase, stats in one.by_phase().items():
        assert merged.by_phase()[phase].calls == k * stats.calls
    mean = merged.per_step()
    assert mean.steps == 1
    # the table says its figures are sums over steps; the mean step's does not
    assert f"Merged from {k} steps" in merged.table(width=100)
    assert "Merged from" not in mean.table(width=100)
    assert mean.to_dict()["by_module"] == one.to_dict()["by_module"]
    assert mean.total == one.total and mean.records() == one.records()


def test_merge_is_associative():
    """Different steps (batch sizes, a forward-only one): how they are grouped changes
    nothing, and the parts are kept in order."""
    model = tiny_gpt()
    a, b, c = (r.to_profile() for r in steps(model, [1, 2, 3]))
    with FlopCounter(model) as forward_only:
        model(tiny_ids())
    d = forward_only.to_profile()
    left = Profile.merge([Profile.merge([a, b]), Profile.merge([c, d])])
    right = Profile.merge([a, Profile.merge([b, Profile.merge([c, d])])])
    flat = Profile.merge([a, b, c, d])
    assert left.to_dict() == right.to_dict() == flat.to_dict()
    assert left.parts == right.parts == (a, b, c, d)
    assert flat.total.flops == sum(p.total.flops for p in (a, b, c, d))
    assert flat.by_module()["blocks.0"].calls == 4


def test_merge_refuses_different_models_and_options():
    gpt = steps(tiny_gpt(), [2])[0]
    linear = nn.Linear(4, 4)
    with FlopCounter(linear) as other:
        linear(torch.randn(2, 4))
    with pytest.raises(ValueError, match="different models"):
        Profile.merge([gpt, other])
    wider = nn.Linear(4, 8)
    with FlopCounter(wider) as wide:
        wider(torch.randn(2, 4))
    with pytest.raises(ValueError, match="parameter"):
        Profile.merge([other, wide])
    with FlopCounter(linear, timing=True) as timed:
        linear(torch.randn(2, 4))
    with pytest.raises(ValueError, match="timing"):
        Profile.merge([other, timed])
    with pytest.raises(ValueError, match="at least one"):
        Profile.merge([])
    with pytest.raises(TypeError, match="Profile or a FlopCounter"):
        Profile.merge([other, "run.json"])


def test_timed_merge_sums_latencies_and_wall():
    linear = nn.Linear(64, 64)
    runs = []
    for _ in range(3):
        with FlopCounter(linear, timing=True) as fc:
            linear(torch.randn(32, 64))
        runs.append(fc.to_profile())
    merged = Profile.merge(runs)
    assert merged.wall_s == pytest.approx(sum(r.wall_s for r in runs))
    assert merged.total.latency_s == pytest.approx(sum(r.total.latency_s for r in runs))
    assert merged.per_step().wall_s == pytest.approx(merged.wall_s / 3)


def test_a_profile_read_while_counting_is_a_snapshot():
    model = tiny_gpt()
    with FlopCounter(model) as fc:
        model(tiny_ids())
        during = fc.to_profile()
        step(model, tiny_ids())
    assert during.by_phase()["backward"].calls == 0
    assert fc.to_profile().by_phase()["backward"].calls > 0
    assert during.total.flops < fc.total.flops


def test_profile_cannot_count():
    profile = steps(tiny_gpt(), [1])[0].to_profile()
    with pytest.raises(RuntimeError, match="cannot count"):
        with profile:
            pass


def test_table_golden(golden):
    """The module table of a training step, times masked (they differ run to run)."""
    untimed = train_step_run()
    golden("table_train_step.txt", untimed.table(depth=3, width=1000) + "\n")
    timed = train_step_run(timing=True)
    lines = timed.table(depth=1, width=1000).splitlines()
    rows = [line for line in lines if "  " in line and not line.startswith("-")]
    # the timed columns (Latency, % Time, FLOPS) differ run to run: left out
    masked = "\n".join(" | ".join(re.split(r"\s{2,}", row.strip())[:-3]) for row in rows)
    assert lines[0].split()[-4:] == ["Latency", "%", "Time", "FLOPS"]
    assert lines[-2].startswith("Top ops by time: aten.")
    golden("table_train_step_timed.txt", masked + "\n")


# ---- the package's shape --------------------------------------------------------------------


def test_root_label_and_root_key():
    fc = steps(tiny_gpt(), [1])[0]
    assert ROOT in fc.by_module() and fc.to_profile().root_label == "GPT"
    assert repr(fc.to_profile()).startswith("Profile(GPT,")


def test_rows_given_as_plain_tuples_are_named():
    """A Profile built from rows keyed by plain tuples (a tool's own), even mixed with
    RowKeys, answers every view as the original."""
    fc = steps(tiny_gpt(), [1])[0]
    p = fc.to_profile()
    mixed = [(tuple(key), counts) if i % 2 else (key, counts)
             for i, (key, counts) in enumerate(p.rows)]
    again = Profile(mixed, p.module_facts, p.run)
    assert again.by_module() == p.by_module() and again.records() == p.records()
    assert p.replace(rows=p.rows).rows is p.rows  # RowKeys already: the same tuple kept


def test_a_counter_watching_saved_activations_lets_its_model_go():
    """No reference cycle between the counter's parts keeps the model alive once the user
    drops it (freed without the cyclic collector)."""
    import gc
    import weakref

    model = tiny_gpt()
    alive = weakref.ref(model)
    with FlopCounter(model, saved_activations=True) as fc:
        step(model, tiny_ids())
    fc.to_profile()
    gc.collect()
    gc.disable()
    try:
        del model, fc
        assert alive() is None
    finally:
        gc.enable()
