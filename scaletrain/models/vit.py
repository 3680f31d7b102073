"""Seed 004's vision transformer, sized from a tiny test model to the seed's ~1.3B parameters
(224x224 images, patch 14, width 2560, depth 16, 16 heads)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from scaletrain.models.blocks import chain
from scaletrain.models.builder import need_image, register_model

PRESETS = {
    "tiny": dict(dim=192, depth=6, heads=3),
    "small": dict(dim=384, depth=12, heads=6),
    "base": dict(dim=768, depth=12, heads=12),
    "1.3b": dict(dim=2560, depth=16, heads=16, patch_size=14),
}


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        if dim % heads:
            raise ValueError(f"vit: dim {dim} is not divisible by heads {heads}")
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        out = F.scaled_dot_product_attention(q, k, v)  # flash/memory-efficient kernels on CUDA
        return self.proj(out.transpose(1, 2).reshape(b, n, d))


class TransformerBlock(nn.Module):
    def __init__(self, dim: int, heads: int, mlp_ratio: float):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, heads)
        self.norm2 = nn.LayerNorm(dim)
        hidden = int(dim * mlp_ratio)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class PatchEmbedding(nn.Module):
    """Image -> (class token, patch tokens) + position embeddings."""

    def __init__(self, channels: int, dim: int, patch_size: int, num_patches: int):
        super().__init__()
        self.proj = nn.Conv2d(channels, dim, patch_size, stride=patch_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.randn(1, num_patches + 1, dim) * 0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.proj(x).flatten(2).transpose(1, 2)
        return torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed


class ClassTokenHead(nn.Module):
    """The final norm and the classifier on the class token."""

    def __init__(self, dim: int, num_classes: int):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.linear = nn.Linear(dim, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(self.norm(x)[:, 0])


class VisionTransformer(nn.Module):
    def __init__(self, input_shape: tuple[int, ...], num_classes: int, patch_size: int = 4, dim: int = 192,
                 depth: int = 6, heads: int = 3, mlp_ratio: float = 4.0):
        super().__init__()
        channels, height, width = input_shape
        if height % patch_size or width % patch_size:
            raise ValueError(f"vit: image {height}x{width} is not divisible by patch_size {patch_size}")
        num_patches = (height // patch_size) * (width // patch_size)
        self.embed = PatchEmbedding(channels, dim, patch_size, num_patches)
        self.blocks = nn.Sequential(*(TransformerBlock(dim, heads, mlp_ratio) for _ in range(depth)))
        self.head = ClassTokenHead(dim, num_classes)

    def pipeline_layers(self) -> list[tuple[str, nn.Module]]:
        """The forward as a sequence of named layers: what a pipeline cuts between."""
        return chain(self, "embed", "blocks", "head")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.embed(x)))


@register_model("vit", variants=tuple(PRESETS))
def _vit(shape, classes, variant, **options) -> nn.Module:
    need_image("vit", shape)
    return VisionTransformer(shape, classes, **{**PRESETS.get(variant, {}), **options})
