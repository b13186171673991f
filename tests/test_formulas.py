"""Every formula against an independent oracle."""

import itertools

import pytest
import torch
import torch.nn.functional as F
from hypothesis import assume, given
from hypothesis import strategies as st

from dispatch_flops.formulas import ELEMENT_COSTS
from dispatch_flops.formulas.attention import attention_pairs
from helpers import macs_of, ours, torch_flops
from strategies import attention_shapes, conv_configs, matmul_dims

aten = torch.ops.aten


def naive_matmul_macs(m, k, n):
    """Count the multiply-adds of the textbook triple loop."""
    return sum(1 for _ in itertools.product(range(m), range(k), range(n)))


# ---- matmul family -------------------------------------------------------------------------


@given(matmul_dims())
def test_mm_family_matches_naive_loop_and_torch(dims):
    """mm/bmm MACs equal the triple loop; flops equal torch's counter (2 per MAC)."""
    b, m, k, n = dims
    x, y = torch.randn(m, k), torch.randn(k, n)
    fc = ours(torch.mm, x, y)
    assert fc.total.macs == naive_matmul_macs(m, k, n)
    assert fc.total.flops == 2 * fc.total.macs == torch_flops(torch.mm, x, y)
    xb, yb = torch.randn(b, m, k), torch.randn(b, k, n)
    fc = ours(torch.bmm, xb, yb)
    assert fc.total.macs == b * naive_matmul_macs(m, k, n)
    assert fc.total.flops == torch_flops(torch.bmm, xb, yb)


@given(matmul_dims())
def test_bias_adds_are_flops_not_macs(dims):
    """addmm/baddbmm/addbmm: same MACs as the product, one extra flop per output element."""
    b, m, k, n = dims
    cases = [
        (torch.addmm, (torch.randn(n), torch.randn(m, k), torch.randn(k, n)), m * n, m * k * n),
        (torch.baddbmm, (torch.randn(b, m, n), torch.randn(b, m, k), torch.randn(b, k, n)),
         b * m * n, b * m * k * n),
        (torch.addbmm, (torch.randn(m, n), torch.randn(b, m, k), torch.randn(b, k, n)),
         m * n, b * m * k * n),
    ]
    for fn, args, outputs, macs in cases:
        fc = ours(fn, *args)
        assert fc.total.macs == macs
        assert fc.total.flops == 2 * macs + outputs
    # torch's counter omits the bias add (documented difference)
    args = cases[0][1]
    assert ours(torch.addmm, *args).total.flops == torch_flops(torch.addmm, *args) + m * n


@given(matmul_dims(), st.integers(1, 4))
def test_grouped_mm_equals_per_expert_loop(dims, groups):
    """_grouped_mm (MoE) MACs equal the sum over experts of each expert's mm."""
    _, m, k, n = dims
    k, n = 8 * k, 8 * n  # the CPU kernel wants 16-byte-aligned bf16 strides
    sizes = [m + i for i in range(groups)]  # rows routed to each expert
    offs = torch.tensor(list(itertools.accumulate(sizes)), dtype=torch.int32)
    a = torch.randn(sum(sizes), k, dtype=torch.bfloat16)
    w = torch.randn(groups, n, k, dtype=torch.bfloat16).transpose(-2, -1)
    try:
        fc = ours(lambda: aten._grouped_mm(a, w, offs))
    except RuntimeError as e:  # no CPU kernel in this torch: price the call on meta tensors
        pytest.skip(f"_grouped_mm unavailable on CPU: {e}")
    expected = sum(macs_of(ours(torch.mm, a[:r], w[g])) for g, r in enumerate(sizes))
    assert fc.total.macs == expected == sum(sizes) * k * n


@given(matmul_dims())
def test_composites_under_inference_mode_match_no_grad(dims):
    """linear/matmul/einsum reach the mode undecomposed under inference_mode; same MACs."""
    b, m, k, n = dims
    assume(min(m, k, n) > 1)  # size-1 products decompose into pointwise mul/sum, not matmuls
    x, w, bias, y = torch.randn(b, m, k), torch.randn(n, k), torch.randn(n), torch.randn(b, k, n)
    calls = [
        lambda: F.linear(x, w, bias),
        lambda: torch.matmul(x, y),
        lambda: x @ y[0],
        lambda: torch.einsum("bmk,bkn->bmn", x, y),
        lambda: torch.einsum("bmk,nk->bmn", x, w),
    ]
    for call in calls:
        with torch.no_grad():
            decomposed = ours(call)
        with torch.inference_mode():
            composite = ours(call)
        assert composite.total.macs == decomposed.total.macs > 0
        assert composite.unsupported_ops() == {}


# ---- convolution ---------------------------------------------------------------------------


def _conv(cfg, transposed=False):
    d, g = cfg["d"], cfg["groups"]
    x = torch.randn(cfg["batch"], cfg["c_in"], *cfg["spatial"])
    if transposed:
        w = torch.randn(cfg["c_in"], cfg["c_out"] // g, *cfg["kernel"])
        fn = [F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d][d - 1]
        bias = torch.randn(cfg["c_out"]) if cfg["bias"] else None
        return lambda: fn(x, w, bias, cfg["stride"], 0, 0, g, cfg["dilation"]), x, w
    w = torch.randn(cfg["c_out"], cfg["c_in"] // g, *cfg["kernel"])
    fn = [F.conv1d, F.conv2d, F.conv3d][d - 1]
    bias = torch.randn(cfg["c_out"]) if cfg["bias"] else None
    return lambda: fn(x, w, bias, cfg["stride"], cfg["padding"], cfg["dilation"], g), x, w


@given(conv_configs(dims=2))
def test_conv2d_equals_im2col_matmul(cfg):
    """conv2d MACs equal those of its im2col (F.unfold) + matmul decomposition, per group."""
    call, x, w = _conv(cfg)
    fc = ours(call)
    g = cfg["groups"]
    cols = F.unfold(x, cfg["kernel"], cfg["dilation"], cfg["padding"], cfg["stride"])
    # cols: [n, c_in * kh * kw, positions]; each group multiplies its slice by its filters
    per_group = cols.shape[1] // g
    decomposition = sum(
        macs_of(ours(torch.matmul, w[i * (w.shape[0] // g):(i + 1) * (w.shape[0] // g)]
                     .reshape(w.shape[0] // g, -1), cols[:, i * per_group:(i + 1) * per_group]))
        for i in range(g)
    )
    assert fc.total.macs == decomposition
    out_numel = call().numel()
    assert fc.total.flops == 2 * decomposition + (out_numel if cfg["bias"] else 0)


def _split_into_groups(cfg, x, w, transposed):
    """The same convolution as `groups` ungrouped ones, one per group."""
    g = cfg["groups"]
    ci, wo = x.shape[1] // g, w.shape[0] // g
    parts = []
    for i in range(g):
        sub = dict(cfg, c_in=ci, c_out=cfg["c_out"] // g, groups=1)
        xs = x[:, i * ci:(i + 1) * ci].detach().clone().requires_grad_(True)
        ws = w[i * wo:(i + 1) * wo].detach().clone().requires_grad_(True)
        parts.append((sub, xs, ws))
    def run():
        for sub, xs, ws in parts:
            fn = _conv_fn(sub, transposed)
            fn(xs, ws).sum().backward()
    return run


def _conv_fn(cfg, transposed):
    d, g = cfg["d"], cfg["groups"]
    if transposed:
        f = [F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d][d - 1]
        return lambda x, w: f(x, w, None, cfg["stride"], 0, 0, g, cfg["dilation"])
    f = [F.conv1d, F.conv2d, F.conv3d][d - 1]
    return lambda x, w: f(x, w, None, cfg["stride"], cfg["padding"], cfg["dilation"], g)


@given(conv_configs(), st.booleans())
def test_conv_backward_matches_per_group_split_and_torch(cfg, transposed):
    """1d/2d/3d, transposed or not: forward and backward MACs equal the same convolution run
    as one ungrouped convolution per group; with groups=1, MACs x 2 equal torch's flops.
    (torch's counter ignores `groups` in the weight gradient, so it over-counts grouped convs.)"""
    call, x, w = _conv(cfg, transposed)
    cfg = dict(cfg, bias=False)
    x.requires_grad_(True)
    w.requires_grad_(True)
    fn = _conv_fn(cfg, transposed)
    step = lambda: fn(x, w).sum().backward()  # noqa: E731
    fc = ours(step)
    split = ours(_split_into_groups(cfg, x, w, transposed))
    for phase in ("forward", "backward"):
        assert fc.by_phase()[phase].macs == split.by_phase()[phase].macs
    assert fc.total.macs > 0
    if cfg["groups"] == 1:
        assert 2 * fc.total.macs == torch_flops(step)


# ---- attention -----------------------------------------------------------------------------


def _qkv(shape, grad=False):
    b, hq, hkv, sq, sk, d, dv = shape
    return (torch.randn(b, hq, sq, d, requires_grad=grad),
            torch.randn(b, hkv, sk, d, requires_grad=grad),
            torch.randn(b, hkv, sk, dv, requires_grad=grad))


def _math_attention(q, k, v, **kw):
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    return aten._scaled_dot_product_attention_math(q, k, v, **kw)[0]


@given(attention_shapes(), st.booleans())
def test_sdpa_forward_matches_math_decomposition(shape, causal):
    """Fused SDPA forward MACs equal its math decomposition's bmm MACs (dense convention),
    with GQA shapes; the ops seen are the CPU flash variant."""
    q, k, v = _qkv(shape)
    fused = ours(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                        enable_gqa=True))
    math = ours(lambda: _math_attention(q, k, v, is_causal=causal))
    assert fused.total.macs == macs_of(math, "aten.bmm", "aten.mm")
    if shape[5] == shape[6]:  # d == d_v: torch picks the fused CPU kernel
        assert "aten._scaled_dot_product_flash_attention_for_cpu" in fused.by_operator()
        assert fused.unsupported_ops() == {}


@given(attention_shapes(), st.booleans())
def test_sdpa_backward_is_decomposition_plus_recompute(shape, causal):
    """Fused backward MACs = the math decomposition's backward bmm MACs + one recomputed
    q @ k^T (the fused kernels do not keep the score matrix)."""
    shape = shape[:6] + (shape[5],)  # d == d_v, so torch picks the fused CPU kernel
    b, hq, hkv, sq, sk, d, dv = shape
    q, k, v = _qkv(shape, grad=True)
    fused = ours(lambda: F.scaled_dot_product_attention(
        q, k, v, is_causal=causal, enable_gqa=True).sum().backward())
    math = ours(lambda: _math_attention(q, k, v, is_causal=causal).sum().backward())
    math_backward = sum(s.macs for op, s in math.by_operator(phase="backward").items())
    assert fused.by_phase()["backward"].macs == math_backward + b * hq * sq * sk * d


@given(st.integers(1, 12), st.integers(1, 12))
def test_causal_pairs_equal_tril_mask_count(s_q, s_k):
    """Unmasked pairs of the top-left causal mask equal the count of ones in torch's tril."""
    assert attention_pairs(1, 1, s_q, s_k, causal=True) == int(
        torch.ones(s_q, s_k, dtype=torch.bool).tril().sum())


@pytest.mark.filterwarnings('ignore:.*attention="causal".*:FutureWarning')
def test_causal_option_counts_only_unmasked_pairs():
    """attention="causal" prices the unmasked part; dense stays the default."""
    q, k, v = _qkv((1, 2, 2, 16, 16, 8, 8))
    call = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)  # noqa: E731
    dense, causal = ours(call), ours(call, attention="causal")
    assert dense.total.macs == 2 * 16 * 16 * 16
    assert causal.total.macs == 2 * (16 * 17 // 2) * 16
    not_causal = lambda: F.scaled_dot_product_attention(q, k, v)  # noqa: E731
    assert ours(not_causal, attention="causal").total.macs == dense.total.macs


def test_every_sdpa_variant_has_a_formula():
    """Each SDPA kernel torch can dispatch to on CPU or CUDA is priced, forward and backward."""
    from dispatch_flops import has_formula

    names = [n for n in dir(aten) if "attention" in n and (
        n.startswith("_scaled_dot_product") or n.startswith("_flash_attention")
        or n.startswith("_efficient_attention"))]
    assert len(names) >= 12
    missing = [n for n in names if not has_formula(getattr(aten, n))
               and "for_mps" not in n and "no_dropout_inplace" not in n]
    assert missing == []


def test_fused_attention_kernels_price_head_layouts_alike():
    """The [b, s, h, d] kernels (_flash/_efficient_attention_*) price like the [b, h, s, d]
    ones: call the formulas directly on the same logical shapes."""
    from dispatch_flops.formulas import attention as A

    q, k, v = (2, 4, 7, 8), (2, 2, 5, 8), (2, 2, 5, 6)
    bshd = lambda s: torch.Size((s[0], s[2], s[1], s[3]))  # noqa: E731
    ref = A.sdpa_flash(torch.Size(q), torch.Size(k), torch.Size(v), out_shape=None)
    flash = A.flash_attention_forward(bshd(q), bshd(k), bshd(v), None, None, 7, 5, 0.0, False,
                                      False, out_shape=None)
    eff = A.efficient_attention_forward(bshd(q), bshd(k), bshd(v), None, None, None, 7, 5, 0.0,
                                        0, out_shape=None)
    assert ref == flash == eff
    assert ref.macs == 2 * 4 * 7 * 5 * (8 + 6)
    # packed (varlen): 3 sequences in [total, h, d]; without the lengths' values (on a GPU),
    # every query meets at most max_k keys and every key at most max_q queries: the bound
    # min(max_k * total_q, max_q * total_k) pairs (tests/test_varlen_attention.py: exact)
    cum = torch.Size((4,))  # the shape of cum_seq: 3 sequences + 1
    packed = A.flash_attention_forward(torch.Size((10, 4, 8)), torch.Size((12, 2, 8)),
                                       torch.Size((12, 2, 6)), cum, cum, 7, 5, 0.0, False,
                                       False, out_shape=None)
    packed_eff = A.efficient_attention_forward(
        torch.Size((1, 10, 4, 8)), torch.Size((1, 12, 2, 8)), torch.Size((1, 12, 2, 6)), None,
        cum, cum, 7, 5, 0.0, 0, out_shape=None)
    assert packed == packed_eff
    assert packed.macs == 4 * min(5 * 10, 7 * 12) * (8 + 6) < 3 * 4 * 7 * 5 * (8 + 6)


# ---- layer norm and softmax ----------------------------------------------------------------


@given(st.lists(st.integers(1, 5), min_size=1, max_size=4), st.booleans())
def test_layer_norm_and_softmax_closed_forms(shape, affine):
    """Per-element costs of the conventions table, times the elements; no MACs."""
    x = torch.randn(*shape, requires_grad=True)
    ln = torch.nn.LayerNorm(shape[-1], elementwise_affine=affine)
    fc = ours(lambda: ln(x).sum().backward())
    n = x.numel()
    fwd = fc.by_operator(phase="forward")["aten.native_layer_norm"]
    per_element = ELEMENT_COSTS["layer_norm"] + 2 * affine * ELEMENT_COSTS["norm_affine"]
    assert fwd.flops == n * per_element
    bwd = fc.by_operator(phase="backward")["aten.native_layer_norm_backward"]
    assert bwd.flops == n * ELEMENT_COSTS["layer_norm_backward_input"] + (3 * n if affine else 0)
    assert fwd.macs == bwd.macs == 0
    for fn, key in [(torch.softmax, "softmax"), (torch.log_softmax, "log_softmax")]:
        fc = ours(lambda: fn(x, -1).sum().backward())
        by_op = fc.by_operator()
        assert by_op[f"aten._{key}"].flops == n * ELEMENT_COSTS[key]
        assert by_op[f"aten._{key}_backward_data"].flops == n * ELEMENT_COSTS["softmax_backward"]


CUDA_ATTENTION = {
    # name: (call on head-first [b, h, s, d] tensors, layout the kernel takes)
    "aten._scaled_dot_product_flash_attention":
        (lambda q, k, v: aten._scaled_dot_product_flash_attention(q, k, v)[0], "bhsd"),
    "aten._scaled_dot_product_efficient_attention":
        (lambda q, k, v: aten._scaled_dot_product_efficient_attention(q, k, v, None, True)[0],
         "bhsd"),
    "aten._scaled_dot_product_cudnn_attention":
        (lambda q, k, v: aten._scaled_dot_product_cudnn_attention(q, k, v, None, True)[0],
         "bhsd"),
    "aten._flash_attention_forward":
        (lambda q, k, v: aten._flash_attention_forward(
            q, k, v, None, None, q.shape[1], k.shape[1], 0.0, False, False)[0], "bshd"),
    "aten._efficient_attention_forward":
        (lambda q, k, v: aten._efficient_attention_forward(
            q, k, v, None, None, None, q.shape[1], k.shape[1], 0.0, 0, True)[0], "bshd"),
}


@pytest.mark.parametrize("name", sorted(CUDA_ATTENTION))
@given(st.integers(1, 2), st.integers(1, 4), st.integers(1, 8), st.sampled_from([8, 16]))
def test_cuda_attention_kernels_on_meta_match_torch(name, b, h, s, d):
    """The CUDA-only kernels, run on meta tensors, forward and backward: MACs x 2 equal torch's
    flops. torch reads the [b, s, h, d] kernels' shapes as [b, h, s, d], so for those the
    comparison holds where s == h, and elsewhere we equal the head-first kernel's count."""
    call, layout = CUDA_ATTENTION[name]
    shape = (b, h, s, d) if layout == "bhsd" else (b, s, h, d)
    q, k, v = (torch.randn(shape, device="meta", requires_grad=True) for _ in range(3))
    step = lambda: call(q, k, v).sum().backward()  # noqa: E731
    try:
        fc = ours(step)
    except (RuntimeError, NotImplementedError) as e:
        pytest.skip(f"{name} has no meta kernel in this torch: {e}")
    assert name in fc.by_operator()
    assert fc.unsupported_ops() == {}
    pairs = b * h * s * s
    assert fc.by_phase()["forward"].macs == pairs * 2 * d
    assert fc.by_phase()["backward"].macs == pairs * 5 * d
    if layout == "bhsd" or s == h:
        assert 2 * fc.total.macs == torch_flops(step)
