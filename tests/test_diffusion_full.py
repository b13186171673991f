"""Full-size denoisers from their published configs, counted on the meta device (no weights,
no memory, a second or two each) through ``profile_pipeline``'s ``fn=`` loop at 1024 x 1024,
against closed forms derived here from each config.

The configs are the values of each model's Hugging Face ``config.json`` (the same numbers are
in the models' reference code): stabilityai/stable-diffusion-3-medium ``transformer/``,
black-forest-labs/FLUX.1-dev ``transformer/`` (BFL's flux-dev params: hidden 3072 = 24 heads
x 128, depth 19 + 38 single blocks, context 4096, vec 768, axes 16/56/56), and
stabilityai/stable-diffusion-xl-base-1.0 ``unet/`` (its ``attention_head_dim`` is diffusers'
name for the head count; every head is 64 wide). Keys left at diffusers' defaults are the
values those files give too.

The closed forms count multiply-accumulates: every linear layer and convolution of the
config's modules at the pipeline's shapes, and attention's ``q.k`` and ``p.v`` (``2 N^2 d``
over ``N`` tokens of width ``d``, all heads). Norms, activations, softmax, RoPE, residual adds
have flops and no MACs: they are the FLOPs' excess over ``2 x MACs``, checked to be small and
positive."""

from types import SimpleNamespace

import pytest
import torch

diffusers = pytest.importorskip(
    "diffusers", reason="diffusers not installed: pip install -e '.[diffusers]'")
from diffusers import (  # noqa: E402
    EulerDiscreteScheduler,
    FlowMatchEulerDiscreteScheduler,
    FluxTransformer2DModel,
    SD3Transformer2DModel,
    UNet2DConditionModel,
)

from dispatch_flops import Guidance, profile_pipeline  # noqa: E402

pytestmark = [pytest.mark.slow,  # full-size models: 3 to 4 s each on two CPU cores
              pytest.mark.filterwarnings("ignore::FutureWarning")]  # diffusers' deprecations

LATENT = 128  # a 1024 x 1024 image: every VAE here divides by 8
SD3_MEDIUM = dict(sample_size=128, patch_size=2, in_channels=16, out_channels=16, num_layers=24,
                  num_attention_heads=24, attention_head_dim=64, joint_attention_dim=4096,
                  caption_projection_dim=1536, pooled_projection_dim=2048,
                  pos_embed_max_size=192)
FLUX_DEV = dict(patch_size=1, in_channels=64, num_layers=19, num_single_layers=38,
                num_attention_heads=24, attention_head_dim=128, joint_attention_dim=4096,
                pooled_projection_dim=768, guidance_embeds=True, axes_dims_rope=(16, 56, 56))
SDXL_BASE = dict(sample_size=128, in_channels=4, out_channels=4, layers_per_block=2,
                 block_out_channels=(320, 640, 1280),
                 down_block_types=("DownBlock2D",) + ("CrossAttnDownBlock2D",) * 2,
                 up_block_types=("CrossAttnUpBlock2D",) * 2 + ("UpBlock2D",),
                 transformer_layers_per_block=(1, 2, 10), attention_head_dim=(5, 10, 20),
                 cross_attention_dim=2048, use_linear_projection=True,
                 addition_embed_type="text_time", addition_time_embed_dim=256,
                 projection_class_embeddings_input_dim=2816)


def sd3_macs(c: dict, latent: int, text: int) -> int:
    """SD3's MMDiT, one latent: ``T`` image patches and ``C`` text tokens, width ``d``.
    Embeddings: the patch convolution, the timestep MLP (256 -> d -> d), the pooled text MLP
    (pooled -> d -> d), the context projection (joint_attention_dim -> d). Each joint block:
    both streams' adaLN-Zero modulation (d -> 6d, per sample), q/k/v/out (4 d^2 a token) and
    4x GELU MLP (8 d^2 a token) on every token, attention over ``T + C`` tokens (2 N^2 d). The
    last block is ``context_pre_only``: the text stream's modulation is d -> 2d and it has no
    out projection or MLP. Output: adaLN-continuous (d -> 2d), projection to p^2 x out."""
    p, L = c["patch_size"], c["num_layers"]
    d = c["num_attention_heads"] * c["attention_head_dim"]
    assert c["caption_projection_dim"] == d  # both streams one width in the blocks below
    T, C = (latent // p) ** 2, text
    N = T + C
    embed = (T * d * c["in_channels"] * p * p + (256 + d + c["pooled_projection_dim"] + d) * d
             + C * c["joint_attention_dim"] * d)
    block = 2 * 6 * d * d + 12 * N * d * d + 2 * N * N * d
    last = (6 + 2) * d * d + 3 * N * d * d + 9 * T * d * d + 2 * N * N * d
    out = 2 * d * d + T * d * p * p * c["out_channels"]
    return embed + (L - 1) * block + last + out


def flux_macs(c: dict, latent: int, text: int) -> int:
    """Flux's transformer, one latent: ``T`` packed 2 x 2 patches (``in_channels`` = 16 x 4),
    ``C`` T5 tokens, width ``d``. Embeddings: the patch and context projections, the
    timestep, guidance (both 256 -> d -> d) and pooled text (pooled -> d -> d) MLPs. Each
    double-stream block: as SD3's joint block (two adaLN-Zero d -> 6d, q/k/v/out and a 4x MLP
    per stream, attention over ``N = T + C``). Each single-stream block over all ``N``
    tokens: adaLN d -> 3d, q/k/v (3 d^2) and the MLP's d -> 4d side by side, attention, and
    one output projection from the concatenated 5d back to d. Output: adaLN-continuous (d ->
    2d) and the projection back to ``in_channels``. RoPE's rotations: flops only."""
    d = c["num_attention_heads"] * c["attention_head_dim"]
    T, C = (latent // 2) ** 2, text
    N = T + C
    embed = (T * c["in_channels"] * d + 2 * (256 + d) * d + (c["pooled_projection_dim"] + d) * d
             + C * c["joint_attention_dim"] * d)
    double = 2 * 6 * d * d + 12 * N * d * d + 2 * N * N * d
    single = 3 * d * d + (3 + 4) * N * d * d + 2 * N * N * d + 5 * N * d * d
    out = 2 * d * d + T * d * c["in_channels"]
    return embed + c["num_layers"] * double + c["num_single_layers"] * single + out


def unet_macs(c: dict, latent: int, text: int) -> int:
    """A UNet2DConditionModel with linear-projection transformers, one latent, walked as
    diffusers builds it. Convolutions: conv_in/conv_out, each ResNet's two 3 x 3 (and its
    1 x 1 shortcut where channels change), each down/upsampler's 3 x 3 (at the smaller /
    larger size). Linears: the timestep MLP (c0 -> 4 c0 -> 4 c0), SDXL's added-condition MLP
    (``projection_class_embeddings_input_dim`` -> 4 c0 -> 4 c0), each ResNet's time projection
    (4 c0 -> its channels, per sample), each transformer's proj_in/proj_out (d^2 a pixel) and
    per block: self-attention's q/k/v/out (4 d^2) and 2 N^2 d, cross-attention's q/out
    (2 d^2), k/v over the text (2 x text x ctx x d) and 2 N x text x d, GEGLU's d -> 8d and
    4d -> d (12 d^2). Up blocks take the skip connections' channels in the order stored."""
    ch, n, per = c["block_out_channels"], len(c["block_out_channels"]), c["layers_per_block"]
    depth, ctx, temb = c["transformer_layers_per_block"], c["cross_attention_dim"], 4 * ch[0]

    def conv(hw: int, cin: int, cout: int, k: int = 3) -> int:
        return hw * k * k * cin * cout

    def resnet(hw: int, cin: int, cout: int) -> int:
        shortcut = conv(hw, cin, cout, 1) if cin != cout else 0
        return conv(hw, cin, cout) + temb * cout + conv(hw, cout, cout) + shortcut

    def transformer(kind: str, hw: int, d: int, layers: int) -> int:
        if not kind.startswith("CrossAttn"):
            return 0
        block = 18 * hw * d * d + 2 * hw * hw * d + 2 * text * ctx * d + 2 * hw * text * d
        return 2 * hw * d * d + layers * block

    hw = latent * latent
    total = conv(hw, c["in_channels"], ch[0]) + conv(hw, ch[0], c["out_channels"])
    total += (ch[0] + temb + c["projection_class_embeddings_input_dim"] + temb) * temb
    skips, prev = [ch[0]], ch[0]
    for i, kind in enumerate(c["down_block_types"]):
        for j in range(per):
            total += resnet(hw, prev if j == 0 else ch[i], ch[i])
            total += transformer(kind, hw, ch[i], depth[i])
            skips.append(ch[i])
        prev = ch[i]
        if i < n - 1:
            hw //= 4
            total += conv(hw, ch[i], ch[i])
            skips.append(ch[i])
    total += 2 * resnet(hw, ch[-1], ch[-1]) + transformer("CrossAttn", hw, ch[-1], depth[-1])
    for i, kind in enumerate(c["up_block_types"]):
        out = ch[n - 1 - i]
        for j in range(per + 1):
            total += resnet(hw, (prev if j == 0 else out) + skips.pop(), out)
            total += transformer(kind, hw, out, depth[n - 1 - i])
        prev = out
        if i < n - 1:
            hw *= 4
            total += conv(hw, out, out)
    assert not skips
    return total


def meta(*shape: int) -> torch.Tensor:
    return torch.empty(*shape, device="meta")


def denoise(pipe: SimpleNamespace, step, latents: torch.Tensor, steps: int, cfg: bool):
    """A pipeline's loop on meta tensors: classifier-free guidance batched, or none."""
    pipe.scheduler.set_timesteps(steps)
    for t in pipe.scheduler.timesteps:
        x = torch.cat([latents] * 2) if cfg else latents
        if hasattr(pipe.scheduler, "scale_model_input"):  # Euler's sigma scaling (SDXL)
            x = pipe.scheduler.scale_model_input(x, t)
        out = step(x, t.to("meta").expand(len(x)))
        if cfg:
            uncond, cond = out.chunk(2)
            out = uncond + 7.0 * (cond - uncond)
        latents = pipe.scheduler.step(out, t, latents).prev_sample
    return latents


def check(pp, passes: int, macs: int) -> None:
    assert pp.images == 1 and pp.profile.unsupported_ops() == {}
    for step in pp.denoising:
        assert step.batches == (passes,)
        assert step.denoiser.macs == passes * macs
        residual = step.denoiser.flops - 2 * step.denoiser.macs  # norms, activations, softmax
        assert 0 < residual < 0.01 * step.denoiser.flops


def test_sd3_medium_at_1024_matches_its_closed_form():
    with torch.device("meta"):
        pipe = SimpleNamespace(transformer=SD3Transformer2DModel(**SD3_MEDIUM))
    pipe.scheduler = FlowMatchEulerDiscreteScheduler(shift=3.0)

    def step(x, t):  # the pipeline's 333 tokens: CLIP's 77 then T5's 256
        return pipe.transformer(x, encoder_hidden_states=meta(len(x), 333, 4096),
                                pooled_projections=meta(len(x), 2048), timestep=t).sample

    pp = profile_pipeline(pipe, fn=lambda: denoise(pipe, step, meta(1, 16, LATENT, LATENT),
                                                   steps=2, cfg=True))
    assert pp.guidance == Guidance.BATCHED and len(pp.steps) == 2
    check(pp, 2, sd3_macs(SD3_MEDIUM, LATENT, 333))
    assert round(sd3_macs(SD3_MEDIUM, LATENT, 333) / 1e12, 2) == 4.45  # per image per pass


def test_flux_dev_at_1024_matches_its_closed_form():
    with torch.device("meta"):
        pipe = SimpleNamespace(transformer=FluxTransformer2DModel(**FLUX_DEV))
    pipe.scheduler = FlowMatchEulerDiscreteScheduler(shift=3.0)
    patches = (LATENT // 2) ** 2

    def step(x, t):  # guidance-distilled: one pass, the scale an input; 512 T5 tokens
        return pipe.transformer(x, encoder_hidden_states=meta(1, 512, 4096),
                                pooled_projections=meta(1, 768), timestep=t, guidance=t,
                                img_ids=meta(patches, 3), txt_ids=meta(512, 3)).sample

    pp = profile_pipeline(pipe, fn=lambda: denoise(pipe, step, meta(1, patches, 64), steps=1,
                                                   cfg=False))
    assert pp.guidance == Guidance.NONE and len(pp.steps) == 1
    check(pp, 1, flux_macs(FLUX_DEV, LATENT, 512))
    assert round(flux_macs(FLUX_DEV, LATENT, 512) / 1e12, 2) == 37.19


def test_sdxl_unet_at_1024_matches_its_closed_form():
    with torch.device("meta"):
        pipe = SimpleNamespace(unet=UNet2DConditionModel(**SDXL_BASE))
    pipe.scheduler = EulerDiscreteScheduler()  # on the CPU: it keeps its sigmas there
    assert sum(p.numel() for p in pipe.unet.parameters()) == 2_567_463_684  # "2.6B"

    def step(x, t):  # CLIP-L and OpenCLIP-bigG side by side (768 + 1280), 77 tokens
        return pipe.unet(x, t, encoder_hidden_states=meta(len(x), 77, 2048),
                         added_cond_kwargs=dict(text_embeds=meta(len(x), 1280),
                                                time_ids=meta(len(x), 6))).sample

    pp = profile_pipeline(pipe, fn=lambda: denoise(pipe, step, meta(1, 4, LATENT, LATENT),
                                                   steps=1, cfg=True))
    assert pp.guidance == Guidance.BATCHED
    check(pp, 2, unet_macs(SDXL_BASE, LATENT, 77))
    assert round(unet_macs(SDXL_BASE, LATENT, 77) / 1e12, 2) == 3.38
