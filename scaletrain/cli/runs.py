"""`scaletrain runs list | show ID | compare ID ... | report [ID ...] -o report.html`."""

from __future__ import annotations

import argparse
import json
from datetime import datetime
from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.text import Text

from scaletrain.cli.console import wide_console
from scaletrain.cli.flags import add_number
from scaletrain.errors import UserError, first_line
from scaletrain.lifecycle.paths import check_writable_file
from scaletrain.tracking.store import DEFAULT_STORE, RunRecord, RunStore


def add_runs_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="runs_command", required=True)

    def command(name: str, help: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help, allow_abbrev=False)
        p.add_argument("--store", default=str(DEFAULT_STORE), help=f"the run store (default {DEFAULT_STORE})")
        return p

    listing = command("list", "the recorded runs, oldest first")
    listing.add_argument("--group", help="only runs of this group (a sweep, a study)")
    add_number(listing, "--last", int, ge=1, help="only the newest N runs")
    listing.add_argument("--json", action="store_true", help="print JSON instead of a table")
    show = command("show", "one run: config, environment, summary and per-epoch metrics")
    show.add_argument("run_id", help="a run id or a unique prefix of one")
    show.add_argument("--json", action="store_true", help="print JSON instead of tables")
    compare = command("compare", "runs side by side: time, time to target, accuracy, images/sec, memory")
    compare.add_argument("run_ids", nargs="+", metavar="ID", help="run ids (or unique prefixes)")
    compare.add_argument("--json", action="store_true", help="print JSON instead of a table")
    report = command("report", "a self-contained HTML report with plots (opens offline)")
    report.add_argument("run_ids", nargs="*", metavar="ID",
                        help="run ids (default: --group's runs, else the newest 10)")
    report.add_argument("--group", help="report on this group's runs")
    add_number(report, "--last", int, ge=1, default=10, help="without ids or --group: the newest N runs (default 10)")
    report.add_argument("-o", "--output", default="report.html", help="the HTML file to write (default report.html)")
    report.add_argument("--title", default="scaletrain runs", help="the report's title")
    export = command("export", "copy runs (params, per-epoch metrics, tags) into an MLflow tracking server; "
                               "runs already there are left alone")
    export.add_argument("run_ids", nargs="*", metavar="ID", help="run ids (default: --group's runs, else every run)")
    export.add_argument("--group", help="export this group's runs")
    export.add_argument("--to", choices=("mlflow",), required=True, help="where to: mlflow")
    export.add_argument("--tracking-uri", help="the MLflow tracking URI (default: $MLFLOW_TRACKING_URI)")


def _selected(store: RunStore, ids: list[str], group: str | None, last: int | None) -> list[RunRecord]:
    if ids:
        return [store.get(i) for i in ids]
    records = store.runs(group=group, limit=None if group else last)
    if not records:
        where = f"group '{group}'" if group else str(store.path)
        raise UserError(f"no runs in {where}; `scaletrain runs list` shows what is recorded")
    return records


def _show(store: RunStore, record: RunRecord, as_json: bool, console: Console) -> None:
    epochs, evaluations = store.epochs(record.id), store.evaluations(record.id)
    if as_json:
        print(json.dumps({"id": record.id, "status": record.display_status, "group": record.group,
                          "name": record.name, "run_dir": record.run_dir,
                          "created_at": record.created_at, "config": record.config,
                          "environment": record.environment, "summary": record.summary, "error": record.error,
                          "epochs": epochs, "evaluations": evaluations,
                          "samples": len(store.samples(record.id))}, indent=2))
        return
    created = datetime.fromtimestamp(record.created_at).strftime("%Y-%m-%d %H:%M:%S")
    console.print(Text.assemble((f"run {record.id}", "bold"), f" {record.name or ''}: {record.display_status}, "
                                f"started {created}{', group ' + record.group if record.group else ''}, "
                                f"folder {record.run_dir or '-'}"), soft_wrap=True)
    if record.error:
        console.print(Text.assemble(("error:", "red"), f" {record.error}"), soft_wrap=True)
    info = Table(title="Environment", show_header=False)
    for key, value in record.environment.items():
        if key != "argv":
            info.add_row(key, json.dumps(value) if isinstance(value, dict) else str(value))
    console.print(info)
    if record.summary:
        summary = Table(title="Summary", show_header=False)
        for key, value in record.summary.items():
            summary.add_row(key, f"{value:.4g}" if isinstance(value, float) else str(value))
        console.print(summary)
    if epochs:
        keys = [k for k in ("train_loss", "train_accuracy", "val_loss", "val_accuracy", "lr", "images_per_sec",
                            "cumulative_train_time_s") if k in epochs[0]]
        table = Table(title="Epochs")
        for header in ["epoch", "wall s", *keys]:
            table.add_column(header, justify="right")
        for e in epochs:
            table.add_row(str(e["epoch"] + 1), f"{e['elapsed_s']:.2f}",
                          *[f"{e[k]:.4g}" if isinstance(e.get(k), float) else str(e.get(k, "-")) for k in keys])
        console.print(table)
    if evaluations:   # a sidecar evaluator's results, one row per checkpoint
        keys = [k for k in evaluations[0] if k.startswith("val_")]
        table = Table(title="Checkpoint evaluations (sidecar)")
        for header in ["step", "epoch", *keys]:
            table.add_column(header, justify="right")
        for e in evaluations:
            table.add_row(str(e["step"]), f"{e['epoch']:g}", *[f"{e.get(k, float('nan')):.4g}" for k in keys])
        console.print(table)
    console.print(f"config: {json.dumps(record.config)}", soft_wrap=True, markup=False)


def run_runs(args: argparse.Namespace, argv: list[str]) -> int:
    from scaletrain.reports.compare import compare_table, compare_values, list_table
    console = wide_console()
    if args.runs_command == "report":
        check_writable_file(args.output, "--output")   # before any work: a report is never lost
    if args.runs_command == "list" and not Path(args.store).exists():
        # Nothing trained here yet: an empty listing, not an error (the other subcommands name a
        # run, and say there is no store).
        if args.json:
            print("[]")
        else:
            console.print(list_table([]))
        return 0
    if args.runs_command == "export":
        return _export(args, console)
    with RunStore(args.store, create=False) as store:
        if args.runs_command == "list":
            records = store.runs(group=args.group, limit=args.last)
            if args.json:
                print(json.dumps(compare_values(records), indent=2))
            else:
                console.print(list_table(records))
        elif args.runs_command == "show":
            _show(store, store.get(args.run_id), args.json, console)
        elif args.runs_command == "compare":
            records = [store.get(i) for i in args.run_ids]
            if args.json:
                print(json.dumps(compare_values(records), indent=2))
            else:
                console.print(compare_table(records))
        else:
            from scaletrain.reports.html_report import write_report
            records = _selected(store, args.run_ids, args.group, args.last)
            out = write_report(store, records, args.output, args.title)
            console.print(f"report on {len(records)} runs written to {out}", soft_wrap=True)
    return 0


def _export(args: argparse.Namespace, console: Console) -> int:
    import os

    from scaletrain.tracking.loggers import check_trackers
    uri = args.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
    if not uri:
        raise UserError("runs export --to mlflow needs --tracking-uri (or MLFLOW_TRACKING_URI), e.g. "
                        "http://127.0.0.1:5000 or sqlite:///mlflow.db")
    check_trackers(["mlflow"])
    from scaletrain.tracking.loggers.mlflow import export_runs
    with RunStore(args.store, create=False) as store:
        records = _selected(store, args.run_ids, args.group, None)
        try:
            exported, present = export_runs(store, records, uri)
        except Exception as exc:  # the tracking server's errors (unreachable, refused): one line
            raise UserError(f"cannot export to MLflow at {uri}: {first_line(exc)}") from None
    console.print(f"exported {len(exported)} run(s) to MLflow at {uri}; {len(present)} already there",
                  soft_wrap=True)
    return 0
