"""Convolutional models: the MNIST-1D CNN, seed 003's WideResNet and a small ResNet.

Plain nn.Modules: they know nothing about precision, compilation or distribution.
"""

from __future__ import annotations

import re

import torch
from torch import nn

from scaletrain.errors import ConfigError
from scaletrain.models.blocks import chain
from scaletrain.models.builder import need_image, register_model


class FeaturesThenHead(nn.Module):
    """A network whose forward is `head(features(x))`, both nn.Sequential: its pipeline layers are
    their children in order (models/blocks.py's chain)."""

    features: nn.Sequential
    head: nn.Sequential

    def pipeline_layers(self) -> list[tuple[str, nn.Module]]:
        """The forward as a sequence of named layers: what a pipeline cuts between."""
        return chain(self, "features", "head")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


class CNN1d(FeaturesThenHead):
    """A 1-D CNN for MNIST-1D (length-40 sequences). The paper's 3-layer CNN reaches 94 %;
    this one adds BatchNorm and width so it gets there in a few hundred steps on a CPU."""

    def __init__(self, in_channels: int, num_classes: int, length: int, channels: int = 64):
        super().__init__()
        c = channels

        def block(cin, cout, stride):
            return nn.Sequential(nn.Conv1d(cin, cout, 3, stride=stride, padding=1, bias=False),
                                 nn.BatchNorm1d(cout), nn.GELU())

        self.features = nn.Sequential(block(in_channels, c, 1), block(c, c, 1), block(c, 2 * c, 2),
                                      block(2 * c, 2 * c, 1), block(2 * c, 4 * c, 2))
        out_len = (length + 3) // 4
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(4 * c * out_len, num_classes))


def conv_bn_relu(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(inplace=True))


class WideBlock(nn.Module):
    """Seed 003's conv_block: [1x1 projection] + (cbr, dropout, cbr), summed."""

    def __init__(self, cin: int, cout: int, dropout: float):
        super().__init__()
        self.shortcut = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()
        self.body = nn.Sequential(conv_bn_relu(cin, cout), nn.Dropout(dropout), conv_bn_relu(cout, cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.shortcut(x) + self.body(x)


class WideResNet(FeaturesThenHead):
    """WideResNet-depth-width as seed 003's lab builds it (after keras_contrib): a 16-channel stem,
    three stages of (depth - 4) / 6 blocks with 16k, 32k, 64k channels and max-pooling between
    stages, global average pooling and a linear classifier. wrn-16-10 on 28x28x1 is the lab's model."""

    def __init__(self, in_channels: int, num_classes: int, depth: int = 16, width: int = 10,
                 dropout: float = 0.01):
        super().__init__()
        if (depth - 4) % 6:
            raise ValueError(f"WideResNet depth must be 6n+4 (10, 16, 22, 28, ...), got {depth}")
        n = (depth - 4) // 6
        layers: list[nn.Module] = [conv_bn_relu(in_channels, 16)]
        cin = 16
        for stage, cout in enumerate((16 * width, 32 * width, 64 * width)):
            if stage:
                layers.append(nn.MaxPool2d(2))
            for _ in range(n):
                layers.append(WideBlock(cin, cout, dropout))
                cin = cout
        self.features = nn.Sequential(*layers)
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, num_classes))


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class ResNet(FeaturesThenHead):
    """A CIFAR-style ResNet (3x3 stem, no initial pooling); `blocks=[2,2,2,2]` with widths
    64..512 is ResNet-18. The default is a small three-stage net for quick runs."""

    def __init__(self, in_channels: int, num_classes: int, widths: list[int] | None = None,
                 blocks: list[int] | None = None):
        super().__init__()
        widths = widths or [32, 64, 128]
        blocks = blocks or [1] * len(widths)
        if len(widths) != len(blocks):
            raise ValueError("resnet: widths and blocks must have the same length")
        layers: list[nn.Module] = [nn.Conv2d(in_channels, widths[0], 3, padding=1, bias=False),
                                   nn.BatchNorm2d(widths[0]), nn.ReLU(inplace=True)]
        cin = widths[0]
        for stage, (cout, count) in enumerate(zip(widths, blocks, strict=True)):
            for i in range(count):
                layers.append(BasicBlock(cin, cout, stride=2 if stage and i == 0 else 1))
                cin = cout
        self.features = nn.Sequential(*layers)
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, num_classes))


@register_model("cnn1d")
def _cnn1d(shape, classes, variant, **options) -> nn.Module:
    if len(shape) != 2:
        raise ConfigError(f"model 'cnn1d' needs sequence samples (C, L); this data set has shape {shape}")
    return CNN1d(shape[0], classes, length=shape[1], **options)


# resnet-18 is the standard ImageNet widths and depths; plain resnet is the small default.
RESNET_SIZES = {"18": {"widths": [64, 128, 256, 512], "blocks": [2, 2, 2, 2]}}


@register_model("resnet", variants=tuple(RESNET_SIZES))
def _resnet(shape, classes, variant, **options) -> nn.Module:
    need_image("resnet", shape)
    return ResNet(shape[0], classes, **{**RESNET_SIZES.get(variant, {}), **options})


@register_model("wrn", variants="D-K (e.g. wrn-16-10)")
def _wrn(shape, classes, variant, **options) -> nn.Module:
    need_image("wrn", shape)
    if variant is not None:
        match = re.fullmatch(r"(\d+)-(\d+)", variant)
        if not match:
            raise ConfigError(f"model 'wrn-{variant}': write the depth and width as wrn-D-K, e.g. wrn-16-10")
        options = {"depth": int(match.group(1)), "width": int(match.group(2)), **options}
    return WideResNet(shape[0], classes, **options)
