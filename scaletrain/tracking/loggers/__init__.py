"""External trackers a run also logs to (`--logger mlflow,wandb,tensorboard`). Each is one file
here implementing base.ExternalLogger, imported only when a run asks for it; adding one is a file
and a line in TRACKERS (and its name in config.LOGGERS)."""

from __future__ import annotations

import importlib
import importlib.util

from scaletrain.errors import ConfigError

# name -> (module:class, the package it needs, the extra that installs it)
TRACKERS = {
    "mlflow": ("scaletrain.tracking.loggers.mlflow:MlflowLogger", "mlflow", "mlflow"),
    "wandb": ("scaletrain.tracking.loggers.wandb:WandbLogger", "wandb", "wandb"),
    "tensorboard": ("scaletrain.tracking.loggers.tensorboard:TensorBoardLogger", "tensorboard", "tensorboard"),
}


def check_trackers(names: list[str]) -> None:
    """Before any work: each named tracker's package is installed (no import: a check, not a cost)."""
    for name in names:
        _, package, extra = TRACKERS[name]
        if importlib.util.find_spec(package) is None:
            raise ConfigError(f"--logger {name} needs the {package} package: pip install 'scaletrain[{extra}]'")


def build_trackers(names: list[str]) -> list:
    check_trackers(names)
    out = []
    for name in names:
        module, _, cls = TRACKERS[name][0].partition(":")
        out.append(getattr(importlib.import_module(module), cls)())
    return out
