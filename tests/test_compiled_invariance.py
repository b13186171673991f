"""Compiled = eager, flops too (issue 41, point 4): a compiled graph is priced as eager would
count the same call on the same device, whatever inductor decomposes, and whichever of its
outputs a backward starts from.

Oracle: the same model counted eagerly (a deep copy, the same inputs). Real inductor compiles
on CPU."""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from dispatch_flops import FlopCounter
from dispatch_flops.engine.graphs.dynamo import has_ignore_compile_internals
from helpers import additive

pytestmark = [pytest.mark.slow,  # compiles: seconds a test
              pytest.mark.skipif(not has_ignore_compile_internals(),
                                 reason="torch without ignore_compile_internals: the counted "
                                        "step runs eagerly"),
              pytest.mark.usefixtures("fresh_dynamo")]


def figures(fc) -> dict:
    t = fc.total
    return {"model_flops": t.model_flops, "model_macs": t.model_macs, "flops": t.flops,
            "macs": t.macs, "bytes_read": t.bytes_read, "bytes_written": t.bytes_written}


class Decomposed(nn.Module):
    """The ops inductor decomposes or fuses: layer norm, tanh GELU, softmax, dropout."""

    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(16)
        self.fc = nn.Linear(16, 32)
        self.drop = nn.Dropout(0.25)
        self.out = nn.Linear(32, 10)

    def forward(self, x):
        h = F.gelu(self.fc(self.ln(x)), approximate="tanh")
        return self.out(self.drop(F.softmax(h, dim=-1)))


class WithLoss(Decomposed):
    """Returns its loss with the logits and hidden states it was computed from, as
    transformers models given ``labels`` do."""

    def forward(self, x, y):
        h = F.gelu(self.fc(self.ln(x)), approximate="tanh")
        logits = self.out(self.drop(h))
        return F.cross_entropy(logits, y), logits, h


def run(model, *inputs, loss=lambda out: out.sum()):
    with FlopCounter(model) as fc:
        loss(model(*inputs)).backward()
    return fc


@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
def test_decomposed_ops_count_as_eager(train):
    """Layer norm, tanh GELU, softmax and dropout (train) compiled by inductor, forward and
    backward: model and hardware flops, MACs and bytes equal eager's, module by module."""
    torch.manual_seed(0)
    model = Decomposed().train(train)
    x = torch.randn(4, 16)
    eager = run(copy.deepcopy(model), x)
    compiled = run(torch.compile(model), x, )
    assert figures(compiled) == figures(eager)
    for name, stats in eager.by_module().items():
        assert compiled.by_module()[name].exclusive.flops == stats.exclusive.flops, name


def test_a_graph_returning_its_loss_prices_the_loss_backward_only():
    """A graph that returns its loss with the logits and hidden states behind it: the backward
    starts from the loss alone (the others get no gradient of their own, as in eager), so no
    gradient-accumulating ``add`` is priced for them. Before, one ``add`` per element of the
    logits and of the hidden states: flops above eager's with MACs equal."""
    torch.manual_seed(0)
    model = WithLoss().train()
    x, y = torch.randn(4, 16), torch.tensor([1, 2, 3, 4])
    eager = run(copy.deepcopy(model), x, y, loss=lambda out: out[0])
    compiled = run(torch.compile(model), x, y, loss=lambda out: out[0])
    assert figures(compiled) == figures(eager)
    assert "aten.add" not in compiled.by_operator() or \
        compiled.by_operator()["aten.add"].calls == eager.by_operator()["aten.add"].calls


def test_a_dense_incoming_gradient_is_the_named_bytes_difference():
    """A loss computed outside the graph hands its backward a dense gradient; the graph's
    backward is priced with the gradient a reduced loss hands it (one value, expanded: read
    once). Flops and MACs equal; eager reads ``numel - 1`` elements more in each op that reads
    the gradient: here the two matmuls of the last (bias-free) linear layer."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(approximate="tanh"),
                          nn.Linear(32, 10, bias=False))
    x, y = torch.randn(4, 16), torch.tensor([1, 2, 3, 4])
    loss = lambda logits: F.cross_entropy(logits, y)  # noqa: E731
    eager, compiled = figures(run(copy.deepcopy(model), x, loss=loss)), \
        figures(run(torch.compile(model), x, loss=loss))
    assert {k: v for k, v in compiled.items() if k != "bytes_read"} == \
        {k: v for k, v in eager.items() if k != "bytes_read"}
    logits = 4 * 10
    assert eager["bytes_read"] - compiled["bytes_read"] == 2 * (logits - 1) * 4


class Padded(nn.Module):
    """Attention over a padding mask passed in as a (batch, keys) 0/1 tensor, made into the
    SDPA mask inside the graph, as transformers does: boolean, or additive (the dtype's
    lowest value where padded), or additive under attention dropout (SDPA's math
    decomposition: the softmax of scores plus the mask)."""

    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind
        self.proj = nn.Linear(8, 8)

    def forward(self, x, mask):
        b, s, _ = x.shape
        q = self.proj(x).view(b, s, 2, 4).transpose(1, 2)
        keep = mask.to(torch.bool)[:, None, None, :].expand(b, 1, s, s)
        if self.kind == "bool":
            attn_mask = keep
        else:
            attn_mask = additive(keep, torch.finfo(x.dtype).min)
        p = 0.5 if self.kind == "dropout" else 0.0
        return F.scaled_dot_product_attention(q, q, q, attn_mask=attn_mask, dropout_p=p)


@pytest.mark.parametrize("kind", ["bool", "additive", "dropout"])
def test_a_padding_mask_passed_in_is_read_at_each_run(kind):
    """The mask is a graph input: priced on fake tensors, its masked pairs are counted at
    each run from the run's real mask, forward and backward: another mask of the same shape,
    and the same mask changed in place, count as eager counts them."""
    torch.manual_seed(0)
    model = Padded(kind)
    compiled = torch.compile(model)
    x = torch.randn(2, 6, 8)
    mask = torch.ones(2, 6, dtype=torch.long)
    mask[1, 4:] = 0

    def step(call, mask):
        with FlopCounter(model) as fc:
            call(x, mask).sum().backward()
        model.zero_grad(set_to_none=True)
        return figures(fc)

    for _ in range(2):  # the second: a mask with more padding, then the same one in place
        eager = step(model, mask)
        assert eager["model_macs"] < eager["macs"]  # masked pairs found
        assert step(compiled, mask) == eager
        mask = mask.clone()
        mask[0, 3:] = 0
    mask[1, 1:] = 0  # in place: its version moved, its pairs counted again
    assert step(compiled, mask) == step(model, mask)
