"""Per-stage memory of a pipeline, before anything runs.

Each stage holds its own layers' parameters, gradients and optimizer state (replicated over the
replicas) and the activations of the micro-batches in flight: GPipe runs every forward before
any backward, so a stage holds all M; 1F1B starts backwards as soon as the pipeline is full, so
stage s (0-based) of P holds at most P - s. One micro-batch of each stage is traced on fake
tensors, as the whole-model planner does (activations.py):

    held_s  = bytes alive after the stage's forward of one micro-batch (what it keeps for its
              backward, its output included: the stage backpropagates through it)
    peak_s  = peak of one micro-batch's forward and backward, gradients excluded
    activations_s = (in_flight_s - 1) * held_s + peak_s
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from scaletrain.adapters import model_to_train
from scaletrain.distributed.partition import stage_layers
from scaletrain.errors import ConfigError
from scaletrain.memory.activations import build_fake_model
from scaletrain.memory.model_state import ParamInfo, model_state
from scaletrain.memory.planner import CUBLAS_WORKSPACE_BYTES, PlanRequest
from scaletrain.memory.tracker import LiveBytes, storage_key
from scaletrain.models.layer_costs import meta_layer_costs
from scaletrain.precision import get_policy


@dataclass(slots=True)
class StagePlan:
    stage: int
    layers: str
    params: int
    param_bytes: int
    grad_bytes: int
    optimizer_bytes: int
    microbatch: int
    in_flight: int
    held_bytes: int           # one micro-batch, after its forward
    activation_bytes: int
    total_bytes: int

    def to_dict(self) -> dict:
        return asdict(self)


def in_flight(schedule: str, stage: int, stages: int, microbatches: int) -> int:
    """Micro-batches whose activations a stage holds at once under `schedule`."""
    if schedule == "gpipe":
        return microbatches
    if schedule == "1f1b":
        return min(microbatches, stages - stage)
    raise ConfigError(f"plan-memory lays out the gpipe and 1f1b schedules, not {schedule}")


def plan_pipeline(req: PlanRequest, stages: int, microbatches: int, schedule: str = "1f1b",
                  split_points=()) -> list[StagePlan]:
    """The busiest-case bytes of every stage of one replica; `req.devices` is stages x replicas."""
    if req.devices % stages:
        raise ConfigError(f"--devices {req.devices} does not divide into replicas of {stages} stages")
    replicas = req.devices // stages
    if req.batch_size % (replicas * microbatches):
        raise ConfigError(f"global batch {req.batch_size} does not split into {replicas} replica(s) x {microbatches} "
                          f"micro-batches; use a multiple of {replicas * microbatches}")
    micro = req.batch_size // replicas // microbatches
    policy = get_policy(req.precision)
    compute = policy.autocast_dtype or policy.param_dtype
    traced = build_fake_model(req.model, req.model_options, req.input_shape, req.num_classes, policy.param_dtype,
                              req.activation_checkpointing, req.block_classes)
    task = req.make_task(traced.model)
    # Cut as the training cuts: by the layers' costs at this micro-batch, unless the user named cuts.
    costs = None if split_points else meta_layer_costs(
        lambda: model_to_train(req.model, req.input_shape, req.num_classes, **req.model_options),
        req.input_shape, req.num_classes, task, micro, req.activation_checkpointing, req.block_classes)
    groups = stage_layers(traced.model, stages, split_points, costs)
    plans = []
    with traced.fake_mode:
        x, y = req.example_batch(task, micro, policy)
        h = x
        for s, group in enumerate(groups):
            modules = [m for _, m in group]
            params = [p for m in modules for p in m.parameters() if p.requires_grad]
            last = s == len(groups) - 1
            tracker = LiveBytes([*params, *(b for m in modules for b in m.buffers()), h, y])
            with tracker:
                out = h
                with torch.autocast("cpu", dtype=policy.autocast_dtype, enabled=policy.autocast_dtype is not None):
                    for m in modules:
                        out = m(out)
                held = tracker.current
                if last:
                    task.loss(out, y).backward()
                else:
                    out.backward(torch.ones_like(out))
            grads = {storage_key(p.grad) for p in params if p.grad is not None}
            peak = tracker.peak_excluding(grads)
            for p in params:
                p.grad = None
            state = model_state([ParamInfo(tuple(p.shape), -1) for p in params], "ddp", replicas,
                                policy.param_dtype.itemsize, compute.itemsize, req.optimizer, req.momentum)
            k = in_flight(schedule, s, stages, microbatches)
            activations = (k - 1) * held + peak
            names = [n for n, _ in group]
            plans.append(StagePlan(
                stage=s, layers=names[0] if len(names) == 1 else f"{names[0]}..{names[-1]}", params=state.params,
                param_bytes=state.param_bytes, grad_bytes=state.grad_bytes, optimizer_bytes=state.optimizer_bytes,
                microbatch=micro, in_flight=k, held_bytes=held, activation_bytes=activations,
                total_bytes=state.param_bytes + state.grad_bytes + state.optimizer_bytes + activations
                + CUBLAS_WORKSPACE_BYTES))
            h = out.detach().requires_grad_(True)   # the next stage's input, which it backpropagates into
    return plans
