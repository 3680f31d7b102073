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
    # Whether evaluation's forward runs collectives (sharded parameters are gathered), so every
    # rank must run the same number of evaluation batches.
    eval_in_lockstep = False

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

    def prepare(self, model: nn.Module, compile_fn: Callable[[nn.Module], nn.Module], block_classes=(),
                policy=None) -> tuple[Callable, Callable]:
        """Returns (train_forward, eval_forward). Evaluation never goes through a wrapper that runs
        collectives in forward: ranks evaluate different numbers of batches (unless
        `eval_in_lockstep`). `block_classes` names the model's repeated blocks for strategies that
        wrap per block; `policy` is the precision policy, for strategies with their own casting."""
        raise NotImplementedError

    def optimizer_parameters(self, model: nn.Module) -> list[nn.Parameter]:
        """The parameters this rank's optimizer updates (and holds state for)."""
        return [p for p in model.parameters() if p.requires_grad]

    def after_optimizer_step(self) -> None:
        """Runs right after each optimizer step (ZeRO-1 broadcasts the updated shards here)."""

    def reduce_found_inf_(self, found_inf: torch.Tensor) -> torch.Tensor:
        """Makes the fp16 overflow flag the same on every rank. Replicated gradients already give
        the same flag everywhere; sharded gradients need a max over ranks."""
        return found_inf

    def full_state_dict(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """The whole model's weights as plain tensors, for export. Collective where parameters are
        sharded: every rank must call it."""
        return model.state_dict()

    def after_evaluation(self, model: nn.Module) -> None:
        """Runs after evaluation or prediction forwards (no backward followed them)."""

    def after_first_step(self) -> None:
        """Called once the first training step has run (compilation and warm-up are over)."""

    def teardown(self, clean: bool = True) -> None:
        pass

    # -- collectives (no-ops on one process)
    def no_sync(self) -> contextlib.AbstractContextManager:
        """Context for the gradient-accumulation micro-batches that must not communicate."""
        return contextlib.nullcontext()

    def all_reduce_sum_(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    def all_reduce_max_(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    def broadcast_object(self, obj: Any) -> Any:
        return obj

    def barrier(self) -> None:
        pass
