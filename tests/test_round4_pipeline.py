"""Issue 56, items 1 and 3 for ``profile_pipeline``: its options validated like
``FlopCounter``'s, and nothing of its own left on the pipeline or in torch's globals when a part
cannot be hooked or an interrupt lands at any of its install or remove points."""

from __future__ import annotations

import pytest
import torch
from test_hostile_users import Interrupts, _globals
from torch import nn

from dispatch_flops import profile_pipeline


class Denoiser(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(x)


class Scheduler:
    def step(self, output, timestep, sample):
        return sample - 0.1 * output


class Pipe:
    """A pipeline: a denoiser named ``unet``, a scheduler whose ``step`` ends a step."""

    def __init__(self, unet):
        self.unet = unet
        self.scheduler = Scheduler()

    def __call__(self, steps=3):
        x = torch.zeros(1, 4)
        for t in range(steps):
            x = self.scheduler.step(self.unet(x), t, x)
        return x


def _leftovers(pipe):
    return (_globals(), sorted(vars(pipe.scheduler)),
            [(len(m._forward_pre_hooks), len(m._forward_hooks)) for m in pipe.unet.modules()])


@pytest.mark.parametrize("timing", ["bogus", "Kernels", "cuda", "kernels", 2, None])
def test_timing_takes_true_or_false(timing):
    """``timing="bogus"``, ``"Kernels"``, ``"cuda"``, ``2`` are refused with a ValueError naming
    the choices (e85fa8b: each was taken as true and the run timed)."""
    with pytest.raises(ValueError, match="True or False"):
        profile_pipeline(Pipe(Denoiser()), timing=timing)


def test_a_scripted_denoiser_leaves_no_hook_behind():
    """A ``torch.jit.script`` denoiser refuses module hooks: the error reaches the user and no
    global hook, counter hook or ``scheduler.step`` wrapper stays (e85fa8b: two global hooks
    were attached outside the ``try`` and stayed)."""
    pipe = Pipe(Denoiser())
    before = _leftovers(pipe)
    pipe.unet = torch.jit.script(Denoiser())
    with pytest.raises(RuntimeError):  # torch.jit: "ScriptModules do not support hooks"
        profile_pipeline(pipe)
    after = _leftovers(pipe)
    assert after[:2] == before[:2]
    with torch.no_grad():
        pipe()  # still runs as the user's


class PipelineInterrupts(Interrupts):
    POINTS = Interrupts.POINTS + [(nn.Module, "register_forward_hook")]


@pytest.mark.parametrize("after", [False, True], ids=["before", "after"])
def test_an_interrupt_at_any_point_leaves_nothing(monkeypatch, after):
    """A KeyboardInterrupt at the k-th install or remove point of ``profile_pipeline``, for
    every k: no global hook, module hook or method wrapper stays, and the next profile counts
    as one never interrupted (e85fa8b: wrappers on ``scheduler.step`` or hooks stayed)."""
    pipe = Pipe(Denoiser())
    before = _leftovers(pipe)
    with torch.no_grad():
        reference = profile_pipeline(pipe).total
    k, fired = 0, 0
    while True:
        k += 1
        with monkeypatch.context() as patch:
            interrupts = PipelineInterrupts(patch, k, after)
            interrupts.armed = True
            try:
                with torch.no_grad():
                    profile_pipeline(pipe)
            except KeyboardInterrupt:
                assert interrupts.fired
            interrupts.armed = False
        assert _leftovers(pipe) == before, k
        if not interrupts.fired:
            break
        fired += 1
    with torch.no_grad():
        assert profile_pipeline(pipe).total == reference
    assert fired > 4
