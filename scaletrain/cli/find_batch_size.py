"""`scaletrain find-batch-size`: the largest batch that trains, and the throughput at every size
tried (see memory/batch_finder.py). With --nproc N it runs in N processes under the launcher."""

from __future__ import annotations

import argparse
import json
import sys

from rich.table import Table

from scaletrain.cli.flags import add_number
from scaletrain.console import make_console
from scaletrain.memory.units import format_bytes, parse_bytes


def add_find_batch_size_arguments(parser: argparse.ArgumentParser) -> None:
    from scaletrain.cli.train import add_train_arguments
    add_train_arguments(parser)
    g = parser.add_argument_group("batch-size search")
    add_number(g, "--first-batch-size", int, ge=1, default=1, help="first per-device batch tried (then doubled)")
    add_number(g, "--max-batch-size", int, ge=1, default=65536, help="largest per-device batch tried")
    add_number(g, "--trial-steps", int, ge=1, default=3, help="real training steps per trial (the first untimed)")
    add_number(g, "--margin", float, ge=0, lt=1, default=0.1,
                   help="safety margin: the recommended batch is this fraction below the largest that ran")
    g.add_argument("--memory-limit", default=None, metavar="SIZE",
                   help="memory budget per device, e.g. 2GB (required on CPU, optional on GPU)")
    add_number(g, "--global-batch", int, ge=1, default=None,
                   help="hold this global batch fixed: gradient accumulation makes up what does not fit")
    g.add_argument("--json", action="store_true", help="print the result as JSON")


def run_find_batch_size(args: argparse.Namespace, argv: list[str]) -> int:
    from scaletrain.accelerators import xla
    from scaletrain.cli.train import config_from_args
    from scaletrain.distributed.launch import inside_worker, launch
    xla.refuse_unmodelled("find-batch-size", vars(args).get("device"), "it reads a CUDA device's or a CPU's "
                          "memory, not an XLA device's")
    cfg = config_from_args(args)
    limit = parse_bytes(args.memory_limit, "--memory-limit") if args.memory_limit is not None else None
    if cfg.distributed.nproc > 1 and not inside_worker():
        return launch(cfg.distributed.nproc, 0, cfg.device, list(argv), command="find-batch-size",
                      devices=cfg.distributed.devices)
    from scaletrain.distributed import dist_env
    from scaletrain.memory.batch_finder import find_batch_size
    from scaletrain.training import build_training
    world = dist_env().world_size
    cfg.batch_size = max(cfg.batch_size // world, 1) * world  # any valid plan: the search sets the batch
    with build_training(cfg) as built:
        chief = built.strategy.is_chief
        given = built.dataset.loader_batch
        result = find_batch_size(built.trainer, built.dataset, start=args.first_batch_size,
                                 max_batch=args.max_batch_size, steps=args.trial_steps, margin=args.margin,
                                 memory_limit=limit, global_batch=args.global_batch,
                                 on_trial=_show_trial if chief else None)
    if chief:
        if args.json:
            print(json.dumps(result.to_dict(), indent=2))
        else:
            _print(result, cfg, given)
    return 0


def _show_trial(trial) -> None:
    """Each trial as it ends, on stderr (stdout stays the table or the JSON)."""
    if trial.fits:
        text = (f"fits, peak {format_bytes(trial.peak_bytes) if trial.peak_bytes else '-'}, "
                f"{trial.samples_per_s:,.0f} samples/s")
    else:
        text = f"does not fit ({trial.reason})"
    print(f"find-batch-size: batch {trial.batch_size} per device: {text}", file=sys.stderr, flush=True)


def _print(result, cfg, given: int | None) -> None:
    console = make_console(width=None if sys.stdout.isatty() else 140)
    table = Table(title=f"{cfg.model.name}, {cfg.precision.policy}, {result.devices} device(s)"
                        + (f", budget {format_bytes(result.memory_limit)}" if result.memory_limit else ""))
    for col in ("batch / device", "fits", "peak memory / device", "samples/s"):
        table.add_column(col, justify="right")
    for t in result.trials:
        table.add_row(str(t.batch_size), "yes" if t.fits else f"no ({t.reason})",
                      format_bytes(t.peak_bytes) if t.peak_bytes else "-",
                      f"{t.samples_per_s:,.0f}" if t.samples_per_s else "-")
    console.print(table)
    line = (f"largest batch that ran: {result.max_batch_size} per device; recommended with a "
            f"{result.margin:.0%} margin: {result.recommended_batch_size} per device")
    if result.grad_accum_steps:
        line += (f"; global batch {result.global_batch_size} = {result.replicas} replica(s) x "
                 f"{result.recommended_batch_size} x {result.grad_accum_steps} accumulation steps")
    if result.limited_by:
        line += f"; the search stopped at {result.limited_by}, which still fit (a larger batch may too)"
    if given is not None:    # the search built its own batches; the user's DataLoader batches the run
        line += (f"; the training DataLoader's batch_size is {given}: build it with "
                 f"batch_size={result.recommended_batch_size} to train at this size")
    console.print(line, soft_wrap=True)
