"""Models by name: `cnn1d`, `mlp`, `resnet`, `resnet-18`, `wrn`, `wrn-D-K`, `vit`, `vit-PRESET`,
`gpt`, `gpt-PRESET` (a decoder for the language-model task),
or a user's own builder as `package.module:function`.

Every builder takes the data's sample shape and class count, plus the model's own options
(from `[model.options]` in a config), and returns a plain nn.Module.
"""

from __future__ import annotations

import importlib
import re

from torch import nn

from scaletrain.errors import ConfigError
from scaletrain.models.convnets import CNN1d, ResNet, WideResNet
from scaletrain.models.gpt import GPT, PRESETS as GPT_PRESETS
from scaletrain.models.mlp import MLP
from scaletrain.models.vit import PRESETS, VisionTransformer

MODEL_NAMES = ("cnn1d", "mlp", "resnet", "resnet-18", "wrn", "wrn-D-K (e.g. wrn-16-10)", "vit",
               *(f"vit-{p}" for p in PRESETS), "gpt", *(f"gpt-{p}" for p in GPT_PRESETS),
               "module:function (your own builder)")


def _import_builder(name: str):
    module_name, _, attr = name.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"model '{name}': cannot import module '{module_name}' ({exc}); "
                          "is it on PYTHONPATH?") from None
    builder = getattr(module, attr, None)
    if not callable(builder):
        raise ConfigError(f"model '{name}': module '{module_name}' has no function '{attr}'")
    return builder


def _need_image(name: str, shape: tuple[int, ...]) -> None:
    if len(shape) != 3:
        raise ConfigError(f"model '{name}' needs image samples (C, H, W); this data set has shape {shape}")


def build_model(name: str, input_shape: tuple[int, ...], num_classes: int, **options) -> nn.Module:
    try:
        return _build(name, tuple(input_shape), num_classes, options)
    except TypeError as exc:  # an option the builder does not take
        raise ConfigError(f"model '{name}': bad model.options ({exc})") from None
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _build(name: str, shape: tuple[int, ...], classes: int, options: dict) -> nn.Module:
    if ":" in name:  # a user's builder: f(input_shape, num_classes, **options) -> nn.Module
        model = _import_builder(name)(shape, classes, **options)
        if not isinstance(model, nn.Module):
            raise ConfigError(f"model '{name}' returned {type(model).__name__}, not a torch.nn.Module")
        return model
    if name == "cnn1d":
        if len(shape) != 2:
            raise ConfigError(f"model 'cnn1d' needs sequence samples (C, L); this data set has shape {shape}")
        return CNN1d(shape[0], classes, length=shape[1], **options)
    if name == "mlp":
        return MLP(shape, classes, **options)
    if name in ("resnet", "resnet-18"):
        _need_image(name, shape)
        if name == "resnet-18":
            options = {"widths": [64, 128, 256, 512], "blocks": [2, 2, 2, 2], **options}
        return ResNet(shape[0], classes, **options)
    match = re.fullmatch(r"wrn(?:-(\d+)-(\d+))?", name)
    if match:
        _need_image(name, shape)
        if match.group(1):
            options = {"depth": int(match.group(1)), "width": int(match.group(2)), **options}
        return WideResNet(shape[0], classes, **options)
    match = re.fullmatch(r"vit(?:-(.+))?", name)
    if match:
        _need_image(name, shape)
        preset = match.group(1)
        if preset and preset not in PRESETS:
            raise ConfigError(f"unknown vit size '{preset}'; choose one of: {', '.join(PRESETS)}")
        return VisionTransformer(shape, classes, **{**PRESETS.get(preset, {}), **options})
    match = re.fullmatch(r"gpt(?:-(.+))?", name)
    if match:
        preset = match.group(1)
        if preset and preset not in GPT_PRESETS:
            raise ConfigError(f"unknown gpt size '{preset}'; choose one of: {', '.join(GPT_PRESETS)}")
        return GPT(shape, classes, **{**GPT_PRESETS.get(preset, {}), **options})
    raise ConfigError(f"unknown model '{name}'; choose one of: {', '.join(MODEL_NAMES)}")
