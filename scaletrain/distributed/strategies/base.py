"""The strategy interface: how a run is spread over devices and processes.

The trainer talks to its strategy only through these methods, so model code never changes and a
new strategy (fsdp, zero1, ps...) is one more file in this folder registered in `registry.py`.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable

import torch
from torch import nn

from scaletrain.distributed.env import DistEnv


class Strategy:
    name = "base"
    # Whether the whole training step (collectives included) may be captured in one CUDA graph.
    supports_cuda_graphs = True

    def __init__(self, config, env: DistEnv):
        self.config = config     # the DistributedConfig
        self.env = env
        self.device = torch.device("cpu")

    # -- where this process sits
    @property
    def rank(self) -> int:
        return self.env.rank

    @property
    def world_size(self) -> int:
        return self.env.world_size

    @property
    def is_chief(self) -> bool:
        return self.env.rank == 0

    # -- lifecycle
    def setup(self, device_request: str) -> torch.device:
        """Picks this process's device and joins the process group (if any)."""
        raise NotImplementedError

    def prepare(self, model: nn.Module, compile_fn: Callable[[nn.Module], nn.Module]) -> tuple[Callable, Callable]:
        """Returns (train_forward, eval_forward). Evaluation never goes through a wrapper that runs
        collectives in forward: ranks evaluate different numbers of batches."""
        raise NotImplementedError

    def after_first_step(self) -> None:
        """Called once the first training step has run (compilation and warm-up are over)."""

    def teardown(self) -> None:
        pass

    # -- collectives (no-ops on one process)
    def no_sync(self) -> contextlib.AbstractContextManager:
        """Context for the gradient-accumulation micro-batches that must not communicate."""
        return contextlib.nullcontext()

    def all_reduce_sum_(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    def broadcast_object(self, obj: Any) -> Any:
        return obj

    def barrier(self) -> None:
        pass
