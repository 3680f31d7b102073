"""What a launch checks before any worker starts: a mistake is then one line and exit 2 in the
launching process, not the same traceback from every rank.

    layout (Layout.build) -> batch plan -> the model on the meta device against the strategy's
    model rules (Strategy.model_problem) and the memory options -> the weights --init-from reads
    -> the checkpoint a resume loads

Each check is the one the workers run as they build (a job started by plain torchrun has no
launcher of ours), asked earlier: nothing here has a rule of its own, and nothing here allocates
a parameter (the model is built on the meta device) or writes a file.
"""

from __future__ import annotations

import torch

from scaletrain.adapters import model_to_train
from scaletrain.checkpoint.weights import check_fits, read_weights, weights_flag
from scaletrain.config import TrainConfig
from scaletrain.data.registry import sample_and_example, sample_shape
from scaletrain.distributed.batching import divide_batch
from scaletrain.distributed.layout import Layout
from scaletrain.distributed.strategies.registry import strategy_class
from scaletrain.errors import ConfigError
from scaletrain.models.blocks import find_blocks
from scaletrain.models.structure import structure_of
from scaletrain.training.device_rules import device_problem


def meta_model(cfg: TrainConfig, sample: tuple | None = None) -> torch.nn.Module:
    """The model `cfg` trains, built on the meta device: its structure without its memory (a
    builder that computes with tensor values is built for real: models/structure.py).
    `sample`: (input shape, output size) where the caller has them (else read from the data set)."""
    from scaletrain.user_code.lightning import names_lightning_module
    input_shape, outputs = sample if sample is not None else sample_shape(cfg.data)[:2]
    # A LightningModule is built from its own arguments: the shapes do not name its structure.
    shapes = None if names_lightning_module(cfg.model.name) else (tuple(input_shape), outputs)
    key = (cfg.model.name, shapes, repr(sorted(cfg.model.options.items())))
    return structure_of(lambda: model_to_train(cfg.model.name, input_shape, outputs, **cfg.model.options), key)


def settle_model_optimizer(cfg: TrainConfig) -> bool:
    """Writes into `cfg` the optimizer settings its model brings (a LightningModule's
    configure_optimizers, read off the model built on the meta device), before a run records its
    configuration: the record, the store and a resume then hold what trains. The trainer applies
    the same settings again (the Python API's path): the same values. Returns whether it wrote."""
    from scaletrain.user_code.importing import import_function
    from scaletrain.user_code.lightning import names_lightning_module
    if not names_lightning_module(cfg.model.name):
        # 'module' is what a LightningModule's own scheduler sets; a builder function may still
        # return one (its trainer reads it then), anything else has no schedule to bring.
        named = import_function(cfg.model.name, "model") if ":" in cfg.model.name else None
        if cfg.optim.lr_schedule == "module" and (named is None or isinstance(named, type)):
            raise ConfigError(f"--lr-schedule module reads a LightningModule's own scheduler; {cfg.model.name} is "
                              "not one: choose constant, step, cosine or onecycle")
        return False
    model = meta_model(cfg, ((1,), 1))    # a LightningModule is built from its own arguments: no shapes needed
    cfg.optim = model.optim_settings(cfg.optim, cfg.epochs)
    return True


def run_task(cfg: TrainConfig, sample: tuple | None = None):
    """The task a run of `cfg` trains: the one `--task` names, or under `auto` the one the model
    brings, its own loss where its forward takes labels (asked of the model on the meta device) or
    the data's. `sample`: (input shape, output size, data task, example or None) where the caller
    has them (`example`: the data's first samples; else the data task's example batch)."""
    from scaletrain.tasks import TASKS, build_task
    shape, outputs, data_task, example = (sample if sample is not None else sample_and_example(cfg.data))[:4]
    model = meta_model(cfg, (shape, outputs))
    if example is None and hasattr(model, "own_task"):   # what the model's own task reads its metrics off
        example = TASKS.get(data_task)().example_batch(2, shape, outputs, torch.float32)
    return build_task(cfg.task, data_task, model, example)


def layer_costs_of(cfg: TrainConfig, micro_batch: int) -> list:
    """What each pipeline layer of the model `cfg` trains costs at `micro_batch` (models/
    layer_costs.py), measured on the meta device."""
    from scaletrain.models.layer_costs import meta_layer_costs
    from scaletrain.tasks import TASKS
    input_shape, outputs, task = sample_shape(cfg.data)
    return meta_layer_costs(lambda: model_to_train(cfg.model.name, input_shape, outputs, **cfg.model.options),
                            input_shape, outputs, TASKS[task](), micro_batch,
                            cfg.memory.activation_checkpointing, tuple(cfg.memory.block_classes))


def host_memory_available() -> int | None:
    """Bytes the host can still give a process (Linux's MemAvailable), or None where unknown."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def model_memory_problem(cfg: TrainConfig, model: torch.nn.Module) -> str | None:
    """Why the whole model (`model` on the meta device) cannot even be built in this host's
    memory, where every process builds it before any strategy shards it (one line), or None."""
    size = sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))
    available = host_memory_available()
    if available is None or size <= available:
        return None
    options = f" with --model-option {', '.join(f'{k}={v}' for k, v in cfg.model.options.items())}" \
        if cfg.model.options else ""
    return (f"--model {cfg.model.name}{options} holds {size / 2**30:.2f} GiB of parameters and buffers, more than "
            f"the {available / 2**30:.2f} GiB this host has available to build it in; pass smaller model options")


def model_problem(cfg: TrainConfig, model: torch.nn.Module, layout: Layout) -> str | None:
    """Why `model` cannot be trained as `cfg` and `layout` ask (one line, with the fix), or None."""
    problem = model_memory_problem(cfg, model)
    if problem:
        return problem
    block_classes = tuple(cfg.memory.block_classes)
    if cfg.memory.activation_checkpointing:
        try:
            find_blocks(model, block_classes)
        except ConfigError as exc:
            return f"--activation-checkpointing recomputes repeated blocks: {exc}"
    return strategy_class(cfg.distributed, layout.world).model_problem(model, layout, cfg.distributed, block_classes)


def check_job(cfg: TrainConfig, world: int, model: torch.nn.Module | None = None) -> Layout:
    """The layout of a job of `world` processes training `cfg`, checked: its process counts, its
    batch plan, the device it names and the strategy's rules about the model (`model`: built on
    the meta device, or None to build it here). Raises ConfigError. Autotune asks it of every candidate."""
    strategy = strategy_class(cfg.distributed, world)
    problem = device_problem(cfg, strategy, world)
    if problem:
        raise ConfigError(problem)
    layout = Layout.build(strategy, cfg.distributed, world)
    divide_batch(cfg.batch_size, cfg.per_replica_batch_size, layout.replicas, cfg.optim.grad_accum_steps,
               cfg.accumulate_to_global)
    problem = model_problem(cfg, model if model is not None else meta_model(cfg), layout)
    if problem:
        raise ConfigError(problem)
    return layout


def preflight(cfg: TrainConfig, world: int, checkpointer=None) -> Layout:
    """Checks a job of `world` processes before it starts; returns its layout. `checkpointer`: the
    run's (None: nothing to resume), whose choice of checkpoint is verified here. Raises
    ConfigError/UserError."""
    model = meta_model(cfg)
    layout = check_job(cfg, world, model)
    if cfg.model.init_from is not None:   # the weights fit the model (names and shapes), read on the host
        flag = weights_flag(cfg.model.init_from)
        check_fits(model, read_weights(cfg.model.init_from, flag), cfg.model.init_from, flag)
    if checkpointer is not None:
        checkpointer.find()   # verified against its manifest: raises UserError when none can be trusted
    return layout
