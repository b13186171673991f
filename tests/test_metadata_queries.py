"""Metadata queries (``prim.device``, ``prim.layout``, ``aten.sym_size``, ...) do no
arithmetic: a model counted under FakeTensorMode, where SDPA asks ``prim.device`` of its
inputs, has nothing unsupported (it had 72 % of its calls unsupported)."""

import torch
import torch.nn.functional as F
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from dispatch_flops import FlopCounter
from dispatch_flops.formulas import REGISTRY, Category


class Attention(nn.Module):
    def __init__(self, d=32, heads=4):
        super().__init__()
        self.heads, self.qkv, self.out = heads, nn.Linear(d, 3 * d), nn.Linear(d, d)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(b, s, d))


def _count(fake: bool):
    torch.manual_seed(0)
    with FakeTensorMode() if fake else torch.no_grad():
        model, x = Attention(), torch.randn(2, 16, 32)
        with FlopCounter() as fc:
            y = model(x).sum()
            if fake:
                y.backward()
    return fc


def test_an_sdpa_model_under_fake_tensors_has_nothing_unsupported():
    fc = _count(fake=True)
    assert fc.unsupported_ops() == {}
    assert fc.coverage().calls["unsupported"] == 0
    assert fc.by_operator()["prim.device"].calls > 0  # it was asked, and is no arithmetic
    # the forward's flops are what real tensors count
    forward = sum(r.stats.flops for r in fc.records() if r.phase == "forward")
    assert forward == _count(fake=False).total.flops > 0


def test_metadata_queries_are_declared_no_arithmetic():
    for op in (torch.ops.prim.device.default, torch.ops.prim.layout.default,
               torch.ops.prim.dtype.default, torch.ops.prim.is_cuda.default,
               torch.ops.aten.sym_size.default, torch.ops.aten.sym_stride.default,
               torch.ops.aten.is_same_size.default):
        assert REGISTRY.lookup(op).category is Category.NO_ARITHMETIC, op
