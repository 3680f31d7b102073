"""scaletrain: fast, honestly measured deep-learning training on PyTorch."""

from scaletrain.config import DataConfig, ModelConfig, OptimConfig, PrecisionConfig, TrainConfig
from scaletrain.training import Trainer
from scaletrain.version import __version__

__all__ = ["DataConfig", "ModelConfig", "OptimConfig", "PrecisionConfig", "TrainConfig", "Trainer"]
