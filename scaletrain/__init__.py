"""scaletrain: fast, honestly measured deep-learning training on PyTorch."""

from scaletrain.config import DataConfig, ModelConfig, OptimConfig, PrecisionConfig, TrainConfig
from scaletrain.training import Trainer

__version__ = "0.1.0"

__all__ = ["DataConfig", "ModelConfig", "OptimConfig", "PrecisionConfig", "TrainConfig", "Trainer"]
