"""`scaletrain multi CONFIG ...` and `scaletrain ensemble RUN_ID ...`."""

from __future__ import annotations

import argparse
import json
from datetime import datetime
from pathlib import Path

from rich.text import Text

from scaletrain.tracking.store import DEFAULT_STORE
from scaletrain.cli.flags import add_number


def add_multi_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("configs", nargs="+", metavar="CONFIG", help="TOML training configs, one training each")
    add_number(parser, "--parallel", int, ge=1, help="trainings at once (default: one per GPU, else one per core)")
    parser.add_argument("--out", help="folder for the runs (default: a new folder under the run store's folder)")
    parser.add_argument("--group", help="the runs' group in the store (default: multi-<time>)")
    parser.add_argument("--store", help="record every run in this store (default: each config's own)")


def add_ensemble_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_ids", nargs="+", metavar="RUN_ID", help="runs with saved models (model.pt)")
    parser.add_argument("--store", default=str(DEFAULT_STORE), help=f"the run store (default {DEFAULT_STORE})")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
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
    from scaletrain.experiments.ensemble import evaluate_ensemble
    from scaletrain.tracking.store import RunStore
    with RunStore(args.store, create=False) as store:
        records = [store.get(i) for i in args.run_ids]
    members, ensemble = evaluate_ensemble(records, args.device, args.data_dir)
    if args.json:
        print(json.dumps({"members": [{"run": m.run_id, "model": m.model, "accuracy": m.accuracy} for m in members],
                          "ensemble_accuracy": ensemble}, indent=2))
        return 0
    table = Table(title=f"Ensemble of {len(members)} models on the test split")
    table.add_column("model")
    table.add_column("test accuracy", justify="right")
    for m in members:
        table.add_row(f"{m.run_id} ({m.model})", f"{m.accuracy:.4f}")
    table.add_row(Text("averaged probabilities", style="bold"), Text(f"{ensemble:.4f}", style="bold"))
    wide_console().print(table)
    return 0
