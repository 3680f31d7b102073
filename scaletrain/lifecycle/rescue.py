"""What a run keeps when a write fails mid-run (a disk that filled, a quota): the epochs trained.

A run sets aside, before it trains, the space of what it writes at its end (model.pt and the
summaries: checkpoint/space.py) and, where one process holds the whole training state, the space
of one checkpoint of it. When a write fails while it trains (a metrics line, a checkpoint, the
checkpoints' owner.json, the store), the run

1. gives back the checkpoint's space and saves a checkpoint of where it is, at a step boundary,
   where `--resume auto` goes on from (a run without --checkpoint-every gets this one too);
2. writes the weights it has into model.pt's space, which stays held until then;
3. is recorded failed, with one line saying what was kept and how to go on.

Several processes hold the state between them and save it together: a write that fails on the
chief alone cannot make them save, so there the run keeps what its checkpoints kept, and the
weights where the chief holds them whole.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from torch.utils._pytree import tree_leaves

from scaletrain.checkpoint.checkpointer import Checkpointer
from scaletrain.checkpoint.space import Reserved
from scaletrain.checkpoint.store import CheckpointStore

# A checkpoint's files beside its tensors: DCP's metadata (about a KiB a tensor), the manifest,
# the commit marker and the store's owner.json.
PER_TENSOR_BYTES, FIXED_BYTES = 2048, 256 * 1024


def checkpoint_bytes(trainer) -> int:
    """The disk space one checkpoint of the trainer's whole state takes, with room to spare."""
    tensors = [t for t in tree_leaves(trainer.state_dict()) if isinstance(t, torch.Tensor)]
    return sum(t.numel() * t.element_size() for t in tensors) + PER_TENSOR_BYTES * len(tensors) + FIXED_BYTES


def keeps_checkpoint(trainer) -> bool:
    """Whether this process can save the whole training state alone (one process)."""
    return trainer.strategy.world_size == 1


def rescue(trainer, checkpoints: Checkpointer | CheckpointStore, checkpoint_space: Reserved | None,
           model_space: Reserved | None, weights: Callable[[], dict]) -> list[str]:
    """Keeps what `trainer` trained after a failed write; returns what was kept, in words (empty:
    nothing). Each part is best effort: a disk that stays full keeps what fits."""
    kept = []
    if checkpoint_space is not None and keeps_checkpoint(trainer):
        checkpoint_space.release()     # its space is what the checkpoint is written into
        checkpointer = checkpoints if isinstance(checkpoints, Checkpointer) else Checkpointer(checkpoints)
        checkpointer.background = False
        try:
            path = checkpointer.save(trainer)
            kept.append(f"a checkpoint at step {trainer.global_step} ({path})")
        except Exception:   # noqa: BLE001 - the weights below may still fit
            pass
    if model_space is not None:
        try:
            state = weights()
            model_space.write(lambda fh: torch.save(state, fh))
            kept.append(f"the weights trained so far in {Path(model_space.path)}")
        except Exception:   # noqa: BLE001
            pass
    return kept
