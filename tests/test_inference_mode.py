"""Under torch.inference_mode() composite ops (aten.linear, aten.layer_norm, aten.lstm, ...)
reach the mode without being decomposed (pytorch issue #126268). Each must count exactly what
its no_grad decomposition counts."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from helpers import ours

torch.manual_seed(0)
x4 = torch.randn(2, 4, 6, 6)
x3 = torch.randn(2, 4, 9)
x5 = torch.randn(1, 2, 4, 4, 4)
logits = torch.randn(5, 7)
labels = torch.tensor([0, 6, 2, 2, -100])
probs = torch.randn(5, 7).softmax(-1)
a, b = torch.randn(6, 5), torch.randn(6, 5)
seq = torch.randn(3, 5, 4)


def _module(m):
    m.eval()
    return lambda: m(seq)


CASES = {
    "linear": lambda: F.linear(x3, torch.randn(3, 9), torch.randn(3)),
    "conv1d": lambda: F.conv1d(x3, torch.randn(5, 4, 3), torch.randn(5), padding=1),
    "conv2d": lambda: F.conv2d(x4, torch.randn(6, 2, 3, 3), None, 2, 1, 1, 2),
    "conv3d": lambda: F.conv3d(x5, torch.randn(3, 2, 2, 2, 2), torch.randn(3)),
    "conv_transpose2d": lambda: F.conv_transpose2d(x4, torch.randn(4, 3, 3, 3), torch.randn(3)),
    "layer_norm": lambda: F.layer_norm(x3, (9,), torch.randn(9), torch.randn(9)),
    "group_norm": lambda: F.group_norm(x4, 2, torch.randn(4), torch.randn(4)),
    "batch_norm_train": lambda: F.batch_norm(x4, torch.zeros(4), torch.ones(4), training=True),
    "batch_norm_eval": lambda: F.batch_norm(x4, torch.zeros(4), torch.ones(4), torch.ones(4)),
    "instance_norm": lambda: F.instance_norm(x4, torch.zeros(4), torch.ones(4), torch.ones(4),
                                             torch.zeros(4), use_input_stats=True),
    "instance_norm_no_stats": lambda: F.instance_norm(x4),
    "rms_norm": lambda: F.rms_norm(x3, (9,), torch.randn(9)),
    "rms_norm_no_weight": lambda: F.rms_norm(x4, (6, 6)),
    "softmax": lambda: (x3.softmax(-1), x3.log_softmax(1)),
    "dropout": lambda: (F.dropout(x3, 0.3, True), F.dropout(x3, 0.3, False)),
    "dropout2d": lambda: F.dropout2d(x4, 0.3, True),
    "alpha_dropout": lambda: (F.alpha_dropout(x3, 0.3, True),
                              F.feature_alpha_dropout(x4, 0.3, True)),
    "max_pool": lambda: (F.max_pool1d(x3, 2), F.max_pool2d(x4, 3, 2, 1), F.max_pool3d(x5, 2)),
    "avg_pool": lambda: (F.avg_pool1d(x3, 3, 2, 1), F.avg_pool2d(x4, 2)),
    "adaptive_pool": lambda: (F.adaptive_avg_pool1d(x3, 4), F.adaptive_avg_pool2d(x4, 1),
                              F.adaptive_avg_pool2d(x4, (4, 3)), F.adaptive_avg_pool3d(x5, 2),
                              F.adaptive_max_pool1d(x3, 4)),
    "pad": lambda: (F.pad(x4, (1, 2)), F.pad(x4, (1, 1, 2, 2), mode="reflect"),
                    F.pad(x4, (1, 1, 1, 1), mode="replicate"),
                    F.pad(x4, (1, 1, 2, 0), mode="circular")),
    "interpolate": lambda: (F.interpolate(x4, scale_factor=2, mode="bilinear"),
                            F.interpolate(x4, size=(3, 5), mode="area")),
    "cross_entropy": lambda: [F.cross_entropy(logits, labels, reduction=r)
                              for r in ("mean", "sum", "none")],
    "cross_entropy_weighted": lambda: [F.cross_entropy(logits, labels, torch.rand(7), reduction=r)
                                       for r in ("mean", "sum", "none")],
    "cross_entropy_smoothing": lambda: [
        F.cross_entropy(logits, labels, w, reduction=r, label_smoothing=0.1)
        for r in ("mean", "sum", "none") for w in (None, torch.rand(7))],
    "cross_entropy_probabilities": lambda: [
        F.cross_entropy(logits, probs, reduction=r, label_smoothing=s)
        for r in ("mean", "sum", "none") for s in (0.0, 0.2)],
    "cross_entropy_nd": lambda: F.cross_entropy(x4, torch.randint(0, 4, (2, 6, 6))),
    "nll_loss": lambda: F.nll_loss(logits.log_softmax(-1), labels, torch.rand(7)),
    "l1_kl": lambda: [(F.l1_loss(a, b, reduction=r), F.kl_div(a, b, reduction=r),
                       F.kl_div(a, b, reduction=r, log_target=True))
                      for r in ("mean", "sum", "none")],
    "margin_losses": lambda: (F.margin_ranking_loss(a[0], b[0], torch.ones(5)),
                              F.hinge_embedding_loss(a, b.sign()),
                              F.cosine_embedding_loss(a, b, torch.ones(6)),
                              F.triplet_margin_loss(a, b, b.flip(0)),
                              F.triplet_margin_loss(a, b, b.flip(0), swap=True, p=1)),
    "poisson_nll_loss": lambda: (F.poisson_nll_loss(a, b.abs()),
                                 F.poisson_nll_loss(a.abs(), b.abs(), log_input=False)),
    "similarity": lambda: (F.cosine_similarity(a, b), torch.outer(a[0], b[0]),
                           a.diff(dim=1), a.diff(n=2, dim=0, prepend=b[:1]),
                           F.logsigmoid(a), torch.cdist(a, b), torch.cdist(x3, x3)),
    "embedding": lambda: (F.embedding(torch.tensor([[1, 2], [0, 5]]), a),
                          F.embedding_bag(torch.tensor([1, 2, 0, 5]), a, torch.tensor([0, 2]),
                                          mode="mean")),
    "lstm": _module(nn.LSTM(4, 3, num_layers=2, bidirectional=True, batch_first=True)),
    "lstm_proj": _module(nn.LSTM(4, 5, proj_size=2)),
    "gru": _module(nn.GRU(4, 3, num_layers=2, batch_first=True)),
    "rnn": _module(nn.RNN(4, 3, nonlinearity="relu", bias=False)),
    "cells": lambda: (nn.LSTMCell(4, 3)(seq[0]), nn.GRUCell(4, 3)(seq[0]),
                      nn.RNNCell(4, 3)(seq[0])),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_inference_mode_counts_exactly_as_no_grad(name):
    """Same flops and MACs with the composite seen whole (inference_mode) and decomposed
    (no_grad); nothing unsupported or estimated either way."""
    call = CASES[name]
    torch.manual_seed(0)
    with torch.no_grad():
        decomposed = ours(call)
    torch.manual_seed(0)
    with torch.inference_mode():
        composite = ours(call)
    for fc in (decomposed, composite):
        assert fc.unsupported_ops() == {} and fc.estimated_ops() == {}
    assert (composite.total.flops, composite.total.macs) == (
        decomposed.total.flops, decomposed.total.macs)
