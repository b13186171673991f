"""Issue 56, items 3 (the rest), 4, 5 and 6: dropout-like work is hardware work however a layer
spells it; diffusion steps counted as the scheduler defines them; files from newer versions and
damaged files; ``profile_generate``'s options and every text sink."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from dispatch_flops import FlopCounter
from dispatch_flops.formulas import ELEMENT_COSTS as C

# -- item 5: dropout-like work, whatever its spelling -----------------------------------------


class StochasticDepth(nn.Module):
    """torchvision.ops.stochastic_depth, mode="row", as it is written there."""

    def __init__(self, p: float):
        super().__init__()
        self.p = p

    def forward(self, x):
        if not self.training or self.p == 0.0:
            return x
        survival_rate = 1.0 - self.p
        noise = torch.empty([x.shape[0]] + [1] * (x.ndim - 1), dtype=x.dtype, device=x.device)
        noise = noise.bernoulli_(survival_rate)
        noise.div_(survival_rate)
        return x * noise


class DropPath(nn.Module):
    """timm's drop_path (``x.new_empty(shape).bernoulli_(keep).div_(keep)``)."""

    def __init__(self, p: float):
        super().__init__()
        self.p = p

    def forward(self, x):
        if not self.training:
            return x
        keep = 1 - self.p
        shape = (x.shape[0],) + (1,) * (x.ndim - 1)
        random_tensor = x.new_empty(shape).bernoulli_(keep)
        random_tensor.div_(keep)
        return x * random_tensor


class DropPathRand(nn.Module):
    """Drop-path spelled with ``rand``: ``floor_(keep + rand)``, scaled, times the data."""

    def __init__(self, p: float):
        super().__init__()
        self.p = p

    def forward(self, x):
        if not self.training:
            return x
        keep = 1 - self.p
        random_tensor = keep + torch.rand((x.shape[0],) + (1,) * (x.ndim - 1), dtype=x.dtype)
        random_tensor.floor_()
        return x * (random_tensor / keep)


class InPlaceDropout(nn.Module):
    def forward(self, x):
        return F.dropout(x, 0.3, self.training, inplace=True)


class MaskDropout(nn.Module):
    """Attention written as plain ops with an additive causal mask, its probabilities dropped
    out twice: ``F.dropout``, and a mask drawn (``rand >= p``), inverted and filled in."""

    def forward(self, x):
        scores = x @ x.transpose(-1, -2)
        causal = torch.full(scores.shape[-2:], float("-inf")).triu(1)
        probs = F.dropout((scores + causal).softmax(-1), 0.2, self.training)
        if self.training:
            kept = torch.rand(probs.shape) >= 0.1
            probs = probs.masked_fill(~kept, 0.0)
        return probs @ x


def _step(model, x, mode):
    getattr(model, mode)()
    torch.manual_seed(0)
    with FlopCounter(model) as fc:
        model(x).sum().backward()
    model.zero_grad(set_to_none=True)
    return fc


@pytest.mark.parametrize("layer", [StochasticDepth(0.3), DropPath(0.3), DropPathRand(0.3),
                                   InPlaceDropout(), MaskDropout()],
                         ids=lambda m: type(m).__name__)
def test_dropout_like_work_is_hardware_work_whatever_its_spelling(layer):
    """Model flops equal between train() and eval() when a layer's only difference is
    dropout-like work; hardware flops count that work."""
    model = nn.Sequential(nn.Linear(8, 16), layer, nn.Linear(16, 8))
    x = torch.randn(4, 5, 8)
    train, evaluated = _step(model, x, "train"), _step(model, x, "eval")
    assert train.model_flops() == evaluated.model_flops()
    assert train.total.model_macs == evaluated.total.model_macs
    assert train.hardware_flops() > evaluated.hardware_flops()


def test_stochastic_depth_charges_its_draw_scale_and_products():
    """Oracle: the element costs of what stochastic depth runs — a draw and a scale per sample,
    a product per element forward and backward."""
    model = nn.Sequential(nn.Linear(8, 16), StochasticDepth(0.3), nn.Linear(16, 8))
    x = torch.randn(4, 5, 8)
    train, evaluated = _step(model, x, "train"), _step(model, x, "eval")
    samples, n = 4, 4 * 5 * 16
    dropout = samples * (C["random_draw"] + C["bernoulli"] + C["div"]) + 2 * n * C["mul"]
    assert train.hardware_flops() - evaluated.hardware_flops() == dropout


def test_in_place_dropout_charges_what_out_of_place_does():
    x = torch.randn(6, 7)
    counts = []
    for inplace in (False, True):
        torch.manual_seed(0)
        with FlopCounter() as fc:
            F.dropout(x.clone(), 0.2, training=True, inplace=inplace)
        counts.append((fc.model_flops(), fc.hardware_flops()))
    assert counts[0] == counts[1]
    assert counts[1][1] == 42 * (C["random_draw"] + C["bernoulli"] + C["div"] + C["mul"])


def test_data_plus_random_noise_stays_model_work():
    """A draw added to the data is no dropout (a model's own noise): its add stays model flops."""
    x = torch.randn(6, 7)
    with FlopCounter() as fc:
        x + torch.rand(6, 7)
    assert fc.model_flops() == 42 * C["add"]


# -- item 6: diffusion steps as the scheduler defines them ------------------------------------


@pytest.mark.parametrize("make, evaluations", [
    ("HeunDiscreteScheduler", (2, 2, 1)),
    ("DPMSolverSinglestepScheduler", (1, 1, 1)),
    ("DPMSolverMultistepScheduler", (1, 1, 1)),
])
def test_steps_are_the_schedulers_steps(make, evaluations):
    """Heun (two evaluations a step, its last one), DPM-Solver 2S (``solver_order=2``, one
    evaluation per timestep: diffusers' own count) and a multistep solver: as many steps as
    ``num_inference_steps``, each with its evaluations; per_step() times the steps is the
    denoising total."""
    import diffusers
    from diffusers import DiTPipeline, DiTTransformer2DModel
    from test_diffusion import DIT, tiny_vae

    from dispatch_flops import profile_pipeline

    torch.manual_seed(0)
    kwargs = {"solver_order": 2} if make.startswith("DPM") else {}
    scheduler = getattr(diffusers, make)(**kwargs)
    pipe = DiTPipeline(transformer=DiTTransformer2DModel(**dict(DIT, sample_size=8)).eval(),
                       vae=tiny_vae(), scheduler=scheduler)
    pipe.set_progress_bar_config(disable=True)
    pp = profile_pipeline(pipe, class_labels=[1], num_inference_steps=3, guidance_scale=1.0,
                          output_type="np")
    assert len(pp.steps) == 3
    assert tuple(s.evaluations for s in pp.denoising) == evaluations
    assert tuple(len(s.passes) for s in pp.denoising) == evaluations
    assert pp.evaluations == sum(evaluations)
    assert pp.evaluations_per_step == sum(evaluations) / 3
    whole = sum(s.total.flops for s in pp.denoising)
    assert pp.per_step().flops * 3 == pytest.approx(whole)
    assert pp.components["transformer"].total.flops == sum(
        p.total.flops for s in pp.denoising for p in s.passes)
    again = type(pp).from_dict(pp.to_dict())
    assert tuple(s.evaluations for s in again.denoising) == evaluations


@pytest.mark.parametrize("columns", ["²", "٣", "12a", "-5", "0", ""])
def test_a_columns_value_that_is_not_a_width_falls_back(monkeypatch, columns):
    """COLUMNS="²" passed str.isdigit() and made int() raise in every table; any value that
    is not a plain positive number is ignored (the terminal's width, or 100)."""
    from dispatch_flops.views.table import DEFAULT_WIDTH, terminal_width

    monkeypatch.setenv("COLUMNS", columns)
    assert terminal_width() == DEFAULT_WIDTH  # stdout is captured: not a terminal
    model = torch.nn.Linear(4, 4)
    with FlopCounter(model) as fc:
        model(torch.randn(2, 4))
    assert "Linear" in fc.table()
