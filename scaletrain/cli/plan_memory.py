"""`scaletrain plan-memory`: per-device memory of a configuration across strategies, before
anything runs (see memory/planner.py), as a table like seed 004's or as JSON.

The planner is imported by `run_plan_memory`: building the parser (`--help`) must not import torch."""

from __future__ import annotations

import argparse
import json
import sys

from rich.table import Table

from scaletrain.cli.flags import add_number
from scaletrain.console import make_console
from scaletrain.distributed.batching import adopt_loader_batch
from scaletrain.errors import ConfigError
from scaletrain.memory.units import format_bytes, parse_bytes


def add_plan_memory_arguments(parser: argparse.ArgumentParser) -> None:
    from scaletrain.cli.train import add_train_arguments
    add_train_arguments(parser, exclude=("distributed.devices",))   # here --devices is a count to plan for
    g = parser.add_argument_group("memory plan")
    add_number(g, "--devices", int, ge=1, default=1, help="devices the global batch is split over")
    g.add_argument("--device-memory", default=None, metavar="SIZE",
                   help="memory of one device, e.g. 80GB or 80GiB: adds the largest batch that fits")
    add_number(g, "--headroom", float, ge=0, lt=1, default=0.05,
                   help="fraction of --device-memory kept free (allocator fragmentation, CUDA context)")
    g.add_argument("--json", action="store_true", help="print the plans as a JSON list")


def _choices(text: str, default: tuple[str, ...]) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()] if text not in ("auto", "all") else list(default)


def run_plan_memory(args: argparse.Namespace, argv: list[str]) -> int:
    from scaletrain.accelerators import xla
    from scaletrain.cli.train import config_from_args
    from scaletrain.data.registry import sample_and_example
    from scaletrain.distributed import STRATEGIES
    from scaletrain.memory.model_state import PLAN_STRATEGIES
    from scaletrain.memory.planner import Planner, PlanRequest
    from scaletrain.precision import get_policy
    from scaletrain.precision.alignment import alignment_warnings
    from scaletrain.training.defaults import settle_precision_here
    # --precision and --strategy take comma lists here: taken out before the config (one value
    # each) is built and checked, and each name checked on its own below.
    values = vars(args)
    xla.refuse_unmodelled("plan-memory", values.get("device"), "its memory model is a CUDA device's caching "
                          "allocator and a CPU's resident memory")
    named = values.get("distributed.strategy")
    if named in STRATEGIES and STRATEGIES[named].memory_plan == "stage":
        return _plan_stages(config_from_args(args), args)     # a row per stage of one replica
    strategy_list, precision_list = values.pop("distributed.strategy", "auto"), values.pop("precision.policy", None)
    strategies = _choices(strategy_list, PLAN_STRATEGIES)
    cfg = _config_for_any(args, [name for name in strategies if name in PLAN_STRATEGIES])
    precisions = [t.strip() for t in (precision_list or cfg.precision.policy).split(",") if t.strip()]
    auto_note = None
    if "auto" in precisions:
        # The device this machine would train on; a plan for another device names its policy.
        settled = settle_precision_here(cfg)
        precisions = [settled.value if p == "auto" else p for p in precisions]
        auto_note = (f"--precision auto is {settled.value} here ({settled.why.removeprefix('auto: ')}); on a GPU of "
                     "compute capability 8.0 or newer it is bf16-mixed: name --precision to plan for another device")
    for name in strategies:
        if name not in PLAN_STRATEGIES:
            raise ConfigError(f"unknown strategy '{name}' for plan-memory; choose from: {', '.join(PLAN_STRATEGIES)}, "
                              f"or {', '.join(n for n, c in STRATEGIES.items() if c.memory_plan == 'stage')} (alone: "
                              "a row per stage)")
    for name in precisions:
        get_policy(name)
    memory = parse_bytes(args.device_memory, "--device-memory") if args.device_memory is not None else None
    shape, classes, task, example, given = sample_and_example(cfg.data)
    adopt_loader_batch(cfg, given, args.devices)    # the batch that trains is the one planned
    plans = []
    for precision in precisions:
        req = PlanRequest(model=cfg.model.name, model_options=dict(cfg.model.options), input_shape=shape,
                          num_classes=classes, task=task, batch_size=cfg.batch_size, precision=precision,
                          devices=args.devices, activation_checkpointing=cfg.memory.activation_checkpointing,
                          block_classes=tuple(cfg.memory.block_classes), optimizer=cfg.optim.optimizer,
                          momentum=cfg.optim.momentum, device_memory=memory, headroom=args.headroom,
                          distributed=cfg.distributed, example=example, task_choice=cfg.task,
                          precision_options=cfg.precision)
        planner = Planner(req)
        plans += [planner.plan(s, args.devices, cfg.batch_size) for s in strategies]
        if not args.json:
            for warning in alignment_warnings(planner.traced.model, precision, cfg.batch_size // args.devices):
                print(f"scaletrain: note: {warning}", file=sys.stderr)
    if args.json:
        print(json.dumps([p.to_dict() for p in plans], indent=2))
        return 0
    _print_table(plans, cfg, args.devices, memory)
    if given is not None:
        print(f"note: global batch {cfg.batch_size} = {args.devices} device(s) x {given}, the training DataLoader's "
              "batch_size (it batches the data, not --batch-size)")
    if auto_note:        # after the plan: a refusal stays the one line it is
        print(f"note: {auto_note}")
    return 0


def _config_for_any(args: argparse.Namespace, strategies: list[str]):
    """The config under the first listed strategy it is valid for: a strategy's own option (e.g.
    --cpu-offload) is checked against the strategies that read it, and the rows of the others
    ignore it."""
    from scaletrain.cli.train import config_from_args
    first_error = None
    for name in strategies or ["auto"]:
        vars(args)["distributed.strategy"] = name
        try:
            return config_from_args(args)
        except ConfigError as exc:
            first_error = first_error or exc
        finally:
            vars(args).pop("distributed.strategy", None)
    raise first_error


def _print_table(plans, cfg, devices: int, memory: int | None) -> None:
    console = make_console(width=None if sys.stdout.isatty() else 160)
    ac = "with" if cfg.memory.activation_checkpointing else "without"
    table = Table(title=f"{cfg.model.name}: {plans[0].params / 1e6:.2f}M parameters, global batch {cfg.batch_size} "
                        f"over {devices} device(s), {cfg.optim.optimizer}, {ac} activation checkpointing "
                        "(bytes per device)")
    host = any(p.host_bytes for p in plans)
    for col in ("precision", "strategy", "params", "grads", "optimizer", "gathered", "activations", "total"):
        table.add_column(col, justify="right" if col not in ("precision", "strategy") else "left")
    if host:
        table.add_column("on the host (cpu offload)", justify="right")
    if memory is not None:
        table.add_column(f"max batch in {format_bytes(memory)}", justify="right")
    for p in plans:
        row = [p.precision, p.strategy, format_bytes(p.param_bytes), format_bytes(p.grad_bytes),
               format_bytes(p.optimizer_bytes), format_bytes(p.gathered_param_bytes), format_bytes(p.activation_bytes),
               format_bytes(p.total_bytes) + ("" if p.fits in (None, True) else " (does not fit)")]
        if host:
            row.append(format_bytes(p.host_bytes))
        if memory is not None:
            row.append(f"{p.max_batch_size} ({p.max_per_device_batch_size}/device)")
        table.add_row(*row)
    console.print(table)
    console.print("total = params + grads + optimizer + gathered + activations + 32 MiB cuBLAS workspace; "
                  "activations traced on fake tensors (one forward/backward), not estimated", soft_wrap=True)
    if host:
        console.print("--cpu-offload: each rank's parameter, gradient and optimizer shards are in host memory (the "
                      "host column), so the device holds the gathered parameters and the activations", soft_wrap=True)


def _plan_stages(cfg, args: argparse.Namespace) -> int:
    """A row per stage of one replica (memory/pipeline_plan.py)."""
    from scaletrain.data.registry import sample_and_example
    from scaletrain.memory.pipeline_plan import plan_pipeline
    from scaletrain.memory.planner import PlanRequest
    from scaletrain.training.defaults import settle_precision_here
    settle_precision_here(cfg)
    d = cfg.distributed.pipeline
    devices = args.devices if args.devices > 1 else d.stages
    shape, classes, task, example, given = sample_and_example(cfg.data)
    adopt_loader_batch(cfg, given, devices // d.stages)
    req = PlanRequest(model=cfg.model.name, model_options=dict(cfg.model.options), input_shape=shape,
                      num_classes=classes, task=task, batch_size=cfg.batch_size, precision=cfg.precision.policy,
                      devices=devices, activation_checkpointing=cfg.memory.activation_checkpointing,
                      block_classes=tuple(cfg.memory.block_classes), optimizer=cfg.optim.optimizer,
                      momentum=cfg.optim.momentum, example=example, task_choice=cfg.task)
    stages = plan_pipeline(req, d.stages, d.microbatch_count(), d.schedule, d.split_points)
    if args.json:
        print(json.dumps([p.to_dict() for p in stages], indent=2))
        return 0
    console = make_console(width=None if sys.stdout.isatty() else 160)
    table = Table(title=f"{cfg.model.name}: {d.stages} stages x {devices // d.stages} replica(s), {d.schedule} over "
                        f"{d.microbatch_count()} micro-batches of {stages[0].microbatch}, {cfg.precision.policy}, "
                        f"{cfg.optim.optimizer} (bytes per device)")
    for col in ("stage", "layers", "params", "grads", "optimizer", "in flight", "activations", "total"):
        table.add_column(col, justify="left" if col == "layers" else "right")
    for p in stages:
        table.add_row(str(p.stage), p.layers, format_bytes(p.param_bytes), format_bytes(p.grad_bytes),
                      format_bytes(p.optimizer_bytes), str(p.in_flight), format_bytes(p.activation_bytes),
                      format_bytes(p.total_bytes))
    console.print(table)
    console.print("activations = (in flight - 1) x one micro-batch's held bytes + its forward/backward peak, each "
                  "stage traced on fake tensors; total adds the 32 MiB cuBLAS workspace", soft_wrap=True)
    return 0
