"""A multi-layer perceptron over the flattened input."""

from __future__ import annotations

import math

import torch
from torch import nn

from scaletrain.models.builder import register_model


class MLP(nn.Module):
    def __init__(self, input_shape: tuple[int, ...], num_classes: int, hidden: list[int] | None = None,
                 dropout: float = 0.0):
        super().__init__()
        hidden = hidden if hidden is not None else [256, 256]
        layers: list[nn.Module] = [nn.Flatten()]
        width = math.prod(input_shape)
        for h in hidden:
            layers += [nn.Linear(width, h), nn.ReLU(inplace=True)]
            if dropout:
                layers.append(nn.Dropout(dropout))
            width = h
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


@register_model("mlp")
def _mlp(shape, classes, variant, **options) -> nn.Module:
    return MLP(shape, classes, **options)
