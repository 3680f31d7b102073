"""Models by name: each module of this package registers its builders (`@register_model`,
builder.py) and is imported when a name it declares is asked for (registry.py), so a new model
is one decorated builder in one new file. A
user's own builder is named `package.module:function` and takes the same arguments as ours but
the variant: `f(input_shape, num_classes, **options) -> nn.Module`; a Lightning LightningModule
class named so is built with the options alone. Built as the user wrote it: what trains it as ours
(a LightningModule through adapters/) is the training's to apply (`adapted`), not the registry's.
"""

from __future__ import annotations

from torch import nn

from scaletrain.errors import ConfigError, first_line
from scaletrain.models.builder import MODEL_BUILDERS
from scaletrain.models.names import model_names
from scaletrain.user_code.importing import import_function
from scaletrain.user_code.lightning import names_lightning_module


def build_model(name: str, input_shape: tuple[int, ...], num_classes: int, **options) -> nn.Module:
    try:
        return _build(name, tuple(input_shape), num_classes, options)
    except TypeError as exc:  # an option the builder does not take
        raise ConfigError(f"model '{name}': bad model.options ({first_line(exc)})") from None
    except ValueError as exc:
        raise ConfigError(first_line(exc, limit=400)) from None
    except RuntimeError as exc:   # torch refused a size an option gave (a negative width): its first line only
        if ":" in name:
            raise                 # the user's builder: theirs to see (user_code/failures.py)
        raise ConfigError(f"model '{name}': model.options {options} cannot build it ({first_line(exc)})") from None


def _build(name: str, shape: tuple[int, ...], classes: int, options: dict) -> nn.Module:
    if ":" in name:  # a user's builder: f(input_shape, num_classes, **options) -> nn.Module
        builder = import_function(name, "model")
        # A LightningModule class is built with its own arguments only.
        model = builder(**options) if names_lightning_module(name) else builder(shape, classes, **options)
        if not isinstance(model, nn.Module):
            raise ConfigError(f"model '{name}' returned {type(model).__name__}, not a torch.nn.Module")
        return model
    family, _, variant = (name, "", "") if name in MODEL_BUILDERS else name.partition("-")
    if family not in MODEL_BUILDERS:
        raise ConfigError(f"unknown model '{name}'; choose one of: {', '.join(model_names())}")
    builder = MODEL_BUILDERS[family]
    if variant and not builder.variants:
        raise ConfigError(f"unknown model '{name}': '{family}' has no variants; use --model {family}")
    builder.check_variant(variant or None)
    return builder.build(shape, classes, variant or None, **options)
