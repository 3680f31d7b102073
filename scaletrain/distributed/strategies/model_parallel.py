"""Model parallelism (seeds 002 and 004): pipeline stages and tensor-parallel blocks, composed with
data parallelism on one device mesh, built on PyTorch's own engines.

The processes form a (dp, pp, tp) mesh, row-major: `--nproc 4 --stages 2` is two replicas of a
two-stage pipeline (ranks 0-1 and 2-3). Along `tp`, DTensor's `parallelize_module` splits each
repeated block's attention and MLP column-/row-wise (the block states its plan as `TP_PLAN`).
Along `pp`, the model's layers (`pipeline_layers`) are cut into stages balanced by what each
layer costs, its FLOPs and memory at the run's micro-batch (measured on the meta device before
`wrap`: the `CostBalancing` capability; distributed/partition.py), and
`torch.distributed.pipelining` runs a GPipe, 1F1B or interleaved-1F1B schedule over micro-batches.
Along `dp`, gradients are averaged over the replica group after the step's backward (one
all-reduce per dtype of a flattened buffer; DDP's reducer does not take DTensor parameters, and on
a pipeline its overlap is mostly lost to the bubble).

Each process keeps the trainer's model with the layers of other stages replaced by empty
`nn.Identity()`s, so parameter names (state dicts, checkpoints, optimizer state) are the full
model's: DCP reshards a pipeline checkpoint onto one device and back by name.

Only the last stage sees outputs: it computes the task's loss and records the counters and
evaluation sums (`records_metrics`); the trainer's sums over processes then count each replica
once. Gradient clipping uses the norm over all stages (and tensor-parallel shards), as one
device would.
"""

from __future__ import annotations

import contextlib
import inspect

import torch
import torch.distributed as dist
from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor

from scaletrain.distributed.layout import Degrees
from scaletrain.distributed.partition import describe_stages, stage_layers
from scaletrain.distributed.strategies.base import register_strategy
from scaletrain.distributed.strategies.process_group import ProcessGroupStrategy
from scaletrain.distributed.strategies.step_contract import StepContract
from scaletrain.errors import ConfigError
from scaletrain.models.blocks import find_blocks
from scaletrain.optim import squared_norm


def _schedule_classes():
    from torch.distributed.pipelining import Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B
    return {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B, "interleaved-1f1b": ScheduleInterleaved1F1B}


class StageModule(nn.Module):
    """Consecutive layers of the model (the trainer's own module objects, so parameters are
    shared), run in order under the precision policy's autocast."""

    def __init__(self, layers: list[nn.Module], autocast):
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.autocast = autocast

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with self.autocast():
            for layer in self.layers:
                x = layer(x)
        return x


def tensor_parallel_problem(model: nn.Module, ways: int, block_classes=()) -> str | None:
    """Why `model`'s repeated blocks cannot be split `ways` ways (no blocks, no TP_PLAN, a width
    the degree does not divide), or None."""
    try:
        blocks = find_blocks(model, block_classes)
    except ConfigError as exc:
        return f"--strategy tensor/--tensor-parallel splits repeated blocks: {exc}"
    for block in blocks:
        if getattr(block, "TP_PLAN", None) is None:
            return (f"{type(block).__name__} states no tensor-parallel plan (a TP_PLAN of its column- and "
                    "row-wise Linear layers); --tensor-parallel supports the gpt models")
        problem = getattr(block, "tensor_parallel_problem", lambda n: None)(ways)
        if problem:
            return problem
    return None


def apply_tensor_parallel(model: nn.Module, mesh, block_classes=()) -> int:
    """Splits every repeated block of `model` over the 1-D `mesh` by the block's `TP_PLAN`
    ({submodule: "colwise" | "rowwise"}); returns how many blocks were split."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    problem = tensor_parallel_problem(model, mesh.size(), block_classes)
    if problem:
        raise ConfigError(problem)
    styles = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
    blocks = find_blocks(model, block_classes)
    for block in blocks:
        parallelize_module(block, mesh, {name: styles[style]() for name, style in block.TP_PLAN.items()})
    return len(blocks)


class ModelParallelStrategy(ProcessGroupStrategy):
    replicated_gradients = False   # stages hold different gradients: fp16 overflow flags are agreed
    forward_communicates = True    # activations flow between stages; tensor-parallel forwards all-reduce
    memory_plan = None

    def __init__(self, config, env, layout=None):
        super().__init__(config, env, layout)
        self.pp, self.tp = self.layout.stages, self.layout.tensor
        self.options = config.pipeline
        self.microbatches = self.options.microbatch_count() if self.pp > 1 else 1
        self.stage_rank, self.tp_rank, self.replica = self.layout.stage_rank, self.layout.tensor_rank, \
            self.layout.replica_rank
        self.replicas = self.layout.replicas
        self.stages: list = []
        self.holds_last_stage = self.stage_rank == self.pp - 1
        self.stage_names = ""
        self.layer_costs = None    # each pipeline layer's measured cost (CostBalancing), else None
        self._step: StepContract | None = None

    @classmethod
    def degrees(cls, config) -> Degrees:
        return Degrees(stages=config.pipeline.stages, tensor=config.tensor.tensor_parallel)

    @classmethod
    def model_problem(cls, model, layout, config, block_classes=()) -> str | None:
        if config.sync_batchnorm:
            return f"--sync-batchnorm is not supported with --strategy {cls.name}; use --strategy ddp"
        if layout.tensor > 1:
            problem = tensor_parallel_problem(model, layout.tensor, block_classes)
            if problem:
                return problem
        if layout.stages > 1:
            try:
                stage_layers(model, config.pipeline.pipeline_stages(), config.pipeline.split_points)
            except ConfigError as exc:
                return str(exc)
        return None

    def setup(self, device_request: str) -> torch.device:
        device = super().setup(device_request)
        # Row-major, as the layout counts: `Layout.stage_rank` etc. are this mesh's local ranks.
        self.mesh = init_device_mesh(device.type, (self.replicas, self.pp, self.tp), mesh_dim_names=("dp", "pp", "tp"))
        return device

    def describe(self) -> str:
        return (f"{self.replicas} replica(s) x {self.pp} stage(s) x {self.tp} tensor-parallel"
                + (f", {self.options.schedule} over {self.microbatches} micro-batches; {self.stage_names}"
                   if self.pp > 1 else ""))

    # -- the model
    def costed_micro_batch(self, per_replica_batch: int) -> int | None:
        if self.pp == 1 or self.options.split_points:
            return None
        return max(per_replica_batch // self.microbatches, 1)

    def balance_by(self, costs) -> None:
        self.layer_costs = costs

    def wrap(self, model: nn.Module, compile_fn, block_classes=(), policy=None):
        problem = self.model_problem(model, self.layout, self.config, block_classes)
        if problem:
            raise ConfigError(problem)
        if self.tp > 1:
            apply_tensor_parallel(model, self.mesh["tp"], block_classes)
        self.model = model
        if self.pp == 1:
            forward = compile_fn(model)
            return forward, forward
        autocast = (lambda: policy.autocast(self.device)) if policy is not None else contextlib.nullcontext
        return self._wrap_pipeline(model, compile_fn, autocast)

    def _wrap_pipeline(self, model, compile_fn, autocast):
        from torch.distributed.pipelining import PipelineStage
        n_stages = self.options.pipeline_stages()
        groups = stage_layers(model, n_stages, self.options.split_points, self.layer_costs)
        self.stage_names = describe_stages(groups, self.layer_costs)
        local = [i for i in range(n_stages) if i % self.pp == self.stage_rank]
        owned = {name for i in local for name, _ in groups[i]}
        for name, _ in (layer for group in groups for layer in group):
            if name not in owned:
                model.set_submodule(name, nn.Identity())   # another stage's: freed here
        self.holds_last_stage = (n_stages - 1) in local
        pp_group = self.mesh.get_group("pp")
        self.stages, self.eval_stages = [], []
        for i in local:
            sub = StageModule([layer for _, layer in groups[i]], autocast)
            self.stages.append(PipelineStage(compile_fn(sub), i, n_stages, self.device, group=pp_group))
            # Evaluation runs whole batches (one micro-batch each) through stages of its own: a
            # stage fixes its activation shapes at its first step.
            self.eval_stages.append(PipelineStage(compile_fn(sub), i, n_stages, self.device, group=pp_group))
        cls = _schedule_classes()[self.options.schedule]
        multi = self.options.schedule == "interleaved-1f1b"
        self.schedule = cls(self.stages if multi else self.stages[0], n_microbatches=self.microbatches,
                            loss_fn=self._loss)
        self._step_kwargs = ({"return_outputs": False}
                             if "return_outputs" in inspect.signature(cls.step).parameters else {})
        self.eval_schedule = (cls(self.eval_stages, n_microbatches=1) if multi
                              else _schedule_classes()["gpipe"](self.eval_stages[0], n_microbatches=1))
        return self._no_direct_forward, self._no_direct_forward

    @staticmethod
    def _no_direct_forward(x):
        raise RuntimeError("a pipeline stage is run by its schedule (strategy.forward_backward / evaluate)")

    # -- the step
    def _loss(self, output: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The last stage's loss of one micro-batch, recorded as one of the step's equal shares;
        the schedule divides the gradients by the micro-batch count (the mean over the batch)."""
        step = self._step
        loss = step.task.loss(output, y)
        step.record(loss, output, y, parts=self.microbatches)
        return step.scaler.scale_loss(loss) if step.scaler is not None else loss

    def forward_backward(self, step: StepContract, x: torch.Tensor, y: torch.Tensor) -> None:
        if self.pp == 1:
            return super().forward_backward(step, x, y)
        if step.grad_accum_steps > 1:
            raise ConfigError("gradient accumulation under --strategy pipeline is its micro-batches: set "
                              "--microbatches instead of --grad-accum-steps")
        if not isinstance(x, torch.Tensor):
            raise ConfigError("--strategy pipeline feeds its first stage one input tensor; these samples have "
                              f"several inputs ({', '.join(x)}): train them with ddp, fsdp or tensor")
        if x.shape[0] % self.microbatches:
            raise ConfigError(f"the per-replica batch {x.shape[0]} does not split into {self.microbatches} equal "
                              f"micro-batches; use a --batch-size divisible by {self.microbatches * self.replicas}")
        self._step = step
        args = (x,) if self.stage_rank == 0 else ()
        target = y if self.holds_last_stage else None
        self.schedule.step(*args, target=target, losses=[] if self.holds_last_stage else None, **self._step_kwargs)

    def optimizer_step(self, step: StepContract) -> None:
        if self.replicas > 1:
            self._average_over_replicas(step.params)
        found_inf = step.unscale_()
        if found_inf is not None:
            self.all_reduce_max_(found_inf)
        step.clip_(self._total_sq_norm)
        step.update(found_inf, clipped=True)

    @torch.no_grad()
    def _average_over_replicas(self, params: list[nn.Parameter]) -> None:
        """Averages this process's gradients with the other replicas' (same stage, same shard)."""
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for p in params:
            if p.grad is not None:
                g = p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad
                by_dtype.setdefault(g.dtype, []).append(g)
        for grads in by_dtype.values():
            flat = _flatten_dense_tensors(grads)
            dist.all_reduce(flat, group=self.mesh.get_group("dp"))
            flat /= self.replicas
            torch._foreach_copy_(grads, list(_unflatten_dense_tensors(flat, grads)))

    def _total_sq_norm(self, grads: list[torch.Tensor]) -> torch.Tensor:
        """The whole model's squared gradient norm: tensor-parallel shards summed over `tp`,
        replicated tensors counted once, stages summed over `pp`."""
        def sq_norm(tensors):
            return squared_norm(tensors, self.device)
        def sharded(g):
            return isinstance(g, DTensor) and any(p.is_shard() for p in g.placements)
        sq = sq_norm([g.to_local() for g in grads if sharded(g)])
        if self.tp > 1:
            dist.all_reduce(sq, group=self.mesh.get_group("tp"))
        # Replicated tensors (plain, or DTensors such as a row-wise layer's bias) count once.
        sq = sq + sq_norm([g.to_local() if isinstance(g, DTensor) else g for g in grads if not sharded(g)])
        if self.pp > 1:
            dist.all_reduce(sq, group=self.mesh.get_group("pp"))
        return sq

    # -- evaluation
    def evaluate(self, batches, forward, pad_input=None):
        if self.pp == 1:
            yield from super().evaluate(batches, forward, pad_input)
            return
        size = None
        for x, y in batches:
            # One shape per stage: every batch is padded to the first one's size.
            size = size or x.shape[0]
            n = x.shape[0]
            if n < size:
                x = torch.cat([x, x[:1].expand(size - n, *x.shape[1:])])
            output = self.eval_schedule.eval(x) if self.stage_rank == 0 else self.eval_schedule.eval()
            if self.holds_last_stage:
                yield output[:n], y

    def full_state_dict(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """The whole model's weights on rank 0 (tensor-parallel shards gathered, stages collected);
        the other ranks get their own part. Every rank must call it."""
        own = {k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().cpu()
               for k, v in model.state_dict().items()}
        if self.pp == 1 or self.replica != 0 or self.tp_rank != 0:
            return own
        # This process's pp group is replica 0's stages at tensor-parallel rank 0: rank 0 is in it.
        parts = [None] * self.pp if self.is_chief else None
        dist.gather_object(own, parts, dst=0, group=self.mesh.get_group("pp"))
        if not self.is_chief:
            return own
        merged = {}
        for part in parts:
            merged.update(part)
        return merged


@register_strategy("pipeline")
class PipelineStrategy(ModelParallelStrategy):
    """--strategy pipeline --stages P [--tensor-parallel T]."""
    traffic = "pipeline"
    memory_plan = "stage"


@register_strategy("tensor")
class TensorParallelStrategy(ModelParallelStrategy):
    """--strategy tensor --tensor-parallel T."""
    traffic = "tensor"
