"""The first hour, round 3 (issue 58): op rows cut only as far as the width needs, a warning
when a counter saw nothing, every device argument a name, a spec or a torch device, a bare
tensor for measure's args said plainly, no noise at a Trainer's interpreter exit, a fast
--help, and the test command the README gives."""

import re
import warnings

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
    from dispatch_flops.models import GPT, GPTConfig

    model = GPT(GPTConfig(n_layer=1, d_model=32, n_head=2, vocab_size=64, max_seq_len=16))
    with FlopCounter(model) as fc:  # sdpa's backward: a long op name
        model(torch.randint(0, 64, (1, 8))).sum().backward()
    columns = ["type", "calls", "flops", "percent"]
    lines = fc.table(depth=3, ops=3, columns=columns, width=100).splitlines()
    assert max(map(len, lines)) == 100
    ops = [line.split("  ")[0].strip() for line in lines if "↳" in line]
    assert "↳ aten.addmm" in ops and "· ↳ aten.embedding_dense_backward" in ops
    wide = fc.table(depth=3, ops=3, columns=columns, width=200)
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


# -- 9: nothing printed at a Trainer's interpreter exit -------------------------------------
TRAINER = """
import torch, transformers
from dispatch_flops import DeviceSpec
from dispatch_flops.integrations.transformers import FlopsCallback
torch.manual_seed(0)
model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
    n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=32))
data = [{"input_ids": (ids := torch.randint(0, 64, (16,))), "labels": ids.clone()}
        for _ in range(8)]
args = transformers.TrainingArguments(
    output_dir="trainer", max_steps=4, per_device_train_batch_size=2, logging_steps=1,
    report_to=[], save_strategy="no", use_cpu=True, disable_tqdm=True)
callback = FlopsCallback(every=2, device=DeviceSpec.cpu(1e12, 5e10))
trainer = transformers.Trainer(model=model, args=args, train_dataset=data, callbacks=[callback])
trainer.train()
assert callback.profile is not None and callback.profile.total.flops > 0
print("trained")
"""


@pytest.mark.slow
def test_a_trainer_with_the_callback_exits_without_a_word(tmp_path):
    """A real tiny Trainer with a FlopsCallback, in its own interpreter: it exits 0 and prints
    no "Exception ignored" (a WeakMethod's callback at teardown, issue 58); and a finished
    counter's ledger holds no WeakMethod (whose callbacks fire at teardown)."""
    import subprocess
    import sys
    import weakref

    pytest.importorskip("transformers")
    done = subprocess.run([sys.executable, "-c", TRAINER], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "trained" in done.stdout
    assert "Exception ignored" not in done.stderr and "_alive" not in done.stderr, \
        done.stderr[-3000:]

    model = nn.Linear(4, 4)
    with FlopCounter(model) as fc:
        model(torch.randn(2, 4))
    holder = fc._tracker.ledger.holder
    assert not isinstance(holder, weakref.WeakMethod)
    assert holder() == fc._settle
    del fc
    assert holder() is None


# -- 7: every device argument takes a name, a spec or a torch device -------------------------
def test_every_device_argument_takes_a_name_a_spec_or_a_torch_device():
    """``fc.mfu("H100-SXM")`` is ``fc.mfu(DEVICES["H100-SXM"])``, a device's own name too,
    through mfu, hfu, their texts, the rooflines, conventions and the callbacks; a CPU
    device has no built-in peak (ValueError saying how to give one); a CPU run priced
    against a GPU's datasheet says the run was on the CPU."""
    from dispatch_flops import DEVICES, measure

    model = nn.Linear(16, 16)
    p = measure(model, (torch.randn(4, 16),), warmup=0, repeat=1)
    spec = DEVICES["H100-SXM"]
    for name in ("H100-SXM", "NVIDIA H100 80GB HBM3"):
        assert p.mfu(name) == p.mfu(spec) and p.hfu(name) == p.hfu(spec)
        assert p.mfu_text(name) == p.mfu_text(spec) and p.device(name) is spec
        assert p.roofline_by_operator(name) == p.roofline_by_operator(spec)
        assert p.roofline_by_module(name) == p.roofline_by_module(spec)
        assert str(p.conventions(64, device=name)) == str(p.conventions(64, device=spec))
    assert "the run was on the CPU, not a H100-SXM" in p.mfu_text("H100-SXM")
    assert "run was on" not in p.mfu_text(DEVICES["H100-SXM"].__class__.cpu(1e11, 1e10))
    with pytest.raises(ValueError, match="no built-in peaks for cpu.*DeviceSpec.cpu"):
        p.mfu(torch.device("cpu"))
    with pytest.raises(ValueError, match="unknown device 'H900'"):
        p.mfu("H900")
    assert p.mfu_text("H900").startswith("no MFU: unknown device 'H900'")
    with pytest.raises(TypeError, match="a DeviceSpec, a device name .* or a torch.device"):
        p.mfu(3.0)


def test_the_callbacks_take_a_device_name():
    pytest.importorskip("transformers")
    from dispatch_flops import DEVICES
    from dispatch_flops.integrations.transformers import FlopsCallback

    assert FlopsCallback(device="H100-SXM").meter.device is DEVICES["H100-SXM"]


@pytest.mark.slow
def test_the_cli_says_a_cpu_run_was_priced_against_a_gpu(tmp_path):
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "dispatch_flops", "--seq-len", "8", "--timing",
                           "--repeat", "1", "--peaks", "NVIDIA H100 80GB HBM3"],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "H100-SXM datasheet (the run was on the CPU, not a H100-SXM)" in done.stdout


# -- 3: a counter that saw nothing says so --------------------------------------------------
def test_a_counter_that_saw_nothing_says_so():
    """One CountingWarning, at the reader's line, when a counter is read never entered, with
    nothing run in its block, or with its model never run while another was; none for a
    block that ran its model, or an optimizer step alone."""
    from dispatch_flops import CountingWarning

    model, other = nn.Sequential(nn.Linear(4, 4)), nn.Sequential(nn.Linear(4, 4))
    with pytest.warns(CountingWarning, match="never entered") as caught:
        FlopCounter(model).table()
    assert caught[0].filename == __file__
    with FlopCounter(model) as fc:
        pass
    with pytest.warns(CountingWarning, match="counted nothing") as caught:
        assert fc.total.flops == 0
    assert caught[0].filename == __file__
    with FlopCounter(model) as fc:
        other(torch.randn(2, 4))
    with pytest.warns(CountingWarning, match=r"Sequential never ran inside the block"):
        fc.table()
    with warnings.catch_warnings():
        warnings.simplefilter("error", CountingWarning)
        fc.table(), fc.total  # said once
        with FlopCounter(model) as fc:
            model(torch.randn(2, 4)).sum().backward()
        assert fc.total.flops > 0
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        with FlopCounter(model) as fc:
            optimizer.step()
        assert fc.by_phase()["optimizer"].calls > 0


# -- 10: docs/generation.md defines compute_s as the code computes it ------------------------
def test_generation_docs_define_compute_s_as_the_code():
    """``compute_s`` is the time of the ops on the compute roof, ``memory_s`` of those on the
    memory roof, the two summing to ``attainable_s`` (not all the step's flops / peak, which
    a decode step's ``compute_s == 0.0`` contradicted): the page says so, the figures agree."""
    from pathlib import Path

    from dispatch_flops.workflows.generation import ops_roofline

    page = " ".join((Path(__file__).parents[1] / "docs" / "generation.md").read_text().split())
    assert "`compute_s` (all its flops / peak)" not in page
    assert "`compute_s` is the time of the ops on the compute roof" in page
    assert "the two sum to `attainable_s`" in page
    fc = _trained()
    peak, bandwidth = 1e12, 1e10
    roof = ops_roofline(fc.to_profile(), peak, bandwidth)
    on_compute = [r.stats for r in fc.records()
                  if r.stats.flops / peak >= r.stats.bytes / bandwidth]
    assert roof.compute_s == pytest.approx(sum(s.flops / peak for s in on_compute))
    assert roof.compute_s + roof.memory_s == pytest.approx(roof.attainable_s)
    assert roof.compute_s < fc.total.flops / peak


# -- 2: a test command that finishes --------------------------------------------------------
def test_the_readme_test_command_runs_in_parallel_and_ci_runs_it():
    """The Quickstart's second line runs the suite on every core (pytest-xdist's -n); the
    test extra installs pytest-xdist; .ci/run runs that very command (with its torch pin in
    the pip call); and the README states no timing it did not measure as measured."""
    from pathlib import Path

    root = Path(__file__).parents[1]
    readme = root.joinpath("README.md").read_text()
    quickstart = re.search(r"## Quickstart\n\n```bash\n(.*?)```", readme, re.S)[1].splitlines()
    install, _, command = quickstart[1].partition(" && ")
    assert install == 'pip install -e ".[test]"'
    assert re.fullmatch(r"python -m pytest -q -n (auto|\d+)", command)
    extra = re.search(r"^test = \[(.*?)\]", root.joinpath("pyproject.toml").read_text(),
                      re.S | re.M)[1]
    assert re.search(r'"pytest-xdist\b', extra)
    ci = root.joinpath(".ci", "run").read_text()
    assert f'pip install torch==2.13.0 -e ".[test]" && {command}\n' in ci
    assert "about 1,570 tests" not in readme and "took 4.5 minutes" not in readme


# -- 11: the project's own and the docs' warnings, at their cause -----------------------------
@pytest.mark.slow
def test_diffusion_docs_first_block_configures_its_scheduler(tmp_path, monkeypatch):
    """docs/diffusion.md's first block runs without diffusers' 20-line "has not set the
    configuration `clip_sample`" FutureWarning: its DDIM scheduler says clip_sample=False,
    as Stable Diffusion's own configuration does."""
    from pathlib import Path

    pytest.importorskip("diffusers")
    import matplotlib

    matplotlib.use("Agg")
    page = (Path(__file__).parents[1] / "docs" / "diffusion.md").read_text()
    block = re.search(r"```python\n(.*?)```", page, re.S)[1]
    monkeypatch.chdir(tmp_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        exec(compile(block, "docs/diffusion.md", "exec"), {"__name__": "__main__"})
    assert not [w for w in caught if "clip_sample" in str(w.message)]


@pytest.mark.parametrize("module, test", [
    ("test_formulas", "test_causal_option_counts_only_unmasked_pairs"),
    ("test_report", "test_footer_leaves_out_what_does_not_apply"),
    ("test_attention_masks", "test_causal_option_keeps_its_old_meaning")])
def test_the_deprecated_causal_option_is_tested_on_purpose(module, test):
    """The fast tier printed the project's own FutureWarning (attention="causal"): each test
    of the deprecated option says it uses it on purpose (as test_keywords does)."""
    import importlib

    marks = getattr(getattr(importlib.import_module(module), test), "pytestmark", [])
    assert any(m.name == "filterwarnings" and 'attention="causal"' in m.args[0]
               for m in marks)
