"""scaletrain: fast, honestly measured deep-learning training on PyTorch.

The public names are imported on first use (scaletrain/lazy.py): the command line is reached
through this package, and `scaletrain --help`, `list` or `runs list` answer without torch."""

from typing import TYPE_CHECKING

from scaletrain.lazy import lazy_exports
from scaletrain.version import __version__

_EXPORTS = {
    "DataConfig": "scaletrain.config",
    "ModelConfig": "scaletrain.config",
    "OptimConfig": "scaletrain.config",
    "PrecisionConfig": "scaletrain.config",
    "TrainConfig": "scaletrain.config",
    "Trainer": "scaletrain.training",
}
__all__ = [*_EXPORTS, "__version__"]
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

if TYPE_CHECKING:
    from scaletrain.config import DataConfig, ModelConfig, OptimConfig, PrecisionConfig, TrainConfig
    from scaletrain.training import Trainer
