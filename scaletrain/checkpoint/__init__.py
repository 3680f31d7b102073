"""Checkpoints through torch.distributed.checkpoint, published atomically, with exact resume."""

from typing import TYPE_CHECKING

from scaletrain.lazy import lazy_exports

_EXPORTS = {
    "CheckpointStore": "scaletrain.checkpoint.store",
    "Checkpointer": "scaletrain.checkpoint.checkpointer",
    "Position": "scaletrain.checkpoint.checkpointer",
}
__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

if TYPE_CHECKING:
    from scaletrain.checkpoint.checkpointer import Checkpointer, Position
    from scaletrain.checkpoint.store import CheckpointStore
