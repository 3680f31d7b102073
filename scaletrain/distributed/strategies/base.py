"""The strategy interface: how one training step is spread over devices and processes.

A strategy owns the distributed part of the step: `forward_backward` (default: the micro-batch
loop, communicating only on the last micro-batch) and `optimizer_step` (default: unscale, clip,
step), evaluation's forwards (`evaluate`), and states its model-state layout for the memory
planner (`model_state`). The training step (training/step.py) supplies the pieces they call
(forward and loss under the precision policy, backward, the update), so a new strategy (a
pipeline schedule, a parameter server) is one file in this folder with `@register_strategy`.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch import nn

from scaletrain.config import STRATEGIES as STRATEGY_CHOICES
from scaletrain.distributed.env import DistEnv
from scaletrain.distributed.layout import Degrees, Layout
from scaletrain.distributed.state_bytes import ModelState, ParamInfo, StateBytes, replicated_state
from scaletrain.distributed.strategies.step_contract import StepContract
from scaletrain.inputs import chunk_inputs, first_rows
from scaletrain.optim import build_optimizer
from scaletrain.registry import Registry

STRATEGIES = Registry("strategy", "--strategy", choices=STRATEGY_CHOICES)
# Class decorator: makes a strategy available as `--strategy NAME` (and a config choice).
register_strategy = STRATEGIES.register


class Strategy(ABC):
    """The core every strategy has. What only some can do (serve, cut epochs, bring other
    processes into a checkpoint) is a capability (distributed/capabilities.py), not a member here."""
    name = "base"
    # Whether the whole training step (collectives included) may be captured in one CUDA graph.
    supports_cuda_graphs = True
    # Layout facts (read by the default step and evaluation, and by the batch finder):
    # every rank holds the whole reduced gradient, so fp16 overflow flags agree without a reduction;
    replicated_gradients = True
    # a forward pass runs collectives (parameters gathered), so every rank runs as many forwards.
    forward_communicates = False
    # How `plan-memory` lays out its memory: "device" (one row per device layout, compared side by
    # side with the other such strategies; one device's layout is ddp's with --devices 1), "stage"
    # (a row per pipeline stage of one replica, alone), or None (not planned); and the ZeRO stage
    # of its sharding (0: replicated ... 3: parameters, gradients and optimizer state), the order
    # plan-memory lists the device rows in.
    memory_plan: str | None = "device"
    zero_stage = 0
    # What crosses the links each step, the pattern `scaletrain scaling` models: "all-reduce" of the
    # gradients, "sharded" (reduce-scatter and all-gather), "pipeline" (activations between
    # stages), "tensor" (per-layer collectives), "parameter-server" (push and pull), or "none".
    traffic = "all-reduce"
    # For the all-reduce and sharded patterns: the step's collectives over the model's S bytes, as
    # (kind, count, can overlap compute), and what they can hide behind: "backward" or the whole
    # "step" (prediction/scaling.py prices each kind).
    collectives = (("all_reduce", 1, True),)
    hides_behind = "backward"
    # The --grad-compression values its gradient exchange applies (Layout.build refuses the others).
    grad_compressions: tuple[str, ...] = ("none",)
    # The kinds of device (torch.device.type) it runs on; the launch refuses the others in one line
    # (training/preflight.py). XLA devices train through single and spmd only.
    device_types: tuple[str, ...] = ("cpu", "cuda")

    def __init__(self, config, env: DistEnv, layout: Layout | None = None):
        self.config = config     # the DistributedConfig
        self.env = env
        self.layout = layout or Layout.build(type(self), config, env.world_size, env.rank)
        self.device = torch.device("cpu")

    # -- what it asks of the processes (read by Layout.build)
    @classmethod
    def degrees(cls, config) -> Degrees:
        """Pipeline stages, tensor-parallel degree and servers this strategy asks for under
        `config`; every other process is a data-parallel replica."""
        return Degrees()

    @classmethod
    def layout_problem(cls, layout: Layout, config) -> str | None:
        """A rule of this strategy's about process counts that `layout` breaks (one line, with the fix)."""
        return None

    @classmethod
    def model_problem(cls, model: nn.Module, layout: Layout, config, block_classes=()) -> str | None:
        """A rule of this strategy's about the model that `model` breaks under `layout` (one line,
        with the fix). It reads only the module structure, so the launcher asks it of a model built
        on the meta device before any worker starts (training/preflight.py); `wrap` asks again."""
        return None

    # -- where this process sits (the layout owns it; these read it)
    @property
    def rank(self) -> int:
        return self.layout.rank

    @property
    def world_size(self) -> int:
        return self.layout.world

    @property
    def is_chief(self) -> bool:
        return self.layout.is_chief

    def describe(self) -> str | None:
        """How the model is laid out over processes, for the run's log (None: nothing to add)."""
        return None

    # -- lifecycle
    @abstractmethod
    def setup(self, device_request: str) -> torch.device:
        """Picks this process's device and joins the process group (if any)."""

    @abstractmethod
    def wrap(self, model: nn.Module, compile_fn: Callable[[nn.Module], nn.Module], block_classes=(),
             policy=None) -> tuple[Callable, Callable]:
        """The strategy's part of `parallelize`: returns (train_forward, eval_forward), compiling
        where the strategy needs compilation to sit (DDP compiles its wrapper). `block_classes`
        names the model's repeated blocks for strategies that shard per block; `policy` is the
        precision policy, for strategies that cast parameters themselves."""

    def teardown(self, clean: bool = True) -> None:
        pass

    def after_first_step(self) -> None:
        """Called once the first training step has run (compilation and warm-up are over)."""

    # -- the step
    def forward_backward(self, step: StepContract, x: torch.Tensor, y: torch.Tensor) -> None:
        """Forward, loss and backward of one optimizer step's batch, recorded in the step's
        counters. Gradient accumulation: only the last micro-batch communicates."""
        k = step.grad_accum_steps
        if k == 1:
            self._micro_batch(step, x, y)
            return
        for i, (xm, ym) in enumerate(zip(chunk_inputs(x, k), y.chunk(k), strict=True)):
            with self.no_sync() if i < k - 1 else contextlib.nullcontext():
                self._micro_batch(step, xm, ym)

    @staticmethod
    def _micro_batch(step: StepContract, x, y) -> None:
        loss, output = step.forward_loss(x, y)
        # Recorded before the backward, so the output (a language model's logits: the step's
        # largest tensor) is freed before the backward allocates its gradients.
        step.record(loss, output, y)
        del output
        step.backward(loss)

    def optimizer_step(self, step: StepContract) -> None:
        """Unscales (fp16), agrees on overflow, clips and steps the optimizer."""
        found_inf = step.unscale_()
        if found_inf is not None and not self.replicated_gradients:
            self.all_reduce_max_(found_inf)
        step.update(found_inf)

    def make_optimizer(self, optim_config, model: nn.Module, device: torch.device,
                       capturable: bool = False) -> torch.optim.Optimizer:
        """The optimizer this process steps: by default over all of the model's trainable
        parameters (ZeRO-1 takes its partition; parameter servers keep the state elsewhere)."""
        return build_optimizer(optim_config, model, device, capturable=capturable,
                               params=[p for p in model.parameters() if p.requires_grad])

    # -- evaluation
    def evaluate(self, batches: Iterable[tuple[torch.Tensor, Any]], forward: Callable[[torch.Tensor], torch.Tensor],
                 pad_input: torch.Tensor | None = None) -> Iterator[tuple[torch.Tensor, Any]]:
        """Runs `forward` over evaluation batches (no backward follows) and yields (output, y).
        Where a forward communicates, ranks whose share had fewer batches run extra forwards on
        `pad_input` (outputs discarded) until every rank ran as many."""
        count = 0
        for x, y in batches:
            count += 1
            pad_input = x
            yield forward(x), y
        if self.forward_communicates and self.world_size > 1:
            most = torch.tensor([count], device=self.device)
            self.all_reduce_max_(most)
            for _ in range(int(most) - count):
                forward(first_rows(pad_input))

    def full_state_dict(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """The whole model's weights as plain tensors, for export. Collective where parameters are
        sharded: every rank must call it."""
        return model.state_dict()

    # -- the memory planner's view
    @classmethod
    def model_state(cls, params: list[ParamInfo], devices: int, b: StateBytes, config=None) -> ModelState:
        """Per-device bytes of parameters, gradients and optimizer state (the busiest device) on
        `devices` devices, under the DistributedConfig `config` (its strategy's options; None: the
        defaults). Default: everything replicated."""
        return replicated_state(params, list(range(len(params))), b)

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
