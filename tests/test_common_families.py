"""Ops common model families run that had no formula: ``aten.isin`` (every transformers
``generate()``), weight normalisation (wav2vec2, HuBERT), CTC (their loss), torchvision's
``nms`` / ``roi_align`` (detectors) and ``_pad_packed_sequence`` under ``inference_mode``.
Each formula is checked against an independent oracle: a decomposition into simpler ops
counted by the counter, or a naive loop on tiny shapes that also computes the op's values."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from dispatch_flops import FlopCounter
from dispatch_flops.formulas import Category

aten = torch.ops.aten


def flops(fn) -> int:
    with FlopCounter() as fc:
        fn()
    assert not fc.unsupported_ops(), fc.unsupported_ops()
    return fc.total.flops


def op_flops(fn, name: str) -> int:
    with FlopCounter() as fc:
        fn()
    assert name not in fc.unsupported_ops(), fc.unsupported_ops()
    return fc.by_operator()[name].flops


# ---- isin ----------------------------------------------------------------------------------
@pytest.mark.parametrize("e_shape, t_shape", [((6,), (3,)), ((2, 5), (2,)), ((4,), (1,))])
def test_isin_element_by_element_is_its_decomposition(e_shape, t_shape):
    """A small test set (generate()'s end-of-sequence ids): each element compared with each
    test element and or-ed: the counter's count of (e[..., None] == t).any(-1)."""
    e, t = torch.randint(0, 9, e_shape), torch.randint(0, 9, t_shape)
    got = op_flops(lambda: torch.isin(e, t), "aten.isin")
    assert got == flops(lambda: (e.unsqueeze(-1) == t.flatten()).any(-1))
    assert torch.equal(torch.isin(e, t), (e.unsqueeze(-1) == t.flatten()).any(-1))


def test_isin_of_a_large_test_set_sorts_as_torch_does():
    """A large test set (past torch's 10 * E^0.145) is sorted with the elements: the count of
    sorting both together and comparing sorted neighbours."""
    e, t = torch.randint(0, 99, (4,)), torch.randint(0, 99, (40,))
    got = op_flops(lambda: torch.isin(e, t), "aten.isin")

    def decomposed():
        s = torch.sort(torch.cat([e, t])).values
        s[1:] == s[:-1]  # noqa: B015 - counted, not used
    assert got == flops(decomposed)


def test_isin_with_a_scalar_is_one_comparison_per_element():
    e = torch.arange(7)
    assert op_flops(lambda: torch.isin(e, 3), "aten.isin") == 7 * 2
    assert op_flops(lambda: torch.isin(3, e), "aten.isin") == 7 * 2


# ---- weight norm ---------------------------------------------------------------------------
@pytest.mark.parametrize("shape, dim", [((4, 3), 0), ((6, 2, 5), 0), ((3, 4, 2), 2)])
def test_weight_norm_is_its_decomposition(shape, dim):
    """Fused weight norm costs what v * (g / norm_except_dim(v)) costs, and computes it."""
    v = torch.randn(shape)
    g = torch.randn([s if i == dim else 1 for i, s in enumerate(shape)])
    got = op_flops(lambda: torch._weight_norm_interface(v, g, dim), "aten._weight_norm_interface")
    assert got == flops(lambda: v * (g / torch.norm_except_dim(v, 2, dim)))


@pytest.mark.parametrize("shape, dim", [((4, 3), 0), ((6, 2, 5), 0), ((3, 4, 2), 2)])
def test_weight_norm_backward_is_its_decomposition(shape, dim):
    """The backward's count is that of its gradient written as plain ops, which compute
    torch's gradients (so the decomposition is the real one)."""
    v = torch.randn(shape, dtype=torch.float64)
    g = torch.randn([s if i == dim else 1 for i, s in enumerate(shape)], dtype=torch.float64)
    grad_w = torch.randn(shape, dtype=torch.float64)
    w, norms = torch._weight_norm_interface(v, g, dim)
    dims = [i for i in range(len(shape)) if i != dim]

    def decomposed():
        a = (grad_w * v).sum(dims, keepdim=True)
        grad_g = a / norms
        grad_v = (g / norms) * (grad_w - v * (grad_g / norms))
        return grad_v, grad_g

    expected = torch.ops.aten._weight_norm_interface_backward(grad_w, v, g, norms, dim)
    for mine, torch_s in zip(decomposed(), expected):
        torch.testing.assert_close(mine, torch_s.reshape(mine.shape))
    got = op_flops(lambda: torch.ops.aten._weight_norm_interface_backward(
        grad_w, v, g, norms, dim), "aten._weight_norm_interface_backward")
    assert got == flops(decomposed)


def test_a_weight_normed_convolution_trains_with_nothing_unsupported():
    """wav2vec2's positional convolution: weight_norm over dim 2, forward and backward."""
    conv = nn.utils.parametrizations.weight_norm(nn.Conv1d(4, 4, 3, groups=2), dim=2)
    x = torch.randn(2, 4, 9)
    with FlopCounter(conv) as fc:
        conv(x).sum().backward()
    assert not fc.unsupported_ops()
    assert fc.by_operator()["aten._weight_norm_interface"].flops > 0


# ---- CTC -----------------------------------------------------------------------------------
def log(x: float) -> float:
    return math.log(x) if x > 0 else -math.inf  # std::log(0) is -inf


def naive_ctc(log_probs, targets, input_lengths, target_lengths, blank=0):
    """The CPU kernel's loops (LossCTC.cpp) in Python, counting each operation: the loss and
    log_alpha per sequence, and the count."""
    ops = 0
    neg_inf = -math.inf
    losses, alphas = [], []
    lp = log_probs.tolist()
    for b, (t_len, l_len) in enumerate(zip(input_lengths, target_lengths)):
        labels = targets[b][:l_len]
        prime = [blank if s % 2 == 0 else labels[s // 2] for s in range(2 * l_len + 1)]
        alpha = [[neg_inf] * len(prime) for _ in range(t_len)]
        alpha[0][0] = lp[0][b][blank]
        if l_len:
            alpha[0][1] = lp[0][b][prime[1]]
        for t in range(1, t_len):
            for s in range(len(prime)):
                la1, la2, la3 = alpha[t - 1][s], neg_inf, neg_inf
                m = la1
                if s > 0:
                    la2 = alpha[t - 1][s - 1]
                    m = max(m, la2)
                if s > 1 and prime[s - 2] != prime[s]:
                    la3 = alpha[t - 1][s - 2]
                    m = max(m, la3)
                if m == neg_inf:
                    m = 0
                ops += 3  # two comparisons for the max (done or not), the test for -inf
                alpha[t][s] = log(math.exp(la1 - m) + math.exp(la2 - m)
                                  + math.exp(la3 - m)) + m + lp[t][b][prime[s]]
                ops += 3 + 3 + 2 + 1 + 2  # subtracts, exps, adds, log, adds
        l1 = alpha[t_len - 1][2 * l_len]
        l2 = alpha[t_len - 1][2 * l_len - 1] if l_len else neg_inf
        m = max(l1, l2)
        m = 0 if m == neg_inf else m
        losses.append(-(log(math.exp(l1 - m) + math.exp(l2 - m)) + m))
        ops += 1 + 1 + 2 + 2 + 1 + 1 + 1 + 1  # max, test, subtracts, exps, add, log, add, neg
        alphas.append(alpha)
    return losses, alphas, ops


def ctc_inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    T, N, C = 6, 3, 5
    log_probs = torch.randn(T, N, C, generator=g, dtype=torch.float64).log_softmax(-1)
    targets = torch.randint(1, C, (N, 3), generator=g)
    targets[0, 1] = targets[0, 0]  # a repeated label: its skip transition is off
    return log_probs, targets, [6, 5, 4], [3, 2, 0]


@pytest.mark.parametrize("lengths_as", ["ints", "tensors"])
def test_ctc_loss_is_the_naive_loop_count(lengths_as):
    """The formula counts the kernel's loops: the loop's count, and the loop computes torch's
    losses (so it is the kernel's algorithm). Lengths as lists of ints or CPU tensors (read by
    value) price the same."""
    log_probs, targets, il, tl = ctc_inputs()
    losses, _, ops = naive_ctc(log_probs, targets.tolist(), il, tl)
    lengths = (il, tl) if lengths_as == "ints" else (torch.tensor(il), torch.tensor(tl))
    nll, _ = aten._ctc_loss(log_probs, targets, *lengths)
    torch.testing.assert_close(nll, torch.tensor(losses, dtype=torch.float64))
    assert op_flops(lambda: aten._ctc_loss(log_probs, targets, *lengths), "aten._ctc_loss") == ops


def test_ctc_loss_backward_closed_form_and_its_training_step():
    """F.ctc_loss trains with nothing unsupported; the backward's count is the closed form of
    its kernel's loops: beta's recursion as alpha's, each (frame, extended label) log-added
    into its class, each (frame, class) of the gradient."""
    log_probs, targets, il, tl = ctc_inputs()
    log_probs.requires_grad_()
    with FlopCounter() as fc:
        F.ctc_loss(log_probs, targets, torch.tensor(il), torch.tensor(tl),
                   reduction="sum").backward()
    assert not fc.unsupported_ops()
    _, _, forward_ops = naive_ctc(log_probs.detach(), targets.tolist(), il, tl)
    assert fc.by_operator()["aten._ctc_loss"].flops == forward_ops
    classes = log_probs.shape[-1]
    expected = sum(14 * (t - 1) * (2 * labels + 1) + 10 * t * (2 * labels + 1) + 6 * t * classes
                   for t, labels in zip(il, tl)) + len(il)
    assert fc.by_operator()["aten._ctc_loss_backward"].flops == expected


# ---- torchvision ---------------------------------------------------------------------------
def vision_ops():
    """torchvision's ops when torchvision imports; else stand-ins of the same schemas in the
    torchvision namespace (torchvision's CUDA wheels do not load with a CPU torch)."""
    try:
        import torchvision  # noqa: F401
        return torch.ops.torchvision
    except Exception:
        pass
    if not hasattr(torch.ops.torchvision, "nms"):
        lib = torch.library.Library("torchvision", "DEF")  # noqa: TOR901
        lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        lib.define("roi_align(Tensor input, Tensor rois, float spatial_scale, SymInt "
                   "pooled_height, SymInt pooled_width, int sampling_ratio, bool aligned) "
                   "-> Tensor")
        lib.define("_roi_align_backward(Tensor grad, Tensor rois, float spatial_scale, SymInt "
                   "pooled_height, SymInt pooled_width, SymInt batch_size, SymInt channels, "
                   "SymInt height, SymInt width, int sampling_ratio, bool aligned) -> Tensor")
        lib.impl("nms", lambda d, s, th: torch.arange(d.shape[0]), "CompositeExplicitAutograd")
        lib.impl("roi_align", lambda x, r, sc, ph, pw, sr, al: x.new_zeros(
            r.shape[0], x.shape[1], ph, pw), "CompositeExplicitAutograd")
        lib.impl("_roi_align_backward", lambda g, r, sc, ph, pw, n, c, h, w, sr, al:
                 g.new_zeros(n, c, h, w), "CompositeExplicitAutograd")
        vision_ops.library = lib  # kept: the ops live as long as their library
    return torch.ops.torchvision


def naive_nms_pairs(n: int) -> int:
    """The kernel's pair loop with no box suppressed (a threshold of 1: an IoU is at most
    1): each box against every later one."""
    return sum(1 for i in range(n) for j in range(i + 1, n))


def test_nms_is_priced_at_most_every_pair():
    tv = vision_ops()
    boxes = torch.tensor([[0, 0, 10, 10], [1, 1, 11, 11], [50, 50, 60, 60], [0, 0, 5, 5.]])
    scores = torch.tensor([0.9, 0.8, 0.7, 0.6])
    got = op_flops(lambda: tv.nms(boxes, scores, 1.0), "torchvision.nms")
    assert got == 4 * 3 + 4 * 2 + naive_nms_pairs(4) * 13


@pytest.mark.parametrize("sampling_ratio", [1, 2])
def test_roi_align_counts_every_sample(sampling_ratio):
    """Forward and backward: a naive loop over boxes, bins, samples and channels."""
    tv = vision_ops()
    x = torch.randn(2, 3, 8, 8)
    rois = torch.tensor([[0, 0, 0, 4, 4], [1, 1, 1, 7, 6], [0, 2, 2, 3, 3.]])
    ph, pw = 2, 3
    forward = backward = 0
    for _box in range(len(rois)):
        forward += 14
        backward_box = 14
        for _bin in range(ph * pw):
            for _sample in range(sampling_ratio ** 2):
                forward += 28
            for _channel in range(x.shape[1]):
                forward += 1 + 8 * sampling_ratio ** 2
                backward_box += 1 + (28 + 8) * sampling_ratio ** 2
        backward += backward_box
    out = tv.roi_align(x, rois, 1.0, ph, pw, sampling_ratio, True)
    assert out.shape == (3, 3, ph, pw)
    assert op_flops(lambda: tv.roi_align(x, rois, 1.0, ph, pw, sampling_ratio, True),
                    "torchvision.roi_align") == forward
    assert op_flops(lambda: tv._roi_align_backward(out, rois, 1.0, ph, pw, 2, 3, 8, 8,
                                                    sampling_ratio, True),
                    "torchvision._roi_align_backward") == backward


def test_roi_align_with_an_adaptive_grid_is_unsupported_saying_why():
    """sampling_ratio <= 0 sizes the grid by the boxes' coordinates: reported unsupported,
    with the reason, never zero."""
    tv = vision_ops()
    x, rois = torch.randn(1, 2, 4, 4), torch.tensor([[0, 0, 0, 3, 3.]])
    with pytest.warns(RuntimeWarning, match="adaptive sampling_ratio"):
        with FlopCounter() as fc:
            tv.roi_align(x, rois, 1.0, 2, 2, -1, False)
        assert "torchvision.roi_align" in fc.unsupported_ops()  # priced when first read


# ---- pad_packed_sequence ------------------------------------------------------------------
def test_pad_packed_sequence_under_inference_mode_is_a_copy():
    """Seen whole under inference_mode (a composite op): no arithmetic, its bytes a copy."""
    from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence
    packed = pack_padded_sequence(torch.randn(3, 2, 4), [3, 2])
    with torch.inference_mode(), FlopCounter() as fc:
        padded, _ = pad_packed_sequence(packed)
    assert not fc.unsupported_ops() and fc.total.flops == 0
    stats = fc.by_operator()["aten._pad_packed_sequence"]
    assert stats.bytes_written == padded.numel() * 4 + 2 * 8  # the padded data, the lengths
    assert fc.to_profile().coverage().share(Category.NO_ARITHMETIC, "calls") == 1.0


@pytest.mark.slow
def test_generate_with_an_end_of_sequence_id_counts_every_op():
    """transformers' generate() checks its stopping ids with torch.isin every step: counted,
    nothing unsupported."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=64, n_embd=32, n_layer=1, n_head=4,
                                     n_positions=32, eos_token_id=3, pad_token_id=3)
    model = transformers.GPT2LMHeadModel(config).eval()
    with FlopCounter(model) as fc:
        model.generate(torch.randint(4, 64, (1, 4)), max_new_tokens=3, do_sample=False)
    assert not fc.unsupported_ops()
    assert fc.by_operator()["aten.isin"].calls >= 1
