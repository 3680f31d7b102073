"""Checkpoints through torch.distributed.checkpoint, published atomically, with exact resume."""

from scaletrain.checkpoint.checkpointer import Checkpointer, Position
from scaletrain.checkpoint.store import CheckpointStore

__all__ = ["CheckpointStore", "Checkpointer", "Position"]
