"""The model registry: each model is one decorated builder, `@register_model(NAME)`, in the module
that defines it, found because models/registry.py imports every module of this package.

A builder takes the data's sample shape, the model's output size, the variant written after the
name (`wrn-16-10` is `wrn` with variant `16-10`; None when there is none) and the model's own
options (`[model.options]`), and returns a plain nn.Module."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import nn

from scaletrain.config import MODELS
from scaletrain.errors import ConfigError
from scaletrain.registry import Registry


@dataclass(frozen=True, slots=True)
class ModelBuilder:
    name: str
    build: Callable[..., nn.Module]
    # What may follow "NAME-": the variant names, or a pattern in words such as "D-K (e.g. 16-10)".
    variants: tuple[str, ...] | str = ()

    def check_variant(self, variant: str | None) -> None:
        if variant is not None and isinstance(self.variants, tuple) and variant not in self.variants:
            raise ConfigError(f"unknown {self.name} size '{variant}'; choose one of: {', '.join(self.variants)}")


MODEL_BUILDERS = Registry("model", "--model", choices=MODELS)


def register_model(name: str, *, variants: tuple[str, ...] | str = ()) -> Callable:
    """Decorator on a builder `(input_shape, num_classes, variant, **options) -> nn.Module`: makes
    it available as `--model NAME` (and `--model NAME-VARIANT`)."""
    def add(build: Callable) -> Callable:
        MODEL_BUILDERS.add(name, ModelBuilder(name, build, tuple(variants) if not isinstance(variants, str)
                                              else variants))
        return build
    return add


def need_image(name: str, shape: tuple[int, ...]) -> None:
    if len(shape) != 3:
        raise ConfigError(f"model '{name}' needs image samples (C, H, W); this data set has shape {shape}")
