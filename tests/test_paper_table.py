"""paper_table: several models counted at their inputs in one table, as Markdown and LaTeX,
with the units and the footnote. Oracles: a FlopCounter on the same call, closed forms for
linear layers, and torchvision's published GFLOPS (= GMACs) where torchvision is installed."""

import pytest
import torch
from torch import nn

from dispatch_flops import FlopCounter, paper_table
from dispatch_flops.views.paper_table import FOOTNOTE, UNITS


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(10, 20), nn.ReLU(), nn.Linear(20, 5))


def test_rows_are_the_counters_figures_forward_and_training_step():
    """Forward: MACs of the two linears (b i o each), FLOPs and params as a FlopCounter
    counts them; the training step adds backward, and leaves grads and train flags as
    they were."""
    model, x = mlp(), torch.randn(3, 10)
    with torch.no_grad(), FlopCounter(model) as fc:
        model(x)
    (row,) = paper_table({"MLP": (model, x)}).rows
    assert (row.name, row.inputs) == ("MLP", "3×10")
    assert row.macs == 3 * 10 * 20 + 3 * 20 * 5 == fc.total.macs
    assert (row.flops, row.model_flops) == (fc.total.flops, fc.total.model_flops)
    assert row.params == 10 * 20 + 20 + 20 * 5 + 5
    (train,) = paper_table({"MLP": (model, x)}, step="train").rows
    assert train.macs == row.macs + 3 * 5 * 20 + 20 * 3 * 5 + 10 * 3 * 20
    assert model.training is True and all(p.grad is None for p in model.parameters())


def test_markdown_and_latex_layouts():
    """Both formats carry the units, one row per model in order, the figures in G with two
    decimals, and the footnote; LaTeX escapes names."""
    with torch.device("meta"):  # a 3 M-parameter layer counted from shapes alone
        layer = nn.TransformerEncoderLayer(512, 8, batch_first=True)
    table = paper_table({"MLP_a": (mlp(), torch.randn(3, 10)),
                         "Encoder": (layer, torch.empty(1, 128, 512, device="meta"))})
    markdown = table.to_markdown()
    lines = markdown.splitlines()
    assert lines[0] == f"Units: {UNITS}." and lines[-1] == f"Note: {FOOTNOTE}"
    header = [c.strip() for c in lines[2].split("|")[1:-1]]
    assert header == ["Model", "Input", "Params (M)", "MACs (G, fwd)", "FLOPs (G, fwd)",
                      "Model FLOPs (G, fwd)"]
    encoder = [c.strip() for c in lines[5].split("|")[1:-1]]
    assert encoder[:3] == ["Encoder", "1×128×512", "3.15"]
    assert encoder[3] == f"{table.rows[1].macs / 1e9:.2f}"
    latex = table.to_latex(label="tab:cost")
    assert latex.startswith(r"\begin{table}") and r"\label{tab:cost}" in latex
    assert r"MLP\_a & 3$\times$10 &" in latex and latex.count(r" \\") == 3
    assert "``FLOPs''" in latex  # TeX quotes
    with pytest.raises(ValueError, match="scale must be one of"):
        table.to_markdown(scale="X")
    with pytest.raises(ValueError, match="step must be one of"):
        paper_table({"MLP": (mlp(), torch.randn(3, 10))}, step="backward")


@pytest.mark.slow
def test_torchvision_published_gflops_are_our_gmacs():
    """torchvision's weight metadata publishes GFLOPS per classification model; they are
    GMACs: this package's MACs on meta tensors, to torchvision's three decimals."""
    models = pytest.importorskip("torchvision.models")
    names = ["resnet50", "mobilenet_v3_large", "vit_b_16", "swin_t"]
    entries = {}
    for name in names:
        with torch.device("meta"):
            entries[name] = (models.get_model(name), torch.empty(1, 3, 224, 224, device="meta"))
    table = paper_table(entries)
    for name, row in zip(names, table.rows):
        published = models.get_model_weights(name).DEFAULT.meta
        assert round(row.macs / 1e9, 3) == published["_ops"], name
        assert row.params == published["num_params"], name
