"""Diffusion models' networks from Hugging Face diffusers, as a user brings them: exported, compiled
untuned, checked against ONNX Runtime, timed. The same rows as `bench.torchvision_sweep`.

    pip install --no-deps diffusers     # not a dependency of tuner
    python -m bench.diffusers_sweep [--models unet2d,sd_unet,vae_decoder,vae_encoder] [--threads 1] [--rounds 5]

Each network is built from a config with random weights (no download) and exported by
`torch.onnx.export` (opset 17, batch 1), a denoiser with its timestep as a float input:
- unet2d: DDPM's pixel-space UNet (64 x 64 RGB; residual blocks with GroupNorm and SiLU, self-attention
  at 16 x 16, the timestep's sinusoidal embedding);
- sd_unet: a Stable Diffusion UNet at reduced widths (4 x 32 x 32 latents; cross-attention over 77
  text tokens of 768, GEGLU feed-forwards, linear projections in and out);
- vae_decoder, vae_encoder: Stable Diffusion's KL autoencoder at reduced widths (4 x 32 x 32 latents,
  256 x 256 images; a mid-block attention over every pixel of the latent).
"""
from __future__ import annotations

from pathlib import Path

from bench.torchvision_sweep import _torchvision, export_net, sweep_cli

DEFAULT = "unet2d,sd_unet,vae_decoder,vae_encoder"
TOKENS, TEXT = 77, 768


def _nets(torch, diffusers):
    """name -> (network, its inputs' shapes, its inputs' names); forward takes the inputs in order."""
    nn = torch.nn

    class Denoiser(nn.Module):
        def __init__(self, unet, text: bool):
            super().__init__()
            self.unet, self.text = unet, text

        def forward(self, sample, t, *context):
            out = self.unet(sample, t, *context) if self.text else self.unet(sample, t)
            return out.sample

    class Decoder(nn.Module):
        def __init__(self, vae):
            super().__init__()
            self.vae = vae

        def forward(self, z):
            return self.vae.decode(z).sample

    class Encoder(nn.Module):
        def __init__(self, vae):
            super().__init__()
            self.vae = vae

        def forward(self, x):
            return self.vae.encode(x).latent_dist.mean

    def vae():
        return diffusers.AutoencoderKL(in_channels=3, out_channels=3, latent_channels=4, layers_per_block=2,
                                       block_out_channels=(64, 128, 256, 256),
                                       down_block_types=("DownEncoderBlock2D",) * 4,
                                       up_block_types=("UpDecoderBlock2D",) * 4)
    return {
        "unet2d": lambda: (Denoiser(diffusers.UNet2DModel(
            sample_size=64, in_channels=3, out_channels=3, layers_per_block=2, block_out_channels=(64, 128, 128, 256),
            down_block_types=("DownBlock2D", "DownBlock2D", "AttnDownBlock2D", "DownBlock2D"),
            up_block_types=("UpBlock2D", "AttnUpBlock2D", "UpBlock2D", "UpBlock2D")), False),
            [(1, 3, 64, 64), (1,)], ["sample", "timestep"]),
        "sd_unet": lambda: (Denoiser(diffusers.UNet2DConditionModel(
            sample_size=32, in_channels=4, out_channels=4, layers_per_block=1, block_out_channels=(128, 256, 256),
            down_block_types=("CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"),
            up_block_types=("UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"),
            cross_attention_dim=TEXT, attention_head_dim=8), True),
            [(1, 4, 32, 32), (1,), (1, TOKENS, TEXT)], ["sample", "timestep", "encoder_hidden_states"]),
        "vae_decoder": lambda: (Decoder(vae()), [(1, 4, 32, 32)], ["latent"]),
        "vae_encoder": lambda: (Encoder(vae()), [(1, 3, 256, 256)], ["image"]),
    }


def export(name: str, path: Path, seed: int = 0, dynamo: bool = False) -> Path:
    torch, _ = _torchvision()         # diffusers imports transformers, which imports torchvision
    import diffusers
    nets = _nets(torch, diffusers)
    if name not in nets:
        raise ValueError(f"unknown model {name!r}; choose from {', '.join(nets)}")
    torch.manual_seed(seed)
    net, shapes, names = nets[name]()
    inputs = {n: torch.full(s, 500.0) if n == "timestep" else torch.randn(*s) for s, n in zip(shapes, names)}
    return export_net(torch, net, None, path, dynamo, inputs)


def main(argv=None) -> int:
    return sweep_cli("diffusers", __doc__, DEFAULT, argv, lambda ap: None, lambda args: ({"export": export}, {}))


if __name__ == "__main__":
    raise SystemExit(main())
