"""Matrix-multiply family: mm, addmm, bmm, baddbmm, addbmm, grouped, scaled, linear, matmul, einsum.

Bias/``self`` additions are flops (one per output element), never MACs. Complex operands count
real work: a complex multiply-accumulate is ``ELEMENT_COSTS["complex_mac"]`` (4) real ones, a
complex bias add two real adds.
"""

from __future__ import annotations

from math import prod

import torch

from ._registry import Cost, namespace, register_formula
from ._shapes import is_complex, numel
from .costs import ELEMENT_COSTS

aten = namespace("aten")  # ops this torch lacks read as names, never met


def matmul_macs(a_shape, b_shape) -> int:
    """MACs of ``torch.matmul`` semantics: 1-d promotion and batch broadcasting."""
    a, b = list(a_shape), list(b_shape)
    if len(a) == 1:
        a = [1] + a
    if len(b) == 1:
        b = b + [1]
    # a: [*batch_a, m, k], b: [*batch_b, k, n]
    m, k, n = a[-2], a[-1], b[-1]
    batch = torch.broadcast_shapes(tuple(a[:-2]), tuple(b[:-2]))
    return prod(batch) * m * k * n


def _with_bias(macs: int, added_elements: int, dtypes=None) -> Cost:
    if dtypes is not None and is_complex(dtypes):
        macs *= ELEMENT_COSTS["complex_mac"]
        added_elements *= ELEMENT_COSTS["complex_add"]
    return Cost(2 * macs + added_elements, macs)


def mm_macs(a, b, sparse_a=None, sparse_b=None) -> int:
    """MACs of ``a [m, k] @ b [k, n]``. A sparse operand contributes its stored values: each
    value of a sparse ``a`` meets one row of ``b`` (n MACs), each of a sparse ``b`` one column
    of ``a`` (m MACs). Both sparse: each value of ``a`` meets the values of one row of ``b``,
    ``nnz_b / k`` of them on average (the expected count; the exact one needs the pattern)."""
    m, k, n = a[0], a[1], b[1]
    if sparse_a is not None and sparse_b is not None:
        return sparse_a.nnz * sparse_b.nnz // k if k else 0
    if sparse_a is not None:
        return sparse_a.nnz * n
    if sparse_b is not None:
        return m * sparse_b.nnz
    return m * k * n


def _sparse(layouts, i):
    return layouts[i] if layouts is not None and i < len(layouts) else None


# dtypes that pack several values into one element: their contraction dimension is that
# many times the shape's (torch.float4_e2m1fn_x2: two fp4 values a byte)
_PACKED = {torch.float4_e2m1fn_x2: 2}


@register_formula([aten.mm, aten._int_mm, aten._scaled_mm, aten._sparse_mm, aten.smm,
                   aten.hspmm])
def mm(a, b, *args, out_shape, dtypes=None, layouts=None, **kwargs) -> Cost:
    # a: [m, k], b: [k, n]; _scaled_mm's optional bias adds one flop per output element
    bias = kwargs.get("bias", args[2] if len(args) > 2 else None)
    macs = mm_macs(a, b, _sparse(layouts, 0), _sparse(layouts, 1))
    if dtypes and _PACKED.get(dtypes[0]):  # fp4 (MX / NVFP4): two values a stored element,
        macs *= _PACKED[dtypes[0]]  # so k is twice the shape's
    return _with_bias(macs, numel(out_shape) if bias is not None else 0, dtypes)


@register_formula([aten.addmm, aten._sparse_addmm, aten.sspaddmm])
def addmm(bias, a, b, *args, out_shape, dtypes=None, layouts=None, **kwargs) -> Cost:
    # out = bias + a @ b: one add per output element (a sparse output: per stored value)
    macs = mm_macs(a, b, _sparse(layouts, 1), _sparse(layouts, 2))
    added = _sparse(layouts, 0).nnz if _sparse(layouts, 0) is not None else numel(out_shape)
    return _with_bias(macs, added, dtypes)


@register_formula(aten.bmm)
def bmm(a, b, *, out_shape, dtypes=None, **kwargs) -> Cost:
    # a: [batch, m, k], b: [batch, k, n]
    return _with_bias(a[0] * a[1] * a[2] * b[2], 0, dtypes)


@register_formula(aten.baddbmm)
def baddbmm(bias, a, b, *, out_shape, dtypes=None, **kwargs) -> Cost:
    return _with_bias(a[0] * a[1] * a[2] * b[2], numel(out_shape), dtypes)


@register_formula(aten.addbmm)
def addbmm(bias, a, b, *, out_shape, dtypes=None, **kwargs) -> Cost:
    # out = bias + sum_b a[b] @ b[b]: the batch sum is part of the MAC chain
    return _with_bias(a[0] * a[1] * a[2] * b[2], numel(out_shape), dtypes)


@register_formula([aten._grouped_mm, aten._scaled_grouped_mm])
def grouped_mm(a, b, *args, out_shape, **kwargs) -> Cost:
    # MoE experts. 2d x 3d: a [rows, k], b [groups, k, n] -> [rows, n]: each row meets one
    # expert. 3d x 3d, 3d x 2d: out_numel * k. 2d x 2d: a [m, k_total] split along k into
    # groups, out [groups, m, n]: m * n * k_total.
    if len(a) == 2 and len(b) == 2:
        macs = a[0] * a[1] * b[1]
    else:
        macs = numel(out_shape) * a[-1]
    bias = kwargs.get("bias")
    return _with_bias(macs, numel(out_shape) if bias is not None else 0)


# transformers' stand-in for _grouped_mm where torch has none (torch < 2.9 on CPU): input
# [rows, k], weight [experts, k, n], offs the experts' row ends; one mm per expert's rows.
# Named, not imported: the op exists once transformers' MoE integration is imported.
@register_formula("transformers::grouped_mm_fallback", lazy=True)
def transformers_grouped_mm(x, weight, offs, *, out_shape, **kwargs) -> Cost:
    return _with_bias(numel(out_shape) * x[-1], 0)


@register_formula("transformers::grouped_mm_fallback_backward", lazy=True)
def transformers_grouped_mm_backward(x, weight, offs, grad_out, *, out_shape, **kwargs) -> Cost:
    # grad_input = grad_out @ weight[e].T and grad_weight[e] = x.T @ grad_out over each
    # expert's rows: each rows x k x n
    return _with_bias(2 * grad_out[0] * x[-1] * grad_out[-1], 0)


@register_formula([aten.mv, aten.dot, aten.vdot])
def mv(a, b, *args, out_shape, dtypes=None, layouts=None, **kwargs) -> Cost:
    # mv: a [m, k], b [k]; dot: a [k], b [k]; a sparse matrix: one MAC per stored value
    sparse_a = _sparse(layouts, 0)
    return _with_bias(sparse_a.nnz if sparse_a is not None else numel(a), 0, dtypes)


@register_formula(aten.addmv)
def addmv(bias, a, b, *, out_shape, dtypes=None, layouts=None, **kwargs) -> Cost:
    sparse_a = _sparse(layouts, 1)
    return _with_bias(sparse_a.nnz if sparse_a is not None else numel(a), numel(out_shape),
                      dtypes)


@register_formula(aten.addr)
def addr(bias, u, v, *, out_shape, dtypes=None, **kwargs) -> Cost:
    # out = bias + outer(u, v): one multiply-accumulate per output element
    return _with_bias(numel(out_shape), 0, dtypes)


@register_formula(aten.linear)
def linear(x, weight, bias=None, *, out_shape, dtypes=None, **kwargs) -> Cost:
    # x: [..., in], weight: [out, in]; reaches the mode under inference_mode
    macs = numel(out_shape) * weight[-1]
    return _with_bias(macs, numel(out_shape) if bias is not None else 0, dtypes)


@register_formula(aten.matmul)
def matmul(a, b, *, out_shape, dtypes=None, **kwargs) -> Cost:
    return _with_bias(matmul_macs(a, b), 0, dtypes)


def _einsum_macs(equation: str, shapes) -> int:
    """Left-to-right pairwise contraction, as torch.einsum does without opt_einsum paths."""
    lhs, _, out = equation.replace(" ", "").partition("->")
    terms = lhs.split(",")
    if not _:
        # implicit output: indices seen once, in alphabetical order
        letters = "".join(terms)
        out = "".join(sorted(c for c in set(letters) if letters.count(c) == 1))
    if "." in lhs:
        raise ValueError("einsum with '...' is not priced yet; use explicit indices")
    size = {}
    for term, shape in zip(terms, shapes):
        for c, s in zip(term, shape):
            size[c] = s
    macs = 0
    current = terms[0]
    for i, nxt in enumerate(terms[1:], start=1):
        later = set(out).union(*terms[i + 1 :])
        # an index only in one operand and needed nowhere else is summed first (no MACs)
        keep_a = {c for c in current if c in nxt or c in later}
        keep_b = {c for c in nxt if c in current or c in later}
        macs += prod(size[c] for c in keep_a | keep_b)
        current = "".join(c for c in sorted(keep_a | keep_b) if c in later)
    return macs


@register_formula(aten.einsum)
def einsum(equation, operands, *args, out_shape, dtypes=None, **kwargs) -> Cost:
    return _with_bias(_einsum_macs(equation, operands), 0, dtypes)


@register_formula(aten.linear_backward)
def linear_backward(x, grad_out, weight, output_mask, *, out_shape, dtypes=None,
                    **kwargs) -> Cost:
    # x: [..., in], grad_out: [..., out], weight: [out, in] (mkldnn's, and a jagged tensor's
    # Linear backward): grad_input = grad_out @ weight, grad_weight = grad_out^T @ x (one
    # product each, when asked), grad_bias = grad_out summed over rows (one add an element)
    rows_macs = numel(grad_out) * weight[-1]
    macs = rows_macs * (int(output_mask[0]) + int(output_mask[1]))
    return _with_bias(macs, numel(grad_out) if output_mask[2] else 0, dtypes)
