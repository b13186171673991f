"""Fuzz: random ops on random shapes, dtypes and layouts never raise through the counter, and
every op it saw is priced or listed (exact, no arithmetic, estimated or unsupported)."""

import warnings

import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from dispatch_flops import FlopCounter
from dispatch_flops.results.stats import CATEGORIES

OPS = {
    "exp": lambda a, b: a.exp(), "add": lambda a, b: a + b, "mul_": lambda a, b: a.mul_(2),
    "matmul": lambda a, b: a @ b.transpose(-1, -2), "sum": lambda a, b: a.sum(-1),
    "softmax": lambda a, b: a.softmax(-1), "where": lambda a, b: torch.where(a > 0, a, b),
    "index": lambda a, b: a[..., :1], "cat": lambda a, b: torch.cat([a, b]),
    "sort": lambda a, b: a.sort(-1), "cumsum": lambda a, b: a.cumsum(-1),
    "relu": lambda a, b: F.relu(a), "norm": lambda a, b: a.norm(),
    "clone": lambda a, b: a.clone(), "nonzero": lambda a, b: a.nonzero(),
    "mean": lambda a, b: a.mean(), "to_dense": lambda a, b: a.to_dense(),
    "coalesce": lambda a, b: a.coalesce(), "abs": lambda a, b: a.abs(),
    "einsum": lambda a, b: torch.einsum("...i,...i->...", a, b),
    "linear": lambda a, b: F.linear(a, b), "copy_": lambda a, b: a.copy_(b),
}
DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.int64, torch.bool,
          torch.complex64]
LAYOUTS = ["contiguous", "transposed", "expanded", "sparse_coo", "sparse_csr", "nested"]


def make(shape, dtype, layout):
    base = torch.randn(*shape).mul(3) if dtype.is_floating_point or dtype.is_complex \
        else torch.randint(-3, 4, shape)
    t = base.to(dtype)
    if layout == "transposed" and t.dim() >= 2:
        return t.transpose(-1, -2).contiguous().transpose(-1, -2)
    if layout == "expanded":
        return t[..., :1].expand(*shape)
    if layout == "sparse_coo":
        return t.to_sparse()
    if layout == "sparse_csr" and t.dim() == 2:
        return t.to_sparse_csr()
    if layout == "nested" and t.dim() >= 2:
        return torch.nested.nested_tensor(list(t.unbind(0)), layout=torch.jagged)
    return t


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.sampled_from(sorted(OPS)), st.lists(st.integers(1, 4), min_size=1, max_size=3),
       st.sampled_from(DTYPES), st.sampled_from(LAYOUTS), st.booleans())
def test_random_ops_never_raise_through_the_counter(name, shape, dtype, layout, grad_mode):
    op = OPS[name]
    context = torch.enable_grad if grad_mode else torch.inference_mode
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:  # what torch itself refuses is not ours to count
            a, b = make(shape, dtype, layout), make(shape, dtype, "contiguous")
            with context():
                op(a.clone() if not a.is_sparse and not a.is_nested else a, b)
        except Exception:
            assume(False)
        a = make(shape, dtype, layout)
        with context(), FlopCounter() as fc:
            op(a.clone() if not a.is_sparse and not a.is_nested else a, b)
        fc.table(), fc.to_dict()
    coverage = fc.coverage()
    assert set(coverage.calls) == set(CATEGORIES)
    assert sum(coverage.calls.values()) == fc.total.calls > 0
    assert all(r.category in CATEGORIES for r in fc.records())
    assert fc.total.flops >= 0 and fc.total.bytes_read >= 0
