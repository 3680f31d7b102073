"""Adapters: a model written for another framework, trained by scaletrain as it is.

`adapted(model)` is the one place a foreign model is recognised: a Lightning `LightningModule`
becomes a plain `nn.Module` (adapters/lightning.py) that brings its own task (`own_task`) and
optimizer settings (`optim_settings`), the two seams the trainer asks any model for. The check
reads class names only, so nothing here imports Lightning unless a LightningModule is given.
"""

from __future__ import annotations

from typing import Any

# The OptimConfig fields a LightningModule's configure_optimizers sets: a flag naming one of them
# is refused for such a model (cli/train.py), never overridden in silence.
OWN_OPTIMIZER_FIELDS = ("optimizer", "lr", "weight_decay", "decay_all", "momentum", "nesterov", "betas",
                        "lr_schedule", "warmup_epochs", "step_milestones", "step_gamma")


def _is_lightning(obj: Any, class_name: str) -> bool:
    cls = obj if isinstance(obj, type) else type(obj)
    return any(base.__name__ == class_name and base.__module__.split(".")[0] in ("lightning", "pytorch_lightning")
               for base in cls.__mro__)


def is_lightning_module(obj: Any) -> bool:
    """Whether `obj` is a LightningModule class or instance (lightning or pytorch_lightning)."""
    return _is_lightning(obj, "LightningModule")


def is_lightning_data_module(obj: Any) -> bool:
    """Whether `obj` is a LightningDataModule instance (data/user_source.py reads its loaders)."""
    return not isinstance(obj, type) and _is_lightning(obj, "LightningDataModule")


def adapted(model: Any) -> Any:
    """`model` as scaletrain trains it: a LightningModule wrapped in its adapter, anything else as it is."""
    if is_lightning_module(model):
        from scaletrain.adapters.lightning import LightningAdapter
        return LightningAdapter(model)
    return model
