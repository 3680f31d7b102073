"""Before anything runs: the candidates the device and the memory planner let through.

A candidate whose precision the device only emulates (precision/hardware.py: bf16 on a CPU
without bfloat16 instructions, or on a GPU older than Ampere) is discarded, as is one a launch
would refuse, and each one the memory planner predicts will not fit the device (or, on a CPU,
the memory free now).
"""

from __future__ import annotations

from collections.abc import Callable

from scaletrain.config import TrainConfig
from scaletrain.distributed.strategies.registry import strategy_class
from scaletrain.errors import ConfigError, UserError
from scaletrain.experiments.autotune.knobs import emulated_precisions
from scaletrain.experiments.autotune.settings import Row
from scaletrain.memory.planner import Planner, PlanRequest
from scaletrain.memory.units import format_bytes
from scaletrain.precision.hardware import device_facts
from scaletrain.training.preflight import check_job, meta_model


def device_memory(device) -> int:
    """What a candidate may use: the GPU's memory, or the host memory free now."""
    if device.type == "cuda":
        import torch
        return torch.cuda.get_device_properties(device).total_memory
    import psutil
    return psutil.virtual_memory().available


def plan_candidates(base: TrainConfig, grid: list[dict], configure: Callable[[dict], TrainConfig], sample: tuple,
                    memory: int, device, emulated_too: bool = False) -> tuple[list[dict], list[Row]]:
    """(the candidates of `grid` the checks and the planner let through, rows for those they
    discard). `configure` makes a candidate's configuration from its knob values; `sample`: the
    data's (input shape, outputs, task, example). The given configuration (grid[0]) must pass."""
    shape, outputs, task, example = sample
    nproc = base.distributed.nproc
    model = meta_model(base, (shape, outputs))
    # Each process's share: the GPU is its own; a CPU host's memory is shared by all of them.
    memory = memory if device.type == "cuda" else memory // nproc
    planners: dict[tuple, Planner] = {}
    emulated = {} if emulated_too else emulated_precisions(base.precision.policy, device_facts(device))
    kept, discarded = [], []
    for params in grid:
        cfg = configure(params)
        if cfg.precision.policy in emulated:
            discarded.append(Row(params, "discarded", why=emulated[cfg.precision.policy]))
            continue
        try:
            # What a launch would refuse (the strategy's rules about this model and process
            # count, micro-batches that do not divide the batch) is not a candidate.
            check_job(cfg, nproc, model)
        except ConfigError as exc:
            discarded.append(Row(params, "discarded", why=str(exc)))
            continue
        micro = cfg.batch_size // cfg.optim.grad_accum_steps
        strategy = strategy_class(cfg.distributed, nproc)
        # One process per candidate plans as ddp on one device (plan-memory's rule).
        plan_as = strategy.name if strategy.memory_plan == "device" else "ddp"
        key = (cfg.precision.policy, cfg.memory.activation_checkpointing)
        try:
            if key not in planners:
                planners[key] = Planner(PlanRequest(
                    model=cfg.model.name, model_options=dict(cfg.model.options), input_shape=shape,
                    num_classes=outputs, task=task, batch_size=micro, precision=cfg.precision.policy,
                    devices=nproc, activation_checkpointing=cfg.memory.activation_checkpointing,
                    block_classes=tuple(cfg.memory.block_classes), optimizer=cfg.optim.optimizer,
                    distributed=cfg.distributed, example=example, task_choice=cfg.task))
            # Whether this batch fits, not the largest that would: no search over batch sizes.
            plan = planners[key].plan(plan_as, nproc, micro)
            fits = plan.total_bytes <= memory * (1 - planners[key].req.headroom)
        except Exception as exc:   # the user's model raised while traced: this candidate, not the search
            detail = (str(exc).splitlines() or [""])[0][:120]
            discarded.append(Row(params, "discarded", why=f"the model raised while the planner traced it "
                                                          f"({type(exc).__name__}: {detail})"))
            continue
        if fits:
            kept.append(params)
        else:
            discarded.append(Row(params, "discarded", why=f"planner: needs {format_bytes(plan.total_bytes)} of "
                                                          f"{format_bytes(memory)}"
                                                          + (" per process" if nproc > 1 else "")))
    if not kept or kept[0] != grid[0]:
        why = next((r.why for r in discarded if r.params == grid[0]), "")
        raise UserError(f"the given configuration is not a candidate ({why}); make it run and fit first "
                        "(scaletrain plan-memory shows what fits), then tune its speed")
    return kept, discarded
