"""[distributed.pipeline] and [distributed.tensor]: the options of the model-parallel strategies
(model_parallel.py), in a module of their own that imports no torch, so the command line and the
config see them without importing the strategy."""

from __future__ import annotations

from dataclasses import dataclass

from scaletrain.config import register_table
from scaletrain.options import option as _f

PIPELINE_SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b")


@dataclass(kw_only=True, slots=True)
class PipelineOptions:
    """[distributed.pipeline]: processes = replicas x stages x tensor-parallel degree."""
    stages: int = _f(1, "pipeline stages per replica (--strategy pipeline)", ge=1)
    microbatches: int | None = _f(None, "micro-batches per step flowing through the pipeline (default: 2 x stages)",
                                  ge=1)
    schedule: str = _f("1f1b", "pipeline schedule: gpipe, 1f1b or interleaved-1f1b", choices=PIPELINE_SCHEDULES)
    virtual_stages: int = _f(2, "interleaved-1f1b: stages each process holds (the model is cut into stages x this)",
                             ge=1)
    split_points: list[str] = _f([], "layer names where the 2nd, 3rd, ... stage begins, e.g. blocks.2 (default: "
                                     "balanced by parameter count)")

    def pipeline_stages(self) -> int:
        """The pieces the model is cut into: the stages, times each process's share under interleaving."""
        return self.stages * (self.virtual_stages if self.schedule == "interleaved-1f1b" else 1)

    def microbatch_count(self) -> int:
        return self.microbatches if self.microbatches is not None else 2 * self.stages

    def problem(self, cfg) -> str | None:
        if self.stages < 2:
            return "--strategy pipeline needs --stages 2 or more"
        if self.microbatch_count() < self.stages:
            return (f"--microbatches {self.microbatch_count()} is fewer than --stages {self.stages}: stages would "
                    f"idle and 1F1B cannot fill the pipeline; use --microbatches {self.stages} or more")
        batch, flag = ((cfg.per_replica_batch_size, "--per-replica-batch-size") if cfg.per_replica_batch_size
                       else (cfg.batch_size, "--batch-size"))
        if batch % self.microbatch_count():
            return (f"{flag} {batch} does not split into {self.microbatch_count()} equal micro-batches; use a "
                    f"multiple of {self.microbatch_count()}, or --microbatches that divides {batch}")
        if self.split_points and len(self.split_points) != self.pipeline_stages() - 1:
            n = self.pipeline_stages()
            return (f"--split-points names {len(self.split_points)} layer(s); {n} pipeline stages need {n - 1} "
                    f"(where stages 2..{n} begin)")
        return None


@dataclass(kw_only=True, slots=True)
class TensorOptions:
    """[distributed.tensor]: the tensor-parallel degree, alone or inside each pipeline stage."""
    tensor_parallel: int = _f(1, "processes each transformer block's attention and MLP are split over "
                                 "(column-/row-wise)", ge=1)

    def problem(self, cfg) -> str | None:
        if cfg.distributed.strategy == "tensor" and self.tensor_parallel < 2:
            return "--strategy tensor needs --tensor-parallel 2 or more"
        return None


register_table("pipeline", PipelineOptions, owners=("pipeline",))
register_table("tensor", TensorOptions, owners=("tensor", "pipeline"))
