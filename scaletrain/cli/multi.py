"""`scaletrain multi CONFIG ...` and `scaletrain ensemble RUN_ID ...`."""

from __future__ import annotations

import argparse
import json
from datetime import datetime
from pathlib import Path

from rich.text import Text

from scaletrain.cli.flags import add_number, add_trust_code
from scaletrain.tracking.store import DEFAULT_STORE


def add_multi_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("configs", nargs="+", metavar="CONFIG", help="TOML training configs, one training each")
    add_number(parser, "--parallel", int, ge=1, help="trainings at once (default: one per GPU, else one per core)")
    parser.add_argument("--out", help="folder for the runs (default: a new folder under the run store's folder)")
    parser.add_argument("--group", help="the runs' group in the store (default: multi-<time>)")
    parser.add_argument("--store", help="record every run in this store (default: each config's own)")


def add_ensemble_arguments(parser: argparse.ArgumentParser) -> None:
    add_trust_code(parser)
    from scaletrain.cli.train import add_train_arguments
    parser.add_argument("run_ids", nargs="+", metavar="RUN_ID", help="runs with saved models (model.pt)")
    parser.add_argument("--store", default=str(DEFAULT_STORE), help=f"the run store (default {DEFAULT_STORE})")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    # --nproc and --devices as `train` has them: each process predicts its share of the members.
    add_train_arguments(parser.add_argument_group("processes (as for train; default: one process)"),
                        only=("distributed.nproc", "distributed.devices"))
    parser.add_argument("--data-dir", help="where the data set's files are now (default: as the runs recorded)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def run_multi(args: argparse.Namespace, argv: list[str]) -> int:
    from scaletrain.cli.console import wide_console
    from scaletrain.experiments.multi import train_side_by_side
    from scaletrain.lifecycle.paths import check_new_output_dir, check_writable_file
    from scaletrain.reports.compare import compare_table
    stamp = f"{datetime.now():%Y%m%d-%H%M%S}"
    group = args.group or f"multi-{stamp}"
    out = Path(args.out) if args.out else Path(args.store or DEFAULT_STORE).parent / "multi" / stamp
    check_new_output_dir(out, "--out", "runs")
    if args.store:
        check_writable_file(args.store, "--store")
    console = wide_console()
    records = train_side_by_side(args.configs, out, args.parallel, group, args.store, console)
    console.print(compare_table(records))
    return 0 if all(r.status == "finished" for r in records) else 1


def run_ensemble(args: argparse.Namespace, argv: list[str]) -> int:
    from rich.table import Table

    from scaletrain.cli.console import wide_console
    from scaletrain.cli.train import given_overrides
    from scaletrain.config import TrainConfig
    from scaletrain.distributed.launch import inside_worker, launch
    from scaletrain.distributed.strategies.registry import build_layout
    from scaletrain.errors import UserError
    from scaletrain.experiments.ensemble import check_members, evaluate_ensemble
    from scaletrain.options import from_mapping
    from scaletrain.tracking.store import RunStore
    with RunStore(args.store, create=False) as store:
        records = [store.get(i) for i in args.run_ids]
    twice = sorted({r.id for r in records if sum(o.id == r.id for o in records) > 1})
    if twice:
        raise UserError(f"run {twice[0]} is named twice: an ensemble's members are distinct runs (each counted once); "
                        "name each run once")
    # The processes' settings, checked by their owner (config.py; Layout: several devices for one process).
    processes = from_mapping(TrainConfig, {"distributed": given_overrides(args).get("distributed", {})})
    processes.validate()
    nproc, devices = processes.distributed.nproc, processes.distributed.devices
    if nproc > 1 and not inside_worker():
        check_members(records, args.data_dir)   # before any worker starts
        if nproc > len(records):
            raise UserError(f"--nproc {nproc} for {len(records)} members: at most one process per member "
                            f"(--nproc {len(records)})")
        return launch(nproc, 0, args.device, list(argv), command="ensemble", devices=devices)
    if not inside_worker():
        build_layout(processes.distributed, 1)
    result = evaluate_ensemble(records, args.device, args.data_dir, devices=devices)
    if not result.chief:
        return 0
    if args.json:
        print(json.dumps({"task": result.task, "metric": result.metric, "processes": result.processes,
                          "members": [{"run": m.run_id, "model": m.model, "metrics": m.metrics}
                                      for m in result.members],
                          "ensemble": result.ensemble}, indent=2))
        return 0
    names = list(result.ensemble)
    table = Table(title=f"Ensemble of {len(result.members)} {result.task} models on the test split "
                        f"({result.processes} process(es))")
    table.add_column("model")
    for name in names:
        table.add_column(f"test {name}", justify="right")
    for m in result.members:
        table.add_row(f"{m.run_id} ({m.model})", *(f"{m.metrics[n]:.4f}" for n in names))
    table.add_row(Text(result.combined, style="bold"),
                  *(Text(f"{result.ensemble[n]:.4f}", style="bold") for n in names))
    wide_console().print(table)
    return 0
