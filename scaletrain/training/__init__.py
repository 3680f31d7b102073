"""The training loop: the Trainer, its step, device counters, clock and warm-up snapshot, and
`build_training`, which wires a whole run from its config."""

from scaletrain.training.build import TrainingParts, build_training, start_strategy
from scaletrain.training.trainer import Trainer, resolve_device

__all__ = ["TrainingParts", "Trainer", "build_training", "resolve_device", "start_strategy"]
