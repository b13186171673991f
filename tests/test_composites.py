"""Under torch.inference_mode() composite ops reach the counter whole. The rule
(docs/conventions.md): a composite counts what its no_grad decomposition counts. Checked here
on hypothesis-drawn shapes for every composite family, and structurally: every composite with
a built-in formula is priced by counting its decomposition."""

import warnings

import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

from dispatch_flops import FlopCounter
from dispatch_flops.engine.counting.mode import _decomposable
from dispatch_flops.formulas import REGISTRY

dim = st.integers(1, 5)


def counts(fn, *args):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with FlopCounter() as fc:
            fn(*args)
    return fc


def same_both_ways(fn, *args):
    with torch.no_grad():
        plain = counts(fn, *args)
    with torch.inference_mode():
        whole = counts(fn, *args)
    assert whole.unsupported_ops() == {} and whole.estimated_ops() == plain.estimated_ops()
    assert (whole.total.flops, whole.total.macs) == (plain.total.flops, plain.total.macs)
    return whole


@st.composite
def einsum_case(draw):
    b, i, j, k = (draw(dim) for _ in range(4))
    broadcast = draw(st.booleans())
    cases = [
        ("...ij,...jk->...ik", (b, i, j), (b, j, k)),
        ("bij,bjk->bik", (1 if broadcast else b, i, j), (b, j, k)),  # size-1 batch broadcast
        ("i,j->ij", (i,), (j,)),  # an outer product: multiplies, no MACs
        ("ij,ij->", (i, j), (i, j)),
        ("bij,jk", (b, i, j), (j, k)),  # implicit output
    ]
    eq, a, c = draw(st.sampled_from(cases))
    return eq, torch.randn(*a), torch.randn(*c)


@given(einsum_case())
def test_einsum(case):
    eq, a, b = case
    same_both_ways(torch.einsum, eq, a, b)


@given(st.integers(3, 5), dim, dim, st.integers(1, 6), st.booleans())
def test_attention_any_rank(ndim, heads, seq, width, causal):
    shape = (2, heads, seq, width)[4 - ndim:] if ndim < 4 else (2, 2, heads, seq, width)
    q = torch.randn(*shape)
    same_both_ways(lambda x: F.scaled_dot_product_attention(x, x, x, is_causal=causal), q)


@given(dim, dim, dim, dim)
def test_tensordot_kron_vecdot_multi_dot_matrix_power(a, b, c, d):
    x, y = torch.randn(a, b, c), torch.randn(b, c, d)
    same_both_ways(torch.tensordot, x, y, 2)
    same_both_ways(torch.kron, torch.randn(a, b), torch.randn(c, d))
    same_both_ways(torch.linalg.vecdot, torch.randn(a, b), torch.randn(a, b))
    same_both_ways(torch.linalg.multi_dot, [torch.randn(a, b), torch.randn(b, c),
                                            torch.randn(c, d)])
    same_both_ways(torch.linalg.matrix_power, torch.randn(b, b), c + 1)


@given(dim, st.integers(2, 16))
def test_fft(batch, n):
    same_both_ways(torch.fft.rfft, torch.randn(batch, n))
    same_both_ways(torch.fft.fft2, torch.randn(batch, n, 3))


@given(dim, dim, st.integers(1, 30), st.integers(1, 30), dim, st.sampled_from([1.0, 2.0, 3.0]))
def test_cdist_broadcasts_batches(b1, b2, p_rows, r_rows, m, p):
    x1, x2 = torch.randn(b1, 1, p_rows, m), torch.randn(1, b2, r_rows, m)
    fc = same_both_ways(lambda a, c: torch.cdist(a, c, p=p), x1, x2)
    if p != 2:  # the direct form: per pair and coordinate 3 (4 for a general p) + a root
        per_coordinate, per_pair = (3, 0) if p == 1 else (4, 1)
        assert fc.total.flops == b1 * b2 * p_rows * r_rows * (m * per_coordinate + per_pair)


@given(dim, dim, dim)
def test_losses_norms_linear(n, c, d):
    logits, target = torch.randn(n, c + 1), torch.randint(0, c + 1, (n,))
    same_both_ways(lambda a, t: F.cross_entropy(a, t, label_smoothing=0.1), logits, target)
    same_both_ways(F.linear, torch.randn(n, d), torch.randn(c, d), torch.randn(c))
    same_both_ways(F.layer_norm, torch.randn(n, c, d), (d,))
    same_both_ways(F.group_norm, torch.randn(n, 2 * c, d + 1), 2)


def test_every_builtin_composite_is_priced_by_its_decomposition():
    """Structural: a CompositeImplicitAutograd op with a built-in formula (or none) is priced
    by counting its decomposition, so the rule holds for it by construction."""
    found = 0
    for packet in list(REGISTRY._packets):
        for name in packet.overloads():
            try:
                op = getattr(packet, name)
            except RuntimeError:  # an overload torch lists but does not build
                continue
            entry = REGISTRY.lookup(op)
            if entry.category.value == "no_arithmetic":
                continue
            try:
                composite = torch._C._dispatch_has_kernel_for_dispatch_key(
                    op.name(), "CompositeImplicitAutograd")
            except RuntimeError:  # a Python-only twin (index_put.hacked_twin)
                continue
            if composite and op.namespace == "aten":
                found += 1
                assert _decomposable(op, entry), op
    assert found > 20


def test_a_users_formula_for_a_composite_is_kept():
    from dispatch_flops import Cost
    from dispatch_flops.formulas import Registry

    reg = Registry()
    reg.formula(torch.ops.aten.linear)(lambda *a, out_shape, **k: Cost(7))
    with torch.inference_mode(), FlopCounter(registry=reg) as fc:
        F.linear(torch.randn(2, 3), torch.randn(4, 3))
    assert fc.total.flops == 7
