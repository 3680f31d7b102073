"""Global batch, per-replica batch and gradient accumulation: the user fixes one, the rest follow.

    global batch = replicas x per-replica batch,  per-replica batch = accumulation steps x micro-batch

DDP averages gradients over replicas and the step averages over micro-batches, so one optimizer
step always sees the mean gradient of `global_batch` samples, whatever the split.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from scaletrain.errors import ConfigError


@dataclass(frozen=True, slots=True)
class BatchDivision:
    global_batch: int   # samples per optimizer step, all replicas together
    per_replica: int    # samples one replica processes per optimizer step
    accum_steps: int    # micro-batches per replica per optimizer step
    replicas: int
    source: str = ""    # where the per-replica batch came from, where not the configuration

    @property
    def micro_batch(self) -> int:
        return self.per_replica // self.accum_steps

    def describe(self) -> str:
        text = f"global batch {self.global_batch} = {self.replicas} replica(s) x {self.per_replica}"
        if self.accum_steps > 1:
            text += f" (micro-batch {self.micro_batch} x {self.accum_steps} accumulation steps)"
        if self.source:
            text += f"; {self.per_replica} per process: {self.source}"
        return text


def _nearby_multiples(value: int, unit: int) -> str:
    below = (value // unit) * unit
    options = [v for v in (below, below + unit) if v > 0]
    return " or ".join(str(v) for v in options)


def divide_batch(global_batch: int, per_replica_batch: int | None, replicas: int, accum_steps: int = 1,
               accumulate_to_global: bool = False) -> BatchDivision:
    """Resolves the batch sizes for `replicas` replicas, or raises a ConfigError that suggests valid sizes.

    - only the global batch: it is split evenly across replicas;
    - a per-replica batch: the global batch follows from it (global = replicas x per-replica);
    - both, with `accumulate_to_global`: the global batch is held fixed and gradient
      accumulation makes up the difference (per-replica batch = micro-batch per step).
    """
    if replicas < 1:
        raise ConfigError(f"the number of replicas must be at least 1 (got {replicas})")
    if per_replica_batch is not None and per_replica_batch < 1:
        raise ConfigError(f"config key 'per_replica_batch_size' must be at least 1 (got {per_replica_batch})")
    if per_replica_batch is not None and accumulate_to_global:
        unit = per_replica_batch * replicas
        if global_batch % unit:
            raise ConfigError(
                f"global batch {global_batch} is not a multiple of {replicas} replica(s) x per-replica batch "
                f"{per_replica_batch} = {unit}, so gradient accumulation cannot make it up; use --batch-size "
                f"{_nearby_multiples(global_batch, unit)}")
        steps = global_batch // unit
        return BatchDivision(global_batch, per_replica_batch * steps, steps, replicas)
    if per_replica_batch is not None:
        if per_replica_batch % accum_steps:
            raise ConfigError(
                f"per-replica batch {per_replica_batch} is not divisible by optim.grad_accum_steps {accum_steps}; "
                f"use --per-replica-batch-size {_nearby_multiples(per_replica_batch, accum_steps)}")
        return BatchDivision(per_replica_batch * replicas, per_replica_batch, accum_steps, replicas)
    unit = replicas * accum_steps
    if global_batch % unit:
        what = f"{replicas} replica(s)" + (f" x {accum_steps} accumulation steps" if accum_steps > 1 else "")
        raise ConfigError(
            f"global batch {global_batch} does not divide across {what}; use --batch-size "
            f"{_nearby_multiples(global_batch, unit)}, or fix --per-replica-batch-size instead"
            + (" (add --accumulate-to-global to keep this global batch with gradient accumulation)"
               if replicas > 1 else ""))
    return BatchDivision(global_batch, global_batch // replicas, accum_steps, replicas)


LOADER_BATCH = "the training DataLoader's batch_size"


def loader_batch(given: int, per_replica_batch: int | None, replicas: int, accum_steps: int = 1) -> BatchDivision:
    """The batch plan where the user's training DataLoader batches the data itself: its
    batch_size is each process's batch (each process reads its own batches of that size), whatever
    the configuration's global batch says; refused where the configuration names another
    per-process batch."""
    if per_replica_batch is not None and per_replica_batch != given:
        raise ConfigError(f"the training DataLoader's batch_size is {given} but per_replica_batch_size is "
                          f"{per_replica_batch}; leave per_replica_batch_size unset to take the DataLoader's, "
                          "or pass the Dataset and let the trainer batch it")
    return dataclasses.replace(divide_batch(given * replicas, given, replicas, accum_steps), source=LOADER_BATCH)


def adopt_loader_batch(cfg, given: int | None, replicas: int) -> None:
    """Writes a training DataLoader's batch into a command's configuration (`given`: its
    batch_size, None where the trainer batches the data), so that what the command plans, searches,
    records and resumes is the batch that trains."""
    if given is not None:
        cfg.batch_size = loader_batch(given, cfg.per_replica_batch_size, replicas,
                                      cfg.optim.grad_accum_steps).global_batch
