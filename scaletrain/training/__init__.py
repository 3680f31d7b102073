"""The training loop: the Trainer, its step, device counters, clock and warm-up snapshot."""

from scaletrain.training.trainer import Trainer, resolve_device

__all__ = ["Trainer", "resolve_device"]
