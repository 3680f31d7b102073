"""`scaletrain sweep batch-size 8,16,32,... [--repeats N] [--lr-scaling ...] [train options]`."""

from __future__ import annotations

import argparse
from datetime import datetime
from pathlib import Path

from scaletrain.cli.flags import add_number


def add_sweep_arguments(parser: argparse.ArgumentParser) -> None:
    from scaletrain.cli.train import add_train_arguments
    sub = parser.add_subparsers(dest="sweep_kind", required=True)
    batch = sub.add_parser("batch-size", allow_abbrev=False,
                           help="throughput and time to accuracy across batch sizes (seed 003's lab), "
                                "each point its own process and its own run")
    batch.add_argument("sizes", metavar="SIZES", help="comma-separated batch sizes, e.g. 8,16,32,64,128,256,512,700")
    add_number(batch, "--repeats", int, ge=1, default=1, help="runs per batch size (seeds seed, seed+1, ...); "
                       "the plots show the median and the min-max spread")
    batch.add_argument("--lr-scaling", dest="sweep_lr_scaling", default="none", choices=("none", "linear", "sqrt"),
                       help="scale the learning rate with the batch size relative to --batch-size (default none)")
    add_number(batch, "--parallel", int, ge=1, default=1, help="points at once, one per device (default 1: "
                       "throughput is measured on an otherwise idle device)")
    batch.add_argument("--out", help="folder for the CSV tables and PNG plots (default: a new folder "
                       "under the run store's folder)")
    add_train_arguments(batch, exclude=("optim.lr_scaling",))


def run_sweep(args: argparse.Namespace, argv: list[str]) -> int:
    from scaletrain.cli.console import wide_console
    from scaletrain.cli.train import config_from_args
    from scaletrain.experiments.sweep import BatchSizeSweep, parse_sizes
    from scaletrain.lifecycle.paths import check_new_output_dir, check_writable_file
    sizes = parse_sizes(args.sizes)
    cfg = config_from_args(args)
    out = Path(args.out) if args.out else (Path(cfg.tracking.store).parent / "sweeps"
                                           / f"{datetime.now():%Y%m%d-%H%M%S}-batch-size")
    check_new_output_dir(out, "--out", "a sweep's results")
    if cfg.tracking.record:
        check_writable_file(cfg.tracking.store, "run store (--store)")
    console = wide_console()
    sweep = BatchSizeSweep(cfg, sizes, args.repeats, args.sweep_lr_scaling, out, args.parallel, console)
    results = sweep.run()
    console.print(sweep.table())
    plots = sweep.write_plots()
    console.print(f"tables: {out / 'points.csv'}, {out / 'summary.csv'}; plots: "
                  f"{', '.join(str(p) for p in plots)}; runs in the store under group {sweep.group} "
                  f"(scaletrain runs report --group {sweep.group})", soft_wrap=True)
    return 0 if any(r.status == "finished" for r in results) else 1
