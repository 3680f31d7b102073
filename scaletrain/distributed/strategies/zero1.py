"""ZeRO stage 1: DDP's replicated parameters and all-reduced gradients, with the optimizer state
sharded. Each rank owns a partition of the parameters (greedy by size, as torch's
ZeroRedundancyOptimizer partitions them), holds optimizer state for those only, updates them,
and broadcasts them to the others after the step.

The same algorithm as ZeroRedundancyOptimizer, kept in the strategy's optimizer step rather than
an optimizer wrapper because the training step hands the fused optimizer a device-side overflow flag and a
shared LR tensor, and checkpoints name optimizer state by parameter: with a plain torch optimizer
over the owned parameters all three work unchanged, and DCP reshards the state by name.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from scaletrain.distributed.partition import partition_by_size
from scaletrain.distributed.state_bytes import ModelState, ParamInfo, StateBytes, replicated_state
from scaletrain.distributed.strategies.base import register_strategy
from scaletrain.distributed.strategies.ddp import DDPStrategy
from scaletrain.distributed.strategies.step_contract import StepContract
from scaletrain.optim import build_optimizer


@register_strategy("zero1")
class Zero1Strategy(DDPStrategy):
    zero_stage = 1
    # DDP's all-reduce, then each owner's partition broadcast after the step (nothing to hide behind).
    collectives = (("all_reduce", 1, True), ("broadcast", 1, False))

    @classmethod
    def model_problem(cls, model: nn.Module, layout, config, block_classes=()) -> str | None:
        # Owners get whole tensors (largest first, each to the least loaded): with fewer tensors
        # than processes some own none, and an optimizer over nothing cannot be built (seen as a
        # rank dying and its peers' "Connection closed by peer": an 8-process run of a 6-tensor MLP).
        tensors = sum(1 for p in model.parameters() if p.requires_grad)
        if tensors < layout.world:
            return (f"--strategy zero1 gives each process whole tensors of the optimizer state, and the model has "
                    f"{tensors} trainable tensors for {layout.world} processes; use at most {tensors} processes, "
                    "or --strategy zero2 or fsdp (they shard inside each tensor)")
        return super().model_problem(model, layout, config, block_classes)

    def wrap(self, model: nn.Module, compile_fn, block_classes=(), policy=None):
        params = [p for p in model.parameters() if p.requires_grad]
        owners = partition_by_size([p.numel() for p in params], self.world_size)
        self.owned_by = [[p for p, o in zip(params, owners, strict=True) if o == r] for r in range(self.world_size)]
        return super().wrap(model, compile_fn)

    def make_optimizer(self, optim_config, model, device, capturable=False):
        return build_optimizer(optim_config, model, device, capturable=capturable, params=self.owned_by[self.rank])

    def optimizer_step(self, step: StepContract) -> None:
        super().optimizer_step(step)   # each rank updates the parameters it owns
        self._broadcast_owned()

    @classmethod
    def model_state(cls, params: list[ParamInfo], devices: int, b: StateBytes, config=None) -> ModelState:
        owners = partition_by_size([p.numel for p in params], devices)
        loads = [sum(params[i].numel for i in range(len(params)) if owners[i] == r) for r in range(devices)]
        busiest = max(range(devices), key=lambda r: (loads[r], -r))
        return replicated_state(params, [i for i in range(len(params)) if owners[i] == busiest], b)

    @torch.no_grad()
    def _broadcast_owned(self) -> None:
        # One coalesced broadcast per owner, all in flight at once.
        pending = []
        for owner, params in enumerate(self.owned_by):
            if params:
                flat = _flatten_dense_tensors([p.detach() for p in params])
                pending.append((params, flat, dist.broadcast(flat, src=owner, async_op=True)))
        for params, flat, work in pending:
            work.wait()
            for p, value in zip(params, _unflatten_dense_tensors(flat, params), strict=True):
                p.copy_(value)
