"""profile_pipeline: real diffusers pipelines, built from tiny configs (no downloads: the
tokenizer is a CLIPTokenizer made from a vocabulary written here), cut into components and
denoising steps.

Oracles: each denoiser pass equals a standalone count of the denoiser on the inputs that pass
was given (captured by a hook); the parts add up to the whole run exactly; guidance's doubled
batch doubles the denoiser's flops and MACs exactly, and two separate passes cost what one
doubled pass does; DiT's MACs equal a closed form from its config, on the meta device at its
published size (DiT-XL/2)."""

from types import SimpleNamespace

import pytest
import torch
from torch.nn.modules.module import _global_forward_hooks, _global_forward_pre_hooks

diffusers = pytest.importorskip(
    "diffusers", reason="diffusers not installed: pip install -e '.[diffusers]'")
transformers = pytest.importorskip("transformers")
from diffusers import (  # noqa: E402
    AutoencoderKL,
    DDIMScheduler,
    DiTPipeline,
    DiTTransformer2DModel,
    StableDiffusionImg2ImgPipeline,
    StableDiffusionPipeline,
    UNet2DConditionModel,
)
from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer  # noqa: E402

from dispatch_flops import (  # noqa: E402
    DEVICES,
    FlopCounter,
    Guidance,
    Stats,
    profile_pipeline,
)

BATCHED, NONE, SEPARATE = Guidance.BATCHED, Guidance.NONE, Guidance.SEPARATE

pytestmark = [pytest.mark.slow,  # diffusers pipelines, several denoising steps each
              pytest.mark.filterwarnings("ignore::FutureWarning")]  # diffusers' deprecations

TEXT = 8  # tokens per prompt, the text encoder's hidden size, the UNet's cross-attention
SIZE = 16  # pixels; latents are 8 x 8 (the VAE halves them once)
SD_CALL = dict(height=SIZE, width=SIZE, num_inference_steps=3, output_type="pt")


def clip_tokenizer() -> CLIPTokenizer:
    """A CLIP BPE tokenizer over single letters, built in code (no vocabulary file)."""
    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1}
    for c in "abcdefghijklmnopqrstuvwxyz":
        vocab[c] = len(vocab)
        vocab[c + "</w>"] = len(vocab)
    return CLIPTokenizer(vocab=vocab, merges=[], model_max_length=TEXT)


def tiny_vae() -> AutoencoderKL:
    return AutoencoderKL(block_out_channels=[4, 8], in_channels=3, out_channels=3,
                         down_block_types=["DownEncoderBlock2D"] * 2,
                         up_block_types=["UpDecoderBlock2D"] * 2, latent_channels=4,
                         norm_num_groups=2).eval()


@pytest.fixture(scope="module")
def sd_parts() -> dict:
    torch.manual_seed(0)
    unet = UNet2DConditionModel(
        block_out_channels=(4, 8), layers_per_block=1, sample_size=SIZE // 2, in_channels=4,
        out_channels=4, down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"), cross_attention_dim=TEXT,
        norm_num_groups=2).eval()
    text_encoder = CLIPTextModel(CLIPTextConfig(
        bos_token_id=0, eos_token_id=1, pad_token_id=1, hidden_size=TEXT, intermediate_size=16,
        num_attention_heads=2, num_hidden_layers=2, vocab_size=60,
        max_position_embeddings=TEXT)).eval()
    scheduler = DDIMScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
                              clip_sample=False, set_alpha_to_one=False, steps_offset=1)
    return dict(unet=unet, vae=tiny_vae(), text_encoder=text_encoder,
                tokenizer=clip_tokenizer(), scheduler=scheduler, safety_checker=None,
                feature_extractor=None, image_encoder=None, requires_safety_checker=False)


def pipeline(cls, parts):
    pipe = cls(**parts)
    pipe.set_progress_bar_config(disable=True)
    return pipe


@pytest.fixture(scope="module")
def sd(sd_parts):
    return pipeline(StableDiffusionPipeline, sd_parts)


class Passes:
    """Every call of ``module``'s forward: its arguments as given (references: a copy made
    here would run ops inside the counted pass; the pipelines make new latents each step)."""

    def __init__(self, module):
        self.module, self.calls = module, []

    def __enter__(self):
        self.handle = self.module.register_forward_pre_hook(self._note, with_kwargs=True)
        return self

    def __exit__(self, *exc):
        self.handle.remove()

    def _note(self, module, args, kwargs):
        self.calls.append((args, dict(kwargs)))

    def standalone(self, i: int) -> Stats:
        """Call ``i`` again, alone, under its own counter."""
        args, kwargs = self.calls[i]
        with torch.no_grad(), FlopCounter(self.module) as fc:
            self.module(*args, **kwargs)
        return fc.total


def total(stats) -> Stats:
    out = Stats()
    for s in stats:
        out = out + s
    return out


def batch_scaled(p) -> tuple:
    """A UNet pass's MACs, and its flops but the sinusoidal timestep embedding's: that
    computes its frequency table once per call, whatever the batch; the rest scales with it."""
    once = p.by_module()["unet.time_proj"].inclusive.flops
    return p.total.macs, p.total.flops - once


@pytest.fixture(scope="module")
def guided(sd):
    with Passes(sd.unet) as passes:
        pp = profile_pipeline(sd, "a cat", guidance_scale=5.0, **SD_CALL)
    return pp, passes


@pytest.fixture(scope="module")
def unguided(sd):
    return profile_pipeline(sd, "a cat", guidance_scale=1.0, **SD_CALL)


def test_each_step_is_the_denoiser_counted_alone(guided):
    pp, passes = guided
    assert len(pp.steps) == SD_CALL["num_inference_steps"] == len(passes.calls)
    for i, step in enumerate(pp.denoising):
        assert step.step == i and step.denoisers == ("unet",)
        assert step.batches == (2,) and step.guidance == BATCHED
        assert step.passes[0].total == passes.standalone(i)
    timesteps = [s.timestep for s in pp.denoising]
    assert timesteps == sorted(timesteps, reverse=True) and len(set(timesteps)) == 3


def test_guidance_between_passes_and_scheduler(guided):
    """What a step runs besides its pass and the scheduler's update is the guidance that
    combines the two halves, ``uncond + scale * (text - uncond)``: three flops per latent."""
    pp, _ = guided
    latents = 1 * 4 * (SIZE // 2) ** 2
    for step in pp.denoising:
        rest = step.total.flops - step.passes[0].total.flops - step.scheduler.total.flops
        assert rest == 3 * latents


def test_the_whole_is_the_sum_of_its_parts(guided):
    pp, _ = guided
    assert list(pp.components) == ["text_encoder", "unet", "vae.decode"]
    parts = [pp.components["text_encoder"].total, pp.components["vae.decode"].total,
             pp.outside.total] + [s.total for s in pp.steps]
    assert total(parts) == pp.total
    assert pp.components["unet"].total == total(p.total for s in pp.denoising
                                                for p in s.passes)


def test_guidance_doubles_what_it_should(guided, unguided):
    pp, _ = guided
    assert unguided.guidance == NONE and pp.guidance == BATCHED
    assert unguided.evaluations_per_image == 1 and pp.evaluations_per_image == 2
    for with_, without in zip(pp.denoising, unguided.denoising):
        assert without.batches == (1,)
        macs, flops = batch_scaled(without.passes[0])
        assert batch_scaled(with_.passes[0]) == (2 * macs, 2 * flops)
    # the negative prompt is encoded too: the text encoder runs twice
    text, text_alone = pp.components["text_encoder"], unguided.components["text_encoder"]
    assert text.by_module()["text_encoder"].calls == 2
    assert text_alone.by_module()["text_encoder"].calls == 1
    assert text.total.flops == 2 * text_alone.total.flops
    assert pp.components["vae.decode"].total == unguided.components["vae.decode"].total


def test_per_image_and_per_step(sd, unguided):
    pp = profile_pipeline(sd, ["a cat", "a dog"], num_images_per_prompt=2,
                          guidance_scale=1.0, **SD_CALL)
    assert pp.images == 4 and pp.denoising[0].batches == (4,)
    assert pp.per_image().flops == pp.total.flops / 4
    assert pp.components["vae.decode"].total.macs == \
        4 * unguided.components["vae.decode"].total.macs
    assert pp.per_step().flops == sum(s.total.flops for s in pp.steps) / 3


def test_a_loop_with_two_passes_per_step(sd, guided):
    """A custom loop (no scheduler): steps cut where the timestep changes; two separate
    passes cost what one pass over both halves does."""
    pp_batched, _ = guided
    embeds = torch.randn(1, TEXT, TEXT)

    def loop(latents, timesteps):
        for t in timesteps:
            uncond = sd.unet(latents, t, encoder_hidden_states=torch.zeros_like(embeds)).sample
            cond = sd.unet(latents, t, encoder_hidden_states=embeds).sample
            latents = latents - 0.1 * (uncond + 5.0 * (cond - uncond))
        return latents

    with torch.no_grad():
        pp = profile_pipeline(sd, torch.randn(1, 4, SIZE // 2, SIZE // 2),
                              torch.tensor([900, 500, 100]), fn=loop)
    assert len(pp.steps) == 3 and pp.guidance == SEPARATE
    assert [s.timestep for s in pp.denoising] == [900.0, 500.0, 100.0]
    for step, batched in zip(pp.denoising, pp_batched.denoising):
        assert step.batches == (1, 1) and step.scheduler is None
        halves = [batch_scaled(p) for p in step.passes]
        assert tuple(map(sum, zip(*halves))) == batch_scaled(batched.passes[0])


def test_image_to_image_encodes_the_image(sd_parts):
    pipe = pipeline(StableDiffusionImg2ImgPipeline, sd_parts)
    image = torch.rand(1, 3, SIZE, SIZE)
    with Passes(pipe.unet) as passes:
        pp = profile_pipeline(pipe, "a cat", image=image, strength=0.5, guidance_scale=5.0,
                              num_inference_steps=4, output_type="pt")
    assert list(pp.components) == ["text_encoder", "vae.encode", "unet", "vae.decode"]
    assert len(pp.steps) == 2  # strength 0.5 of 4 steps
    assert [s.passes[0].total for s in pp.denoising] == [passes.standalone(i)
                                                        for i in range(2)]


# DiT (Peebles & Xie): class-conditional, adaLN-Zero blocks, no text encoder
DIT = dict(num_layers=2, patch_size=4, attention_head_dim=8, num_attention_heads=2,
           in_channels=4, out_channels=8, attention_bias=True, activation_fn="gelu-approximate",
           num_embeds_ada_norm=1000, norm_type="ada_norm_zero", norm_elementwise_affine=False)
DIT_XL_2 = dict(DIT, num_layers=28, patch_size=2, attention_head_dim=72, num_attention_heads=16,
                sample_size=32)  # facebook/DiT-XL-2-256's transformer config


def dit_macs(c: dict, batch: int) -> int:
    """A DiT forward's multiply-accumulates over ``batch`` latents: ``T`` patches of width
    ``d``. Included: the patch embedding (a convolution), per block its adaLN-Zero
    conditioning (timestep MLP 256 -> d -> d and the d -> 6d modulation, per sample), q, k,
    v and out projections (4 d^2 per patch), attention (q.k and p.v: 2 T^2 d) and the 4x MLP
    (8 d^2 per patch); the output's conditioning (the timestep MLP again, d -> 2d) and
    projection to p^2 x out_channels per patch. Norms, activations, softmax: flops, no MACs."""
    L, p = c["num_layers"], c["patch_size"]
    d = c["num_attention_heads"] * c["attention_head_dim"]
    T = (c["sample_size"] // p) ** 2
    block = 256 * d + 7 * d * d + 12 * T * d * d + 2 * T * T * d
    return batch * (T * d * c["in_channels"] * p * p + L * block + 256 * d + 3 * d * d
                    + T * d * p * p * c["out_channels"])


def test_dit_pipeline_batches_guidance():
    torch.manual_seed(0)
    config = dict(DIT, sample_size=8)
    pipe = DiTPipeline(transformer=DiTTransformer2DModel(**config).eval(), vae=tiny_vae(),
                       scheduler=DDIMScheduler())
    pipe.set_progress_bar_config(disable=True)
    with Passes(pipe.transformer) as passes:
        pp = profile_pipeline(pipe, class_labels=[1, 2], num_inference_steps=2,
                              guidance_scale=4.0, output_type="np")
    assert pp.images == 2 and pp.guidance == BATCHED
    assert list(pp.components) == ["transformer", "vae.decode"]
    for i, step in enumerate(pp.denoising):
        assert step.batches == (4,)
        assert step.passes[0].total == passes.standalone(i)
        assert step.denoiser.macs == dit_macs(config, 4)


def test_timing_measures_each_part():
    torch.manual_seed(0)
    pipe = DiTPipeline(transformer=DiTTransformer2DModel(**DIT, sample_size=8).eval(),
                       vae=tiny_vae(), scheduler=DDIMScheduler())
    pipe.set_progress_bar_config(disable=True)
    pp = profile_pipeline(pipe, class_labels=[3], num_inference_steps=2, output_type="np",
                          timing=True)
    for step in pp.denoising:
        assert step.profile.wall_s >= step.passes[0].wall_s + step.scheduler.wall_s > 0
    assert pp.profile.wall_s >= sum(s.wall_s for s in pp.steps) + \
        pp.components["vae.decode"].wall_s
    roof = pp.roofline("H100-SXM")
    assert roof.measured_step_s == pytest.approx(sum(s.wall_s for s in pp.steps) / 2)
    assert "Time" in pp.table() and "Measured" in roof.table()


def test_dit_xl_on_meta_matches_its_closed_form():
    """DiT-XL/2 at 256 x 256 from its published config, on the meta device: no weights, no
    memory; a loop through ``fn`` (a pipeline's post-processing reads pixels)."""
    with torch.device("meta"):
        pipe = SimpleNamespace(transformer=DiTTransformer2DModel(**DIT_XL_2),
                               scheduler=DDIMScheduler())
    steps, labels = 4, [207, 360]

    def sample(labels, steps, guidance_scale=4.0):
        b = len(labels)
        latents = torch.empty(b, 4, 32, 32, device="meta")
        classes = torch.tensor(labels + [1000] * b, device="meta")  # 1000: no class
        pipe.scheduler.set_timesteps(steps)
        for t in pipe.scheduler.timesteps:
            eps = pipe.transformer(torch.cat([latents] * 2), timestep=t.to("meta").expand(2 * b),
                                   class_labels=classes).sample[:, :4]
            cond, uncond = eps.chunk(2)
            latents = pipe.scheduler.step(uncond + guidance_scale * (cond - uncond), t,
                                          latents).prev_sample
        return latents

    pp = profile_pipeline(pipe, labels, steps, fn=sample)
    assert pp.images == 2 and len(pp.steps) == steps and pp.guidance == BATCHED
    for step in pp.denoising:
        assert step.denoiser.macs == dit_macs(DIT_XL_2, 4)
    # 118.6 G (the paper's Gflops, which count multiply-adds) per image per pass
    assert round(dit_macs(DIT_XL_2, 1) / 1e9, 1) == 118.7


def test_roofline_per_step(guided):
    pp, _ = guided
    roof = pp.roofline("H100-SXM")
    assert len(roof.steps) == len(pp.steps)
    for r in roof.steps:
        assert max(r.compute_s, r.memory_s) <= r.attainable_s * (1 + 1e-12)
        assert r.attainable_s <= (r.compute_s + r.memory_s) * (1 + 1e-12)
    assert roof.step_s == pytest.approx(sum(r.attainable_s for r in roof.steps) / 3)
    parts = sum(r.attainable_s for r in roof.components.values()) + sum(
        r.attainable_s for r in roof.steps)
    assert roof.image_s >= parts / pp.images * (1 - 1e-12)
    assert pp.roofline(DEVICES["H100-SXM"]).image_s == roof.image_s
    with pytest.raises(ValueError, match="H100-SXM"):
        pp.roofline("H100")


def test_table_and_json(guided, tmp_path):
    pp, _ = guided
    text = pp.table()
    for label in ("text_encoder", "step 1", "vae.decode", "outside", "per image",
                  "batched"):
        assert label in text, text
    assert str(pp) == text
    path = tmp_path / "pipeline.json"
    pp.to_json(path)
    back = type(pp).from_json(path)
    assert back.total == pp.total and back.images == pp.images
    assert [s.total for s in back.steps] == [s.total for s in pp.steps]
    assert {n: p.total for n, p in back.components.items()} == {
        n: p.total for n, p in pp.components.items()}
    assert back.denoising[1].timestep == pp.denoising[1].timestep


def test_pipeline_plot(guided):
    pytest.importorskip("matplotlib")
    from dispatch_flops import plot

    pp, _ = guided
    fig = plot.pipeline(pp, metrics=("flops", "macs", "bytes"))
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert labels == ["text_encoder", "step 1", "step 2", "step 3", "vae.decode", "outside"]
    bars = {round(b.get_width()) for b in fig.axes[0].patches if b.get_y() < 4}
    assert pp.denoising[0].denoiser.flops in bars
    with pytest.raises(ValueError, match="metric must be one of"):
        plot.pipeline(pp, metrics=("watts",))


def test_user_state_left_as_found(sd):
    pre, post = len(_global_forward_pre_hooks), len(_global_forward_hooks)
    with pytest.raises(RuntimeError, match="boom"):
        profile_pipeline(sd, fn=lambda: (sd.vae.decode(torch.randn(1, 4, 8, 8)),
                                         (_ for _ in ()).throw(RuntimeError("boom"))))
    assert "step" not in vars(sd.scheduler) and "decode" not in vars(sd.vae)
    assert "encode" not in vars(sd.vae)
    assert (len(_global_forward_pre_hooks), len(_global_forward_hooks)) == (pre, post)
