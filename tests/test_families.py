"""Every op family against an independent oracle: closed forms over broadcast shapes and all
float dtypes, naive loops on tiny shapes, and the same op spelt another way."""

import itertools
import math

import torch
import torch.nn.functional as F
from hypothesis import assume, given
from hypothesis import strategies as st

from dispatch_flops.formulas import ELEMENT_COSTS
from helpers import ours
from strategies import (
    broadcast_operands,
    float_dtypes,
    maybe_expanded,
    pooling_configs,
    reduction_cases,
)

aten = torch.ops.aten


def size_of(dtype):
    return torch.finfo(dtype).bits // 8


# ---- pointwise ------------------------------------------------------------------------------

UNARY = [  # (call, cost key)
    (torch.exp, "exp"), (torch.tanh, "tanh"), (torch.sigmoid, "sigmoid"), (torch.relu, "relu"),
    (torch.rsqrt, "rsqrt"), (F.gelu, "gelu"), (F.silu, "silu"), (torch.neg, "neg"),
    (lambda x: F.gelu(x, approximate="tanh"), "gelu_tanh"), (torch.abs, "abs"),
]
BINARY = [
    (torch.add, "add"), (torch.mul, "mul"), (torch.div, "div"), (torch.maximum, "maximum"),
    (torch.pow, "pow"), (torch.atan2, "atan2"), (torch.lt, "lt"), (torch.sub, "sub"),
]
TERNARY = [
    (lambda a, b, c: torch.addcmul(a, b, c), "addcmul"),
    (lambda a, b, c: torch.addcdiv(a, b, c), "addcdiv"),
    (lambda a, b, c: torch.where(a > 0, b, c), "where"),
    (lambda a, b, c: torch.lerp(a, b, c), "lerp"),
]


def _expect_pointwise(fc, name, key, result_shape, stored, dtype):
    s = fc.by_operator()[name]
    n = math.prod(result_shape)
    assert s.flops == n * ELEMENT_COSTS[key]
    assert s.macs == 0
    assert s.bytes_read == sum(stored) * size_of(dtype)
    assert s.bytes_written == n * (1 if key == "lt" else size_of(dtype))


@given(st.data(), float_dtypes, st.sampled_from(range(len(UNARY))))
def test_unary_closed_form(data, dtype, which):
    """numel(out) x cost per element; bytes: the input's real storage, the output at dtype."""
    call, key = UNARY[which]
    (shape,), result = data.draw(broadcast_operands(num_shapes=1))
    x, stored = data.draw(maybe_expanded(shape, dtype))
    fc = ours(call, x)
    name = "aten." + ("gelu" if key.startswith("gelu") else key)
    _expect_pointwise(fc, name, key, result, [stored], dtype)


@given(st.data(), float_dtypes, st.sampled_from(range(len(BINARY))))
def test_binary_broadcasting_closed_form(data, dtype, which):
    """Broadcast output elements x cost; each operand's bytes are its real (unexpanded)
    elements at the dtype size; zero-size dims give 0."""
    call, key = BINARY[which]
    (sa, sb), result = data.draw(broadcast_operands(num_shapes=2))
    a, stored_a = data.draw(maybe_expanded(sa, dtype))
    b, stored_b = data.draw(maybe_expanded(sb, dtype))
    fc = ours(call, a, b)
    _expect_pointwise(fc, "aten." + key, key, result, [stored_a, stored_b], dtype)


@given(st.data(), st.sampled_from(range(len(TERNARY))))
def test_ternary_broadcasting_closed_form(data, which):
    """addcmul/addcdiv/where/lerp over three broadcast operands."""
    call, key = TERNARY[which]
    shapes, result = data.draw(broadcast_operands(num_shapes=3))
    a, b, c = (torch.randn(s) for s in shapes)
    fc = ours(call, a, b, c)
    assert fc.by_operator()["aten." + key].flops == math.prod(result) * ELEMENT_COSTS[key]


@given(st.data(), st.sampled_from(["add", "mul", "sub", "div", "pow", "atan2"]))
def test_inplace_and_out_variants_price_the_same(data, name):
    """op, op_ and op(out=) cost the same flops; out= writes the same bytes and reads only the
    inputs."""
    (sa, sb), result = data.draw(broadcast_operands(num_shapes=2))
    a, b = torch.randn(result), torch.randn(sb)
    plain = ours(getattr(torch, name), a, b).total
    inplace = ours(lambda: getattr(a.clone(), name + "_")(b)).by_operator()["aten." + name + "_"]
    out = torch.empty(0)
    with_out = ours(lambda: getattr(torch, name)(a, b, out=out)).by_operator()["aten." + name]
    assert plain.flops == inplace.flops == with_out.flops == math.prod(result) * ELEMENT_COSTS[name]
    assert with_out.bytes_read == plain.bytes_read
    assert with_out.bytes_written == plain.bytes_written


@given(st.lists(st.integers(0, 5), min_size=1, max_size=4))
def test_scales_other_than_one_cost_a_multiply(sizes):
    """add(alpha=2), addcmul(value=0.5): one more flop per element than with the default 1."""
    x = torch.randn(sizes)
    n = x.numel()
    assert ours(torch.add, x, x).total.flops == n
    assert ours(lambda: torch.add(x, x, alpha=2)).total.flops == 2 * n
    assert ours(lambda: torch.addcmul(x, x, x, value=0.5)).total.flops == 3 * n
    assert ours(lambda: torch.clamp(x, min=0)).total.flops == n
    assert ours(lambda: torch.clamp(x, -1, 1)).total.flops == 2 * n


@given(st.lists(st.lists(st.integers(0, 4), min_size=1, max_size=2), min_size=1, max_size=4))
def test_foreach_prices_every_tensor_like_the_single_op(shapes):
    """_foreach_mul_/_foreach_addcdiv_/_foreach_sqrt over lists: the sum of the single ops."""
    xs = [torch.randn(s) for s in shapes]
    ys = [torch.rand(s) + 1 for s in shapes]
    single = ours(lambda: [(x.clone().mul_(y), x.addcdiv(x, y, value=2), y.sqrt())
                           for x, y in zip(xs, ys)])
    foreach = ours(lambda: (torch._foreach_mul_([x.clone() for x in xs], ys),
                            torch._foreach_addcdiv([x for x in xs], xs, ys, value=2),
                            torch._foreach_sqrt(ys)))
    ops = ("mul_", "addcdiv", "sqrt")
    assert [foreach.by_operator()["aten._foreach_" + o].flops for o in ops] == [
        single.by_operator()["aten." + o].flops for o in ops]


def test_complex_ops_count_real_flops():
    """A complex add is 2 real flops, a multiply 6, a complex MAC 4 real MACs."""
    a = torch.randn(3, 4, dtype=torch.complex64)
    b = torch.randn(4, 5, dtype=torch.complex64)
    assert ours(torch.add, a, a).total.flops == 2 * 12
    assert ours(torch.mul, a, a).total.flops == 6 * 12
    assert ours(torch.exp, a).total.flops == ELEMENT_COSTS["complex_exp"] * 12
    mm = ours(torch.mm, a, b).total
    assert mm.macs == 4 * 3 * 4 * 5 and mm.flops == 2 * mm.macs
    # the real-valued decomposition of the complex product counts the same MACs
    ar, ai, br, bi = a.real, a.imag, b.real, b.imag
    decomposed = ours(lambda: (ar @ br - ai @ bi, ar @ bi + ai @ br)).total
    assert decomposed.macs == mm.macs
    # the real counterpart is unchanged
    assert ours(torch.mul, a.real, a.real).total.flops == 12


@given(st.integers(1, 64), st.sampled_from([1, 2]))
def test_fft_follows_the_5_n_log2_n_convention(n, dims):
    """A complex FFT of n points is 5 n log2 n real flops; a real-input one half that."""
    shape = (n,) * dims
    x = torch.randn(shape)
    total = math.prod(shape)
    passes = dims * math.log2(n)
    assert ours(torch.fft.fftn, x.to(torch.complex64)).total.flops == round(5 * total * passes)
    assert ours(torch.fft.rfftn, x).total.flops == round(2.5 * total * passes)


# ---- reductions -------------------------------------------------------------------------------


@given(reduction_cases(), float_dtypes)
def test_reductions_closed_forms(case, dtype):
    """n per input element (+ the divide per output for mean, the variance's two divides and
    std's sqrt), for any dims, keepdim, zero-size dims; bytes follow the dtype."""
    shape, dims, keepdim = case
    x = torch.randn(shape).to(dtype)
    n = x.numel()
    m = x.sum(dims, keepdim=keepdim).numel()
    expected = {
        "sum": (lambda: x.sum(dims, keepdim=keepdim), n),
        "mean": (lambda: x.mean(dims, keepdim=keepdim), n + m),
        "amax": (lambda: x.amax(dims, keepdim=keepdim), n),
        "var": (lambda: x.var(dims, keepdim=keepdim), 4 * n + 2 * m),
        "std": (lambda: x.std(dims, keepdim=keepdim), 4 * n + 3 * m),
        "logsumexp": (lambda: x.logsumexp(dims, keepdim=keepdim), 4 * n + 2 * m),
        "linalg_vector_norm": (lambda: torch.linalg.vector_norm(x, 2, dims, keepdim), 2 * n + m),
    }
    for op, (call, flops) in expected.items():
        if op in ("amax", "logsumexp") and n == 0:
            continue  # no identity for max over an empty dim: torch raises
        fc = ours(call)
        s = fc.by_operator()["aten." + op]
        assert s.flops == flops, op
        assert s.bytes_read == n * size_of(dtype), op


@given(st.lists(st.integers(1, 5), min_size=1, max_size=3), st.data())
def test_cumulative_and_ordering(shape, data):
    """cumsum: one op per element; sort: ceil(log2 n) comparisons per element of a row of n;
    topk: ceil(log2(k + 1)); argmax: one comparison per element."""
    x = torch.randn(shape)
    dim = data.draw(st.integers(0, len(shape) - 1))
    n = x.shape[dim]
    k = data.draw(st.integers(1, n))
    assert ours(torch.cumsum, x, dim).total.flops == x.numel()
    assert ours(torch.sort, x, dim).total.flops == x.numel() * (n - 1).bit_length()
    assert ours(lambda: torch.topk(x, k, dim)).total.flops == x.numel() * k.bit_length()
    assert ours(torch.argmax, x).total.flops == x.numel()


# ---- pooling: a naive loop over windows -------------------------------------------------------


def naive_window_pairs(spatial, out_spatial, kernel, stride, padding, dilation):
    """Count (output position, in-bounds input position) pairs with explicit loops."""
    count = 0
    for o in itertools.product(*(range(s) for s in out_spatial)):
        for j in itertools.product(*(range(k) for k in kernel)):
            idx = [o[i] * stride[i] - padding[i] + j[i] * dilation[i] for i in range(len(o))]
            count += all(0 <= idx[i] < spatial[i] for i in range(len(idx)))
    return count


@given(pooling_configs())
def test_pooling_counts_in_bounds_window_elements(cfg):
    """max_pool: one comparison per in-bounds window element; avg_pool: one add per element
    + one divide per output; backward: max one add per grad element, avg the forward count."""
    d = cfg["d"]
    x = torch.randn(cfg["batch"], cfg["channels"], *cfg["spatial"], requires_grad=True)
    max_pool = [F.max_pool1d, F.max_pool2d, F.max_pool3d][d - 1]
    args = (cfg["kernel"], cfg["stride"], cfg["padding"], cfg["dilation"], cfg["ceil_mode"])
    fc = ours(lambda: max_pool(x, *args).sum().backward())
    out = max_pool(x, *args)
    lead = cfg["batch"] * cfg["channels"]
    pairs = lead * naive_window_pairs(cfg["spatial"], out.shape[2:], cfg["kernel"],
                                      cfg["stride"], cfg["padding"], cfg["dilation"])
    fwd = fc.by_phase()["forward"].flops - out.numel()  # minus the test's own sum
    assert fwd == pairs
    by_op = fc.by_operator(phase="backward")
    backward_name = next(op for op in by_op if "max_pool" in op)
    assert by_op[backward_name].flops == out.numel()
    avg_pool = [F.avg_pool1d, F.avg_pool2d, F.avg_pool3d][d - 1]
    avg_args = (cfg["kernel"], cfg["stride"], cfg["padding"], cfg["ceil_mode"])
    out = avg_pool(x, *avg_args)
    pairs = lead * naive_window_pairs(cfg["spatial"], out.shape[2:], cfg["kernel"],
                                      cfg["stride"], cfg["padding"], [1] * d)
    fc = ours(lambda: avg_pool(x, *avg_args).sum().backward())
    by_op = {op: s for op, s in fc.by_operator().items() if "avg_pool" in op}
    forward = next(s for op, s in by_op.items() if not op.endswith("backward"))
    backward = next(s for op, s in by_op.items() if op.endswith("backward"))
    assert forward.flops == backward.flops == pairs + out.numel()


@given(st.integers(1, 9), st.integers(1, 9), st.integers(1, 4), st.integers(1, 4))
def test_adaptive_pooling_equals_its_windows(h, w, oh, ow):
    """Adaptive avg/max: the sum of window sizes (start = floor(i*in/out), end = ceil)."""
    x = torch.randn(1, 2, h, w)
    windows = 1
    for size_in, size_out in ((h, oh), (w, ow)):
        windows *= sum(math.ceil((i + 1) * size_in / size_out) - math.floor(i * size_in / size_out)
                       for i in range(size_out))
    pairs = 2 * windows
    assert ours(F.adaptive_max_pool2d, x, (oh, ow)).total.flops == pairs
    assert ours(F.adaptive_avg_pool2d, x, (oh, ow)).total.flops == pairs + 2 * oh * ow


@given(st.integers(1, 5), st.integers(1, 5), st.sampled_from([1, 2, 3]))
def test_interpolation_taps(h, w, scale):
    """Linear modes: taps MACs per output element (bilinear 4, bicubic 16); nearest moves
    data only; backward spreads each gradient over the same taps."""
    x = torch.randn(1, 2, h, w, requires_grad=True)
    for mode, taps in (("bilinear", 4), ("bicubic", 16), ("nearest", 0)):
        fc = ours(lambda: F.interpolate(x, scale_factor=scale, mode=mode).sum().backward())
        outputs = 2 * h * w * scale * scale
        forward = {op: s for op, s in fc.by_operator(phase="forward").items()
                   if "upsample" in op}
        (f,) = forward.values()
        assert f.macs == outputs * taps and f.flops == 2 * f.macs
        backward = {op: s for op, s in fc.by_operator(phase="backward").items()
                    if "upsample" in op}
        (b,) = backward.values()
        assert b.macs == outputs * taps
        if mode == "nearest":
            assert b.flops == outputs  # one add per gradient element


# ---- indexing, embedding, losses, dropout -----------------------------------------------------


@given(st.integers(1, 6), st.integers(1, 5), st.integers(1, 8))
def test_embedding_and_gathers(vocab, dim, tokens):
    """The lookup moves data only; its backward adds each gradient row into the weight
    gradient; scatter_add/index_add add each source element; gather does no arithmetic."""
    weight = torch.randn(vocab, dim, requires_grad=True)
    ids = torch.randint(0, vocab, (tokens,))
    fc = ours(lambda: F.embedding(ids, weight).sum().backward())
    by_op = fc.by_operator()
    assert by_op["aten.embedding"].flops == 0
    assert by_op["aten.embedding_dense_backward"].flops == tokens * dim
    x = torch.zeros(vocab, dim)
    src = torch.randn(tokens, dim)
    assert ours(lambda: x.index_add(0, ids, src)).total.flops == tokens * dim
    index = ids[:, None].expand(tokens, dim)
    assert ours(lambda: x.scatter_add(0, index, src)).total.flops == tokens * dim
    within = index % tokens
    assert ours(lambda: src.gather(0, within)).total.flops == 0
    fc = ours(lambda: x.index_put_((ids,), src, accumulate=True))
    assert fc.total.flops == tokens * dim
    mask = torch.rand(vocab) > 0.5
    fc = ours(lambda: x.index_put((mask,), torch.tensor(1.0), accumulate=True))
    assert fc.total.flops == vocab * dim  # the mask's size: an upper bound (values unseen)


@given(st.integers(1, 5), st.integers(2, 6), st.sampled_from(["mean", "sum", "none"]))
def test_cross_entropy_is_log_softmax_plus_nll(batch, classes, reduction):
    """cross_entropy = log_softmax (5 per element) + nll (per sample: ignore test, negate,
    sum, total weight)."""
    x = torch.randn(batch, classes, requires_grad=True)
    target = torch.randint(0, classes, (batch,))
    fc = ours(lambda: F.cross_entropy(x, target, reduction=reduction).sum().backward())
    by_op = fc.by_operator()
    assert by_op["aten._log_softmax"].flops == batch * classes * ELEMENT_COSTS["log_softmax"]
    per = ELEMENT_COSTS["nll"] + (reduction != "none") + (reduction == "mean")
    assert by_op["aten.nll_loss_forward"].flops == batch * per + (reduction == "mean")
    assert fc.unsupported_ops() == {} and fc.estimated_ops() == {}


@given(st.lists(st.integers(1, 4), min_size=1, max_size=3))
def test_elementwise_losses_closed_forms(shape):
    """mse/l1/smooth-l1/bce: cost per element + the mean's adds and divide."""
    x, y = torch.rand(shape), torch.rand(shape)
    n = x.numel()
    assert ours(F.mse_loss, x, y).total.flops == n * ELEMENT_COSTS["mse"] + n + 1
    assert ours(F.smooth_l1_loss, x, y).total.flops == n * ELEMENT_COSTS["smooth_l1"] + n + 1
    assert ours(F.binary_cross_entropy, x, y).total.flops == (
        n * ELEMENT_COSTS["binary_cross_entropy"] + n + 1)
    # l1 is a composite: sub, abs and mean, as three pointwise/reduction ops
    assert ours(F.l1_loss, x, y).total.flops == 2 * n + n + 1


@given(st.lists(st.integers(1, 5), min_size=1, max_size=3), st.floats(0.1, 0.9))
def test_dropout_compare_mask_and_scale(shape, p):
    """Training dropout: draw, compare (1), mask (1), scale (1) per element; eval: nothing."""
    x = torch.randn(shape)
    assert ours(F.dropout, x, p, True).total.flops == x.numel() * ELEMENT_COSTS["dropout"]
    assert ours(F.dropout, x, p, False).total.flops == 0
    y = torch.randn(shape, requires_grad=True)
    fc = ours(lambda: F.dropout(y, p, True).sum().backward())
    assert fc.unsupported_ops() == {} and fc.estimated_ops() == {}


# ---- norms ------------------------------------------------------------------------------------


@given(st.integers(1, 3), st.sampled_from([2, 4]), st.integers(2, 4), st.booleans())
def test_batch_group_instance_norm_closed_forms(n, c, spatial, affine):
    """Training statistics: 5 per element + 1 per affine term; eval batch norm: 2 + affine;
    backward: 9 per element for the input, 2 for the weight, 1 for the bias."""
    x = torch.randn(n, c, spatial, spatial, requires_grad=True)
    elements = x.numel()
    bn = torch.nn.BatchNorm2d(c, affine=affine)
    fc = ours(lambda: bn(x).sum().backward())
    forward = fc.by_operator(phase="forward")["aten.native_batch_norm"]
    assert forward.flops == elements * (5 + 2 * affine)
    backward = fc.by_operator(phase="backward")["aten.native_batch_norm_backward"]
    assert backward.flops == elements * (9 + 3 * affine)
    bn.eval()
    with torch.no_grad():
        assert ours(bn, x).total.flops == elements * (2 + 2 * affine)
    gn = torch.nn.GroupNorm(2, c, affine=affine)
    fc = ours(lambda: gn(x).sum().backward())
    assert fc.by_operator()["aten.native_group_norm"].flops == elements * (5 + 2 * affine)
    assert fc.by_operator()["aten.native_group_norm_backward"].flops == elements * (
        9 + 3 * affine)


FAMILY_CALLS = {  # one op per family whose tensors are all floating point
    "softmax": lambda x: x.softmax(-1),
    "layer_norm": lambda x: F.layer_norm(x, x.shape[-1:]),
    "group_norm": lambda x: F.group_norm(x, 1),
    "avg_pool": lambda x: F.avg_pool2d(x, 2, 1, 1),
    "adaptive_pool": lambda x: F.adaptive_avg_pool2d(x, 2),
    "interpolate": lambda x: F.interpolate(x, scale_factor=2, mode="bilinear"),
    "reduction": lambda x: x.var(-1),
    "cumulative": lambda x: x.cumsum(-1),
    "loss": lambda x: F.smooth_l1_loss(x, x.flip(-1)),
    "activation": lambda x: F.gelu(x, approximate="tanh"),
    "padding": lambda x: F.pad(x, (1, 1, 1, 1), mode="reflect"),
}


@given(float_dtypes, st.sampled_from(sorted(FAMILY_CALLS)), st.integers(1, 3), st.integers(2, 4))
def test_every_family_prices_flops_independent_of_dtype_and_bytes_at_its_size(dtype, family,
                                                                                 batch, side):
    """The same call in another float dtype costs the same flops and MACs, and moves bytes in
    proportion to the dtype's size (float32 as the reference)."""
    x = torch.randn(batch, 2, side, side)
    call = FAMILY_CALLS[family]
    reference = ours(call, x).total
    try:
        fc = ours(call, x.to(dtype))
    except (RuntimeError, NotImplementedError):  # no CPU kernel for this dtype: draw again
        assume(False)
    assert (fc.total.flops, fc.total.macs) == (reference.flops, reference.macs)
    scale = size_of(dtype) / 4
    assert fc.total.bytes_read == reference.bytes_read * scale
    assert fc.total.bytes_written == reference.bytes_written * scale
    assert fc.unsupported_ops() == {} and fc.estimated_ops() == {}


@given(reduction_cases())
def test_reduction_out_variant_prices_the_same(case):
    """sum(out=) and mean(out=): the same flops as the functional call; the out tensor is
    written, not read."""
    shape, dims, keepdim = case
    x = torch.randn(shape)
    for name in ("sum", "mean"):
        plain = ours(getattr(torch, name), x, dims, keepdim).total
        out = torch.empty(0)
        with_out = ours(lambda: getattr(torch, name)(x, dims, keepdim, out=out)).total
        assert (with_out.flops, with_out.bytes_read, with_out.bytes_written) == (
            plain.flops, plain.bytes_read, plain.bytes_written)
