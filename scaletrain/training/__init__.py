"""The training loop: the Trainer, its step, device counters, clock and warm-up snapshot, and
`build_run`, which wires a whole run from its config."""

from scaletrain.training.build import BuiltRun, build_run, start_strategy
from scaletrain.training.trainer import Trainer, resolve_device

__all__ = ["BuiltRun", "Trainer", "build_run", "resolve_device", "start_strategy"]
