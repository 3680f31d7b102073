"""The memory planner: per-device bytes of a training configuration before anything runs, and the
largest batch that fits a device.

    total = parameters + gradients + optimizer state      (model_state: exact layout; on the host
                                                            instead under --cpu-offload)
          + gathered parameters                           (zero2 / fsdp during the step)
          + activations                                   (traced: activations.py)
          + workspace                                     (cuBLAS workspace, 32 MiB)

The sum counts the gradients as resident while the activations peak, which is what happens under
every data-parallel strategy (DDP's buckets, sharded gradients); on one device with gradients
freed between steps it overstates the peak by at most the gradient bytes.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

import torch

from scaletrain.errors import ConfigError
from scaletrain.inputs import map_inputs, tensors
from scaletrain.memory.activations import build_fake_model, trace_step
from scaletrain.memory.bracket import largest_fitting
from scaletrain.memory.model_state import PLAN_STRATEGIES, ParamInfo, model_state
from scaletrain.precision import get_policy
from scaletrain.tasks import Task, build_task

# torch gives each CUDA stream's cuBLAS handle a 32 MiB workspace on Hopper (4 x 8 MiB), drawn from
# the caching allocator, so it counts in torch.cuda.max_memory_allocated.
CUBLAS_WORKSPACE_BYTES = 32 * 2**20
MAX_SEARCH_BATCH = 2**24


@dataclass(kw_only=True, slots=True)
class PlanRequest:
    model: str
    model_options: dict = field(default_factory=dict)
    input_shape: tuple[int, ...]
    num_classes: int                     # the model's output size (classes, targets, vocabulary)
    task: str = "classification"
    batch_size: int                      # global
    precision: str = "fp32"
    strategy: str = "ddp"
    devices: int = 1
    activation_checkpointing: bool = False
    block_classes: tuple[str, ...] = ()
    optimizer: str = "adamw"
    momentum: float = 0.9
    device_memory: int | None = None     # bytes
    headroom: float = 0.05               # of device memory: allocator fragmentation, CUDA context
    distributed: Any = None              # the DistributedConfig: the strategies' own option tables
    # The data's first samples (inputs, targets) where they were read (a user's own set): the example
    # batch takes their shapes and dtypes (token ids, several named inputs); None: the task's own.
    example: Any = None
    task_choice: str = "auto"            # the config's --task (a user's own, the model's own loss)
    precision_options: Any = None        # the PrecisionConfig (fp8's recipe and --fp32-modules)

    def input_dtype(self, policy) -> torch.dtype:
        """The example batch's input dtype: the data's integers, else what the policy feeds the model."""
        first = tensors(self.example[0])[0] if self.example is not None else None
        return first.dtype if first is not None and not first.is_floating_point() else policy.input_dtype

    def make_task(self, model: torch.nn.Module) -> Task:
        """The task the training of `model` runs (the model's own loss where its forward takes labels)."""
        example = self.example
        if example is None and hasattr(model, "own_task"):   # a LightningModule reads its metrics off one
            from scaletrain.tasks import TASKS
            example = TASKS.get(self.task)().example_batch(2, self.input_shape, self.num_classes, torch.float32)
        return build_task(self.task_choice, self.task, model, example)

    def example_batch(self, task: Task, batch: int, policy) -> tuple:
        """(inputs, targets) of `batch` samples shaped as the data's (values arbitrary: zeros), made
        inside the caller's fake mode; the task's own example where the data was not read."""
        if self.example is None:
            return task.example_batch(batch, self.input_shape, self.num_classes, self.input_dtype(policy))
        x, y = self.example

        def like(t: torch.Tensor, dtype=None) -> torch.Tensor:
            return torch.zeros((batch, *t.shape[1:]), dtype=dtype or t.dtype)
        return map_inputs(lambda t: like(t, policy.input_dtype if t.is_floating_point() else None), x), like(y)


@dataclass(slots=True)
class MemoryPlan:
    model: str
    precision: str
    strategy: str
    devices: int
    activation_checkpointing: bool
    batch_size: int                 # global
    per_device_batch_size: int
    params: int
    param_bytes: int
    grad_bytes: int
    optimizer_bytes: int
    gathered_param_bytes: int
    activation_bytes: int
    workspace_bytes: int
    total_bytes: int                # on the device
    device_memory: int | None
    fits: bool | None
    max_batch_size: int | None              # global: max_per_device_batch_size x devices
    max_per_device_batch_size: int | None
    host_bytes: int = 0             # per rank, in host memory (--cpu-offload's shards)

    def to_dict(self) -> dict:
        return asdict(self)


def _validate(req: PlanRequest) -> None:
    if req.devices < 1:
        raise ConfigError(f"--devices must be at least 1 (got {req.devices})")
    if req.strategy not in PLAN_STRATEGIES:
        raise ConfigError(f"unknown strategy '{req.strategy}'; choose one of: {', '.join(PLAN_STRATEGIES)}")
    if req.batch_size < 1:
        raise ConfigError(f"--batch-size must be at least 1 (got {req.batch_size})")
    if req.batch_size % req.devices:
        raise ConfigError(f"global batch {req.batch_size} does not divide over {req.devices} devices; "
                          f"use a multiple of {req.devices}")
    if not 0 <= req.headroom < 1:
        raise ConfigError(f"--headroom must be in [0, 1) (got {req.headroom})")


class Planner:
    """Plans one model at one precision (and checkpointing choice) for any strategy and batch.
    The fake model is built once; each batch size costs one traced step."""

    def __init__(self, req: PlanRequest):
        self.req = req
        self.policy = get_policy(req.precision)
        self.compute_dtype = self.policy.autocast_dtype or self.policy.param_dtype
        self.traced = build_fake_model(req.model, req.model_options, req.input_shape, req.num_classes,
                                       self.policy.param_dtype, req.activation_checkpointing, req.block_classes)
        self.params = [ParamInfo(shape, unit) for shape, unit in self.traced.param_shapes]
        self.task = req.make_task(self.traced.model)
        self._activations: dict[int, int] = {}

    def activation_bytes(self, per_device_batch: int) -> int:
        """The traced activations of one per-device batch (each batch traced once)."""
        if per_device_batch not in self._activations:
            self._activations[per_device_batch] = self._trace(per_device_batch)
        return self._activations[per_device_batch]

    def _trace(self, per_device_batch: int) -> int:
        trace = trace_step(self.traced, per_device_batch, self.policy.autocast_dtype, self.task,
                           lambda n: self.req.example_batch(self.task, n, self.policy))
        return self.policy.planned_activation_bytes(trace.activation_bytes, self.traced.model,
                                                    self.req.precision_options)

    def plan(self, strategy: str, devices: int, batch_size: int) -> MemoryPlan:
        req = self.req
        probe = replace(req, strategy=strategy, devices=devices, batch_size=batch_size)
        _validate(probe)
        state = model_state(self.params, strategy, devices, self.policy.param_dtype.itemsize,
                            self.compute_dtype.itemsize, req.optimizer, req.momentum, req.distributed)
        fixed = (state.param_bytes + state.grad_bytes + state.optimizer_bytes + state.gathered_param_bytes
                 + CUBLAS_WORKSPACE_BYTES)
        per_device = batch_size // devices
        activations = self.activation_bytes(per_device)
        total = fixed + activations
        max_per_device = None
        if req.device_memory is not None:
            max_per_device = self.max_per_device_batch(req.device_memory * (1 - req.headroom) - fixed)
        return MemoryPlan(
            model=req.model, precision=req.precision, strategy=strategy, devices=devices,
            activation_checkpointing=req.activation_checkpointing, batch_size=batch_size,
            per_device_batch_size=per_device, params=state.params, param_bytes=state.param_bytes,
            grad_bytes=state.grad_bytes, optimizer_bytes=state.optimizer_bytes,
            gathered_param_bytes=state.gathered_param_bytes, activation_bytes=activations,
            workspace_bytes=CUBLAS_WORKSPACE_BYTES, total_bytes=total, device_memory=req.device_memory,
            fits=None if req.device_memory is None else total <= req.device_memory * (1 - req.headroom),
            max_batch_size=None if max_per_device is None else max_per_device * devices,
            max_per_device_batch_size=max_per_device, host_bytes=state.host_bytes)

    def max_per_device_batch(self, budget: float) -> int:
        """Largest per-device batch whose traced activations fit `budget` bytes. Two traces on one
        line of the curve give a first guess, which on the usual convex curve overshoots;
        memory/bracket.py narrows the bracket from there. A 1.3B ViT takes 5 traces for its first
        budget where bisection took 13-16 (tests: test_max_batch_search_*). A later budget (another
        strategy's, on the same planner) starts from what the earlier searches traced: the line
        through the batch an earlier search found and the next one, then the tightest bracket they
        give (2 traces where the budget falls on the same line; exact by monotonicity alone)."""
        earlier = dict(self._activations)
        if budget <= 0 or self.activation_bytes(1) > budget:
            return 0
        self.activation_bytes(2)
        n = self._nearest_line(budget)
        a, slope = self._activations[n], max(self._activations[n + 1] - self._activations[n], 1)
        guess = int(min(MAX_SEARCH_BATCH, max(1, n + (budget - a) // slope)))
        low, high = 1, None  # low fits; high (if known) does not
        if self.activation_bytes(guess) <= budget:
            low = guess
            high = guess + 1 if self.activation_bytes(guess + 1) > budget else None
            step = max(1, guess // 64)
            while high is None and low < MAX_SEARCH_BATCH:
                nxt = min(MAX_SEARCH_BATCH, low + step)
                if self.activation_bytes(nxt) <= budget:
                    low, step = nxt, step * 2
                else:
                    high = nxt
        else:
            high = guess
        if high is None:
            return low
        low = max([low, *(b for b, cost in earlier.items() if cost <= budget and b < high)])
        high = min([high, *(b for b, cost in earlier.items() if cost > budget and b > low)])
        return largest_fitting(low, high, budget,
                               lambda n: (self.activation_bytes(n) <= budget, self.activation_bytes(n)))

    def _nearest_line(self, budget: float) -> int:
        """The traced batch n, with n + 1 traced too and costing more, whose cost is nearest
        `budget`: (1, 2) at first, an earlier search's answer and the batch after it later."""
        pairs = [b for b in self._activations
                 if b + 1 in self._activations and self._activations[b + 1] > self._activations[b]]
        return min(pairs, key=lambda b: abs(self._activations[b] - budget), default=1)


def plan_memory(req: PlanRequest) -> MemoryPlan:
    """One plan for one request (see Planner for many)."""
    _validate(req)
    return Planner(req).plan(req.strategy, req.devices, req.batch_size)


__all__ = ["CUBLAS_WORKSPACE_BYTES", "MemoryPlan", "PlanRequest", "Planner", "plan_memory"]
