"""Adapters: a model written for another framework, trained by scaletrain as it is.

`adapted(model)` is the one place a foreign model is adapted: a Lightning `LightningModule`
(recognised by user_code/lightning.py, by class names only, so nothing imports Lightning unless a
LightningModule is given) becomes a plain `nn.Module` (adapters/lightning.py) that brings its own
task (`own_task`) and optimizer settings (`optim_settings`), the two seams the trainer asks any
model for.
"""

from __future__ import annotations

from typing import Any

from scaletrain.user_code.lightning import is_lightning_module


def adapted(model: Any) -> Any:
    """`model` as scaletrain trains it: a LightningModule wrapped in its adapter, anything else as it is."""
    if is_lightning_module(model):
        from scaletrain.adapters.lightning import LightningAdapter
        return LightningAdapter(model)
    return model


def model_to_train(name: str, input_shape, outputs: int, **options) -> Any:
    """The model `--model name` trains as: built by the registry as its author wrote it (ours, or
    the user's `package.module:name`), then adapted (a LightningModule, its class named or returned
    by a builder, through its adapter). What the training, the planners and the preflight build."""
    from scaletrain.models import build_model
    return adapted(build_model(name, tuple(input_shape), outputs, **options))
