"""Activation memory from one traced training step, not from a formula.

The model is built and run under FakeTensorMode: every op computes only shapes, dtypes and
strides, nothing is allocated, so a 10-billion-parameter model traces on a laptop. The step is
the trainer's own (autocast forward, float32 loss, backward), with activation checkpointing
applied exactly as the trainer applies it, and LiveBytes counts what it holds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from scaletrain.adapters import model_to_train
from scaletrain.console import quiet_fake_tensors
from scaletrain.inputs import tensors
from scaletrain.memory.tracker import LiveBytes, storage_key
from scaletrain.models.activation_checkpointing import apply_activation_checkpointing
from scaletrain.models.blocks import find_blocks
from scaletrain.tasks import Task


@dataclass(slots=True)
class StepTrace:
    batch: int
    activation_bytes: int   # peak of everything the step holds except gradients
    step_peak_bytes: int    # peak including the gradients as the backward produces them


@dataclass(slots=True)
class TracedModel:
    """A model built on fake tensors, with what the planner needs to know about it."""
    model: torch.nn.Module
    fake_mode: FakeTensorMode
    param_shapes: list[tuple[tuple[int, ...], int]]  # (shape, FSDP unit index or -1)
    blocks: int


def build_fake_model(model_name: str, options: dict, input_shape, num_classes: int, storage_dtype: torch.dtype,
                     activation_checkpointing: bool, block_classes=()) -> TracedModel:
    mode = FakeTensorMode(allow_non_fake_inputs=False)
    # Built in its storage dtype (as `.to(dtype)` leaves it): converting fake parameters afterwards
    # fails in torch >= 2.13 ("Couldn't swap"), so the default dtype is set around the build.
    default = torch.get_default_dtype()
    torch.set_default_dtype(storage_dtype)
    try:
        with quiet_fake_tensors(), mode:   # as the training builds it: a LightningModule through its adapter
            model = model_to_train(model_name, input_shape, num_classes, **options)
    finally:
        torch.set_default_dtype(default)
    try:
        blocks = find_blocks(model, block_classes)
    except Exception:
        if activation_checkpointing or block_classes:
            raise
        blocks = []
    unit_of = {}
    for i, block in enumerate(blocks):
        for p in block.parameters():
            unit_of[id(p)] = i
    shapes = [(tuple(p.shape), unit_of.get(id(p), -1)) for p in model.parameters() if p.requires_grad]
    if activation_checkpointing:
        apply_activation_checkpointing(model, block_classes)
    return TracedModel(model, mode, shapes, len(blocks))


def trace_step(traced: TracedModel, batch: int, autocast_dtype: torch.dtype | None, task: Task,
               make_batch: Callable[[int], tuple], device_type: str = "cpu") -> StepTrace:
    """Runs one forward/backward of `batch` samples (`make_batch(batch)`: inputs and targets, made
    inside the fake mode) on the fake model, as the trainer's step runs it (the task calls the model
    and takes its loss), and counts its bytes."""
    model = traced.model
    with quiet_fake_tensors(), traced.fake_mode:
        x, y = make_batch(batch)
        x = task.model_inputs(x, y)
        model.zero_grad(set_to_none=True)
        tracker = LiveBytes(list(model.parameters()) + list(model.buffers()) + tensors(x) + [y])
        with tracker:
            with torch.autocast(device_type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
                output = task.forward(model, x)
            loss = task.loss(output, y)
            del output     # as the trainer's step: the output is released before the backward
            loss.backward()
        grads = {storage_key(p.grad) for p in model.parameters() if p.grad is not None}
        model.zero_grad(set_to_none=True)
    return StepTrace(batch, tracker.peak_excluding(grads), tracker.peak)
