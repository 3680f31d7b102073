"""Whole-step CUDA-graph capture: forward, backward and optimizer step replayed as one launch.

For small models the step is launch-bound (hundreds of kernel launches of microseconds each);
replaying a captured graph removes the per-kernel CPU cost. The step reads its batch from static
input buffers, so each replay is preceded by two device-to-device copies into them.
Requirements met by the rest of the trainer: fused/capturable optimizers with a tensor LR,
optimizer state created before capture, gradients zeroed in place, no host syncs in the step.
"""

from __future__ import annotations

import torch

from scaletrain.inputs import Inputs, map_inputs, tensors
from scaletrain.training.step import TrainStep

WARMUP_ITERS = 3  # eager iterations on a side stream before capture, as the PyTorch docs do


class CudaGraphStep:
    def __init__(self, step: TrainStep, x: Inputs, y: torch.Tensor):
        self.step = step
        self.static_x = map_inputs(torch.clone, x)
        self.static_y = y.clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(WARMUP_ITERS):
                step(self.static_x, self.static_y)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            step(self.static_x, self.static_y)

    def __call__(self, x: Inputs, y: torch.Tensor) -> None:
        for static, new in zip(tensors(self.static_x), tensors(x), strict=True):
            static.copy_(new, non_blocking=True)
        self.static_y.copy_(y, non_blocking=True)
        self.graph.replay()


def capture_undone(trainer, step: TrainStep, x: Inputs, y: torch.Tensor) -> CudaGraphStep:
    """`step` captured on (x, y), the training its warm-up iterations did undone: the weights,
    optimizer state, counters and RNG as they were (what the probe's copies measure from; the
    trainer's own warm-up does the same around its capture)."""
    from scaletrain.training.snapshot import TrainingSnapshot
    extra = {**trainer.counters.tensors(), **(trainer.scaler.state_tensors() if trainer.scaler else {})}
    snapshot = TrainingSnapshot(trainer.model, trainer.optimizer, extra)
    captured = CudaGraphStep(step, x, y)
    snapshot.restore()
    trainer.counters.restored()
    return captured
