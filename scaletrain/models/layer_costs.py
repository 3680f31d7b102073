"""What each layer of a model's layer sequence costs: forward FLOPs and memory, from one traced
forward of an example micro-batch, not from parameter counts.

Parameter count is a poor proxy for a convolutional network's work: a WideResNet's first stage
holds 2 % of the parameters and does a third of the FLOPs (its feature maps are 4x and 16x larger
than the later stages'). A pipeline runs at the pace of its busiest stage, so it is cut by what
the layers cost (distributed/partition.py).

    flops       FLOPs of the layer's forward (torch's FlopCounterMode; the backward is about twice
                that, layer for layer, so the forward's proportions are the step's)
    state_bytes the layer's parameters, their gradients and AdamW's two moments: 4 x parameter bytes
    held_bytes  what the layer's forward saves for its backward (autograd's saved tensors, less
                parameters): the activation memory one micro-batch keeps alive on its stage

The model runs on the meta device or under the planner's FakeTensorMode: shapes only, nothing is
allocated and the live model's buffers (BatchNorm's running statistics) are never touched.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from scaletrain.models.blocks import pipeline_layers

STATE_COPIES = 4   # the parameter, its gradient, AdamW's two moments


@dataclass(frozen=True, slots=True)
class LayerCost:
    name: str
    flops: int
    state_bytes: int
    held_bytes: int

    @property
    def memory_bytes(self) -> int:
        return self.state_bytes + self.held_bytes


def layer_costs(model: nn.Module, example: torch.Tensor) -> list[LayerCost]:
    """Each of `model`'s pipeline layers' cost for the micro-batch `example` (on the meta device or
    a fake tensor, matching the model's parameters)."""
    costs = []
    params = {id(p) for p in model.parameters()}
    x = example.requires_grad_(True) if example.is_floating_point() else example
    for name, layer in pipeline_layers(model):
        saved: dict[int, int] = {}

        def pack(t: torch.Tensor, saved: dict[int, int] = saved) -> torch.Tensor:   # this layer's dict, bound
            if id(t) not in params and not isinstance(t, nn.Parameter):
                saved[id(t)] = t.numel() * t.element_size()
            return t

        with FlopCounterMode(display=False) as counter, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            x = layer(x)
        state = sum(p.numel() * p.element_size() for p in layer.parameters() if p.requires_grad) * STATE_COPIES
        costs.append(LayerCost(name, int(counter.get_total_flops()), state, sum(saved.values())))
    return costs


def meta_layer_costs(build: Callable[[], nn.Module], input_shape, outputs: int, task, micro_batch: int,
                     activation_checkpointing: bool = False, block_classes=()) -> list[LayerCost]:
    """The layer costs of the model `build()` makes (as the training builds it), built on the meta
    device in float32 (checkpointed blocks as the trainer checkpoints them) for a micro-batch of
    `task`'s example data: the one recipe the training and the memory planner share, so both cut alike."""
    from scaletrain.models.activation_checkpointing import apply_activation_checkpointing
    from scaletrain.models.structure import device_of, structure_of
    model = structure_of(build)    # (a builder the meta device cannot build: built and measured on the CPU)
    with device_of(model):
        example, _ = task.example_batch(micro_batch, tuple(input_shape), outputs, torch.float32)
    if activation_checkpointing:
        apply_activation_checkpointing(model, block_classes)
    return layer_costs(model, example)
