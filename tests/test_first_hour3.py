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
