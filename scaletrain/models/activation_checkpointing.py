"""Activation checkpointing (seed 004): keep only each block's input during the forward pass and
recompute the block's inside during the backward, trading about one extra forward for memory
that no longer grows with the activations of every layer.

Applied in place by replacing each block's `forward` on the instance, so parameter names, state
dicts, checkpoints and FSDP's per-block hooks (which run around `forward`, outside the
recomputed region) are exactly those of the plain model. Non-reentrant (`use_reentrant=False`):
works with inputs that do not require grad, with torch.compile, and with DDP/FSDP.

Recomputation replays the forward in training mode, which would update BatchNorm's running
statistics (and `num_batches_tracked`) a second time. The recomputation therefore runs inside a
context that puts each BatchNorm buffer of the block back as it was (a copy of a few per-channel
vectors per block); the ops themselves are unchanged, so the recomputed tensors match the saved
ones exactly. Dropout masks are replayed exactly: the checkpoint restores the RNG state first.
"""

from __future__ import annotations

import contextlib
import functools

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from scaletrain.models.blocks import find_blocks


@contextlib.contextmanager
def _frozen_running_stats(norms: list[nn.modules.batchnorm._BatchNorm]):
    buffers = [b for bn in norms for b in (bn.running_mean, bn.running_var, bn.num_batches_tracked)
               if b is not None]
    saved = [b.clone() for b in buffers]
    try:
        yield
    finally:
        with torch.no_grad():
            for b, value in zip(buffers, saved, strict=True):
                b.copy_(value)


def _checkpointed_forward(original, norms, *args, **kwargs):
    if norms and not torch.compiler.is_compiling():
        def contexts():
            return contextlib.nullcontext(), _frozen_running_stats(norms)
        return checkpoint(original, *args, use_reentrant=False, context_fn=contexts, **kwargs)
    # Compiled, the recomputation is planned by AOTAutograd's partitioner, which replays no buffer
    # mutation in the backward graph (Dynamo also rejects custom context_fn): nothing to undo.
    return checkpoint(original, *args, use_reentrant=False, **kwargs)


def apply_activation_checkpointing(model: nn.Module, class_names: list[str] | tuple[str, ...] = ()) -> list[str]:
    """Checkpoints every repeated block of `model` (found automatically, or of the named classes).
    Returns the qualified names of the checkpointed blocks."""
    blocks = find_blocks(model, class_names)
    names = {id(m): name for name, m in model.named_modules()}
    for block in blocks:
        norms = [m for m in block.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
        block.forward = functools.partial(_checkpointed_forward, block.forward, norms)
    return [names[id(b)] for b in blocks]
