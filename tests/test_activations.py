"""Activation bytes and input/output shapes recorded by per-module forward hooks."""

import torch
from torch import nn

from dispatch_flops import ROOT
from dispatch_flops.engine.model.activations import ActivationRecorder


class TwoOut(nn.Module):
    def forward(self, x, *, scale=None):
        return {"y": x * 2, "pair": (x, x.sum())}


def test_activation_bytes_sum_every_call_and_shapes_are_the_first_call():
    """Bytes of each distinct output tensor, summed over calls; kwargs count as inputs."""
    model = nn.Sequential(nn.Linear(4, 8), TwoOut())
    with ActivationRecorder(model) as recorder:
        model[0](torch.ones(2, 4))
        model[0](torch.ones(3, 4))
        model[1](torch.ones(5), scale=torch.ones(1))
    acts = recorder.results()
    assert acts["0"].calls == 2 and acts["0"].output_bytes == (2 + 3) * 8 * 4
    assert acts["0"].input_shapes == ((2, 4),) and acts["0"].output_shapes == ((2, 8),)
    assert acts["1"].input_shapes == ((5,), (1,))
    assert acts["1"].output_bytes == 5 * 4 + 5 * 4 + 4  # y, x (once), the sum
    assert ROOT not in acts  # the root was not called
    assert all(not m._forward_hooks for m in model.modules())
