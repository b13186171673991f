"""The CI guard on counting's instructions per aten op (``benchmarks/instructions.py
--check``): its verdict against the baseline file, without running callgrind (CI runs it)."""

import importlib.util
import json
import os

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
PATH = os.path.join(os.path.dirname(HERE), "benchmarks", "instructions.py")


@pytest.fixture
def guard(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("instructions_guard", PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "BASELINE", str(tmp_path / "baseline.json"))
    return module


def _run(guard, added: float, **env) -> dict:
    here = {"torch": "2.13.0", "python": "3.11.7", "machine": "x86_64", "steps": 10,
            "ops": 1123, "added_per_op": {guard.GUARDED: added}}
    here.update(env)
    return here


def test_within_tolerance_passes_and_past_it_fails(guard, capsys):
    with open(guard.BASELINE, "w") as f:
        json.dump({**_run(guard, 40_000), "why": "test"}, f)
    assert guard.check(_run(guard, 41_990)) == 0
    assert guard.check(_run(guard, 42_010)) == 1
    assert "--record" in capsys.readouterr().out


def test_cheaper_passes_and_says_to_record(guard, capsys):
    with open(guard.BASELINE, "w") as f:
        json.dump({**_run(guard, 40_000), "why": "test"}, f)
    assert guard.check(_run(guard, 30_000)) == 0
    assert "record the new figure" in capsys.readouterr().out


def test_another_torch_is_not_compared(guard, capsys):
    with open(guard.BASELINE, "w") as f:
        json.dump({**_run(guard, 40_000), "why": "test"}, f)
    assert guard.check(_run(guard, 1, torch="2.14.0")) == 1
    assert "not comparable" in capsys.readouterr().out


def test_the_committed_baseline_names_the_guarded_figure_and_why():
    with open(os.path.join(os.path.dirname(PATH), "baseline_instructions.json")) as f:
        base = json.load(f)
    spec = importlib.util.spec_from_file_location("instructions_guard2", PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert base["added_per_op"][module.GUARDED] > 0 and base["why"].strip()


@pytest.mark.parametrize("kind", ["forward", pytest.param("mask", marks=pytest.mark.slow),
                                  pytest.param("compiled", marks=pytest.mark.slow)])
def test_each_workload_runs_its_variants_outside_callgrind(guard, kind, tmp_path):
    """The breakdown's workloads (``--workload``) build and run every variant, natively (one
    step each: what callgrind would measure), and count their ops: the mask one counts
    masked attention, the compiled one its graph's ops."""
    import io

    import torch

    out = io.StringIO()
    names = guard.VARIANTS + guard.BREAKDOWN
    if kind == "compiled":
        names = tuple(n for n in names if n != "  (unwrapped)")
    threads = torch.get_num_threads()
    try:
        guard._inside(1, names, out, kind)
    finally:
        torch.set_num_threads(threads)
    run = json.loads(out.getvalue())
    assert run["names"] == list(names) and run["ops"] > 50
