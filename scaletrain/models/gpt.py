"""A small GPT-style decoder (Radford et al. 2018/2019): token and position embeddings, a stack
of one repeated pre-norm block (causal self-attention, then an MLP), a final norm and a linear
head over the vocabulary. The repeated block is what activation checkpointing checkpoints, FSDP
shards and a pipeline cuts between.

Input: token ids (N, T), int64. Output: next-token logits (N, T, vocabulary).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from scaletrain.models.builder import register_model

PRESETS = {
    "tiny": dict(dim=128, depth=4, heads=4),        # ~0.8M parameters: trains on 2 CPU cores in minutes
    "small": dict(dim=256, depth=6, heads=8),       # ~4.8M
    "medium": dict(dim=512, depth=8, heads=8),      # ~25M
    "large": dict(dim=1024, depth=16, heads=16),    # ~200M
}


class CausalSelfAttention(nn.Module):
    def __init__(self, dim: int, heads: int, dropout: float):
        super().__init__()
        if dim % heads:
            raise ValueError(f"gpt: dim {dim} is not divisible by heads {heads}")
        self.head_dim, self.dropout = dim // heads, dropout
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        qkv = self.qkv(x)
        # Each head's q, k and v lie side by side, so a column split of `qkv` over tensor-parallel
        # processes gives each one whole heads; the head count is read from what this process holds.
        heads = qkv.shape[-1] // (3 * self.head_dim)
        q, k, v = qkv.view(b, t, heads, 3, self.head_dim).permute(3, 0, 2, 1, 4)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                             dropout_p=self.dropout if self.training else 0.0)
        return self.proj(out.transpose(1, 2).reshape(b, t, heads * self.head_dim))


class GPTBlock(nn.Module):
    # Tensor parallelism (Megatron-LM): the first Linear of attention and of the MLP split by
    # output columns, the second by input rows, so each pair needs one all-reduce.
    TP_PLAN = {"attn.qkv": "colwise", "attn.proj": "rowwise", "mlp.0": "colwise", "mlp.2": "rowwise"}

    def __init__(self, dim: int, heads: int, mlp_ratio: float = 4.0, dropout: float = 0.0):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim)
        self.attn = CausalSelfAttention(dim, heads, dropout)
        self.norm2 = nn.LayerNorm(dim)
        hidden = int(dim * mlp_ratio)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim), nn.Dropout(dropout))

    def tensor_parallel_problem(self, ways: int) -> str | None:
        hidden = self.mlp[0].out_features
        if self.heads % ways or hidden % ways:
            return (f"--tensor-parallel {ways} must divide the heads ({self.heads}) and the MLP width ({hidden}) "
                    "of every block")
        return None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class GPTEmbedding(nn.Module):
    """Token plus learned position embeddings: token ids (N, T) -> the residual stream (N, T, dim)."""

    def __init__(self, vocab_size: int, context: int, dim: int):
        super().__init__()
        self.tok = nn.Embedding(vocab_size, dim)
        self.pos = nn.Parameter(torch.zeros(1, context, dim))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.tok(tokens) + self.pos[:, :tokens.shape[1]]


class GPTHead(nn.Module):
    """The final norm and the projection onto the vocabulary."""

    def __init__(self, dim: int, vocab_size: int):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.out = nn.Linear(dim, vocab_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.norm(x))


class GPT(nn.Module):
    def __init__(self, input_shape: tuple[int, ...], vocab_size: int, dim: int = 128, depth: int = 4,
                 heads: int = 4, mlp_ratio: float = 4.0, dropout: float = 0.0):
        super().__init__()
        if len(input_shape) != 1:
            raise ValueError(f"gpt needs token sequences (T,); this data set has samples of shape {input_shape}")
        self.context = input_shape[0]
        self.embed = GPTEmbedding(vocab_size, self.context, dim)
        self.blocks = nn.Sequential(*(GPTBlock(dim, heads, mlp_ratio, dropout) for _ in range(depth)))
        self.head = GPTHead(dim, vocab_size)
        self._init_weights(depth)

    def _init_weights(self, depth: int) -> None:
        # GPT-2's scheme: N(0, 0.02), and residual projections scaled by 1/sqrt(2 * depth) so the
        # residual stream's variance does not grow with depth.
        for name, p in self.named_parameters():
            if p.ndim >= 2 or name == "embed.pos":
                std = 0.02 / math.sqrt(2 * depth) if name.endswith(("proj.weight", "mlp.2.weight")) else 0.02
                nn.init.normal_(p, std=std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def pipeline_layers(self) -> list[tuple[str, nn.Module]]:
        """The forward as a sequence of named layers: what a pipeline cuts between."""
        return [("embed", self.embed), *((f"blocks.{i}", b) for i, b in enumerate(self.blocks)), ("head", self.head)]

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.embed(tokens)))


@register_model("gpt", variants=tuple(PRESETS))
def _gpt(shape, classes, variant, **options) -> nn.Module:
    return GPT(shape, classes, **{**PRESETS.get(variant, {}), **options})
