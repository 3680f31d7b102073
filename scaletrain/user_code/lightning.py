"""Lightning's classes recognised by name (nothing here imports Lightning unless the user's code
did), and a LightningDataModule's loaders read as Lightning's `fit` and `test` read them. The
adapter that trains a LightningModule as our model is adapters/lightning.py."""

from __future__ import annotations

from typing import Any

from scaletrain.errors import DataError
from scaletrain.user_code.importing import import_function

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
    """Whether `obj` is a LightningDataModule instance."""
    return not isinstance(obj, type) and _is_lightning(obj, "LightningDataModule")


def names_lightning_module(model_name: str) -> bool:
    """Whether `--model model_name` is a LightningModule class (`package.module:LitModel`), built
    from its own arguments. A registered name never is; a builder function may still return one
    (`adapters.adapted` recognises the model it built)."""
    return ":" in model_name and is_lightning_module(import_function(model_name, "model"))


def data_module_splits(module, name: str) -> dict:
    """A LightningDataModule's splits as Lightning's `fit` and `test` read them: prepare_data, then
    setup("fit") for the training and validation loaders, setup("test") for the test loader, each
    split only where the module defines its loader."""
    base = next(b for b in type(module).__mro__ if b.__name__ == "LightningDataModule")
    defines = [hook for hook in ("val_dataloader", "test_dataloader")
               if getattr(type(module), hook) is not getattr(base, hook)]
    try:
        module.prepare_data()
        module.setup("fit")
        splits = {"train": module.train_dataloader()}
        if "val_dataloader" in defines:
            splits["val"] = module.val_dataloader()
        if "test_dataloader" in defines:
            module.setup("test")
            splits["test"] = module.test_dataloader()
    except DataError:
        raise
    except Exception as exc:   # the user's data module failed: its message, one line
        raise DataError(f"data '{name}' (a LightningDataModule) raised {type(exc).__name__}: {exc}") from None
    return splits
