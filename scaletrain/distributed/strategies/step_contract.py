"""What a strategy may use of the training step it runs. The step (training/step.py's TrainStep)
is built a layer above the strategies, so they see it through this Protocol, never by import;
tests/test_architecture.py checks that TrainStep satisfies it and that the strategies use nothing
else of it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import torch

from scaletrain.inputs import Inputs
from scaletrain.precision import DynamicLossScaler
from scaletrain.tasks import Task


@runtime_checkable
class StepContract(Protocol):
    grad_accum_steps: int                  # micro-batches per optimizer step
    params: list[torch.nn.Parameter]       # the trainable parameters this process steps
    optimizer: torch.optim.Optimizer
    task: Task
    scaler: DynamicLossScaler | None       # fp16's loss scaler, else None

    def forward_loss(self, x: Inputs, y: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """(loss, output) of a micro-batch: the forward under the precision policy, the loss in float32."""

    def backward(self, loss: torch.Tensor) -> None:
        """Backward of one micro-batch's share of the step's loss (scaled under fp16)."""

    def record(self, loss: torch.Tensor, output: Any, y: torch.Tensor, parts: int | None = None) -> None:
        """Adds a micro-batch's loss and training metric to the device counters."""

    def unscale_(self) -> torch.Tensor | None:
        """fp16: unscales the gradients; returns this rank's overflow flag."""

    def clip_(self, total_sq_norm: Callable | None = None) -> None:
        """Clips the gradients to the configured norm (by the whole model's norm where given)."""

    def update(self, found_inf: torch.Tensor | None, clipped: bool = False, apply: Callable | None = None) -> None:
        """Sets the LR, steps the optimizer (or `apply`), advances the counters, clears the gradients."""
