"""Real training steps end with nothing unsupported: model families no one here wrote
(HuggingFace transformers, built from small configs, no weights downloaded), torch.nn's own
layers and losses, and every optimizer implementation."""

import os

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from dispatch_flops import FlopCounter

pytestmark = pytest.mark.slow  # transformers models and every optimizer

os.environ.setdefault("HF_HUB_OFFLINE", "1")

VOCAB = 97


def _transformers():
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    return transformers


def _hf_model(name):
    t = _transformers()
    small = dict(vocab_size=VOCAB, num_attention_heads=4)
    if name == "gpt2":
        return t.GPT2LMHeadModel(t.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=VOCAB,
                                              n_positions=32)), "causal"
    if name == "bert":
        return t.BertForMaskedLM(t.BertConfig(num_hidden_layers=2, hidden_size=32,
                                              intermediate_size=64, max_position_embeddings=32,
                                              **small)), "causal"
    if name == "llama":
        return t.LlamaForCausalLM(t.LlamaConfig(num_hidden_layers=2, hidden_size=32,
                                                num_key_value_heads=2, intermediate_size=64,
                                                max_position_embeddings=32, **small)), "causal"
    if name == "mixtral":
        return t.MixtralForCausalLM(t.MixtralConfig(num_hidden_layers=2, hidden_size=32,
                                                    num_key_value_heads=2, intermediate_size=64,
                                                    max_position_embeddings=32,
                                                    num_local_experts=4, num_experts_per_tok=2,
                                                    **small)), "causal"
    if name == "t5":
        return t.T5ForConditionalGeneration(t.T5Config(
            num_layers=2, num_decoder_layers=2, d_model=32, d_ff=64, num_heads=4, d_kv=8,
            vocab_size=VOCAB, decoder_start_token_id=0, pad_token_id=0)), "seq2seq"
    if name == "vit":
        return t.ViTForImageClassification(t.ViTConfig(
            num_hidden_layers=2, hidden_size=32, num_attention_heads=4, intermediate_size=64,
            image_size=16, patch_size=4, num_labels=3)), "image"
    raise ValueError(name)


def _inputs(kind):
    ids = torch.randint(0, VOCAB, (2, 8))
    if kind == "causal":
        return dict(input_ids=ids, labels=ids)
    if kind == "seq2seq":
        return dict(input_ids=ids, labels=ids[:, :5].contiguous())
    return dict(pixel_values=torch.randn(2, 3, 16, 16), labels=torch.tensor([0, 2]))


@pytest.mark.parametrize("name", ["gpt2", "bert", "llama", "mixtral", "t5", "vit"])
def test_huggingface_training_step_has_no_unsupported_op(name):
    """Forward + backward + AdamW on a tiny model: every op priced (exactly: nothing estimated
    either), attributed to its modules; then a forward under inference_mode, the same."""
    torch.manual_seed(0)
    model, kind = _hf_model(name)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    inputs = _inputs(kind)
    with FlopCounter(model) as fc:
        model(**inputs).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    assert fc.unsupported_ops() == {}
    assert fc.estimated_ops() == {}
    assert fc.coverage().priced_exactly("calls") == 1.0
    assert fc.by_phase()["backward"].macs > fc.by_phase()["forward"].macs > 0
    model.eval()
    inputs.pop("labels")
    if kind == "seq2seq":
        inputs["decoder_input_ids"] = inputs["input_ids"][:, :5]
    with torch.inference_mode(), FlopCounter(model) as fc:
        model(**inputs)
    assert fc.unsupported_ops() == {}
    assert fc.total.macs > 0


# ---- torch.nn's own layers --------------------------------------------------------------------


def _nn_workloads():
    seq = torch.randn(2, 6, 16)
    encoder = nn.TransformerEncoderLayer(16, 4, 32, batch_first=True, dropout=0.1)
    mha = nn.MultiheadAttention(16, 4, batch_first=True)
    lstm = nn.LSTM(16, 8, num_layers=2, batch_first=True, bidirectional=True)
    gru = nn.GRU(16, 8, batch_first=True)
    rnn = nn.RNN(16, 8, batch_first=True)
    cnn = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 8, 3, padding=1, groups=2), nn.GroupNorm(2, 8), nn.GELU(), nn.AvgPool2d(2),
        nn.Upsample(scale_factor=2, mode="bilinear"), nn.InstanceNorm2d(8, affine=True),
        nn.SiLU(), nn.AdaptiveAvgPool2d(3), nn.Upsample(scale_factor=2, mode="nearest"),
        nn.ConvTranspose2d(8, 4, 2), nn.AdaptiveMaxPool2d(2), nn.Flatten(), nn.Dropout(0.2),
        nn.Linear(16, 4))
    images = torch.randn(2, 3, 16, 16)
    labels = torch.tensor([1, 3])
    padding = torch.tensor([[False] * 6, [False] * 4 + [True] * 2])

    def eval_no_grad(module, call):
        def run():
            module.eval()
            with torch.no_grad():
                call()
            module.train()
        return run

    def losses():
        p = torch.randn(4, 5, requires_grad=True)
        t = torch.randn(4, 5)
        classes = torch.tensor([0, 1, 4, 2])
        terms = [
            F.cross_entropy(p, classes), F.cross_entropy(p, classes, label_smoothing=0.1),
            F.cross_entropy(p, t.softmax(-1)), F.nll_loss(F.log_softmax(p, -1), classes),
            F.mse_loss(p, t), F.l1_loss(p, t), F.smooth_l1_loss(p, t), F.huber_loss(p, t),
            F.binary_cross_entropy(torch.sigmoid(p), torch.rand(4, 5)),
            F.binary_cross_entropy_with_logits(p, torch.rand(4, 5), pos_weight=torch.rand(5)),
            F.kl_div(F.log_softmax(p, -1), t.softmax(-1), reduction="batchmean"),
            F.soft_margin_loss(p, t.sign()), F.multi_margin_loss(p, classes),
            F.cosine_embedding_loss(p, t, torch.ones(4)), F.triplet_margin_loss(p, t, t.flip(0)),
        ]
        sum(terms).backward()

    def interpolation():
        x = torch.randn(1, 2, 5, 5, requires_grad=True)
        outs = [F.interpolate(x, scale_factor=2, mode=m)
                for m in ("nearest", "bilinear", "bicubic", "nearest-exact", "area")]
        outs.append(F.interpolate(x, size=(3, 3), mode="bilinear", antialias=True))
        outs.append(F.interpolate(x[:, :, 0], scale_factor=2, mode="linear"))
        outs.append(F.interpolate(x[:, :, None], scale_factor=2, mode="trilinear"))
        sum(o.sum() for o in outs).backward()

    return {
        "encoder_train": (encoder, lambda: encoder(seq, src_key_padding_mask=padding).sum()
                          .backward()),
        "encoder_eval_fast_path": (encoder, eval_no_grad(
            encoder, lambda: encoder(seq, src_key_padding_mask=padding))),
        "multihead_attention": (mha, lambda: mha(seq, seq, seq)[0].sum().backward()),
        "multihead_attention_fast_path": (mha, eval_no_grad(mha, lambda: mha(seq, seq, seq))),
        "lstm": (lstm, lambda: lstm(seq)[0].sum().backward()),
        "gru": (gru, lambda: gru(seq)[0].sum().backward()),
        "rnn": (rnn, lambda: rnn(seq)[0].sum().backward()),
        "cnn": (cnn, lambda: F.cross_entropy(cnn(images), labels).backward()),
        "cnn_eval": (cnn, eval_no_grad(cnn, lambda: cnn(images))),
        "losses": (None, losses),
        "interpolation": (None, interpolation),
    }


@pytest.mark.parametrize("name", sorted(_nn_workloads()))
def test_torch_nn_layers_have_no_unsupported_op(name):
    """Every op torch.nn's layers, fast paths and losses dispatch to is priced, in training
    and under inference_mode."""
    torch.manual_seed(0)
    module, call = _nn_workloads()[name]
    with FlopCounter(module) as fc:
        call()
    assert fc.unsupported_ops() == {}
    assert fc.estimated_ops() == {}
    with torch.inference_mode(), FlopCounter(module) as fc:
        try:
            call()
        except RuntimeError as e:  # backward() is not allowed under inference_mode
            assert "inference" in str(e) or "grad" in str(e)
    assert fc.unsupported_ops() == {}


OPTIMIZERS = {
    "adamw_foreach": lambda p: torch.optim.AdamW(p, foreach=True),
    "adamw_loop": lambda p: torch.optim.AdamW(p, foreach=False),
    "adamw_fused": lambda p: torch.optim.AdamW(p, fused=True),
    "adam_amsgrad": lambda p: torch.optim.Adam(p, amsgrad=True, weight_decay=0.1),
    "sgd_momentum_foreach": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, foreach=True),
    "sgd_momentum_loop": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, foreach=False),
    "sgd_nesterov_fused": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True,
                                                    fused=True),
    "clip_grad_norm": None,
}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_optimizer_steps_have_no_unsupported_op(name):
    """Two training steps with each optimizer implementation (and gradient clipping, foreach
    and not): nothing unsupported or estimated."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8), nn.Linear(8, 2))
    make = OPTIMIZERS[name]
    optimizer = make(model.parameters()) if make else None
    x = torch.randn(4, 8)
    with FlopCounter(model) as fc:
        for _ in range(2):
            model(x).sum().backward()
            if optimizer is None:
                nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=False)
            else:
                optimizer.step()
                optimizer.zero_grad()
    assert fc.unsupported_ops() == {}
    assert fc.estimated_ops() == {}
