"""The names `--model` takes, as `scaletrain list` and the unknown-model error show them, read
from the config's model list (declared in the source, plus any a user's package registered)
without importing the models, and with them torch."""

from __future__ import annotations

from scaletrain.config import MODELS

USER_BUILDER = "module:function (your own builder)"


def variant_names(name: str, variants: tuple[str, ...] | str) -> tuple[str, ...]:
    """`name` and each `name-VARIANT` (variants in words, such as "D-K (e.g. wrn-16-10)", as written)."""
    if isinstance(variants, str):
        return name, f"{name}-{variants}"
    return name, *(f"{name}-{v}" for v in variants)


def model_names() -> tuple[str, ...]:
    """Every name `--model` takes."""
    declared = MODELS.declared.variants()
    return (*(shown for name in MODELS for shown in variant_names(name, declared.get(name, ()))), USER_BUILDER)
