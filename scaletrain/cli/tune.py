"""`scaletrain tune --space space.toml --trials N --parallel P --metric M --direction D [train options]`."""

from __future__ import annotations

import argparse
from pathlib import Path

from scaletrain.cli.flags import add_number


def add_tune_arguments(parser: argparse.ArgumentParser) -> None:
    from scaletrain.cli.train import add_train_arguments
    parser.add_argument("--space", required=True, help="TOML file: one table per parameter (type float|int|"
                        "categorical, low/high/log/step or choices)")
    add_number(parser, "--trials", int, ge=1, default=20, help="trials in the whole study, counting finished "
                        "ones of earlier or other invocations (default 20)")
    add_number(parser, "--parallel", int, ge=1, default=1, help="trials at once, each on its own device "
                        "(a GPU, or an equal share of the CPU cores) (default 1)")
    parser.add_argument("--metric", default="auto", help="what to optimise: a per-epoch metric (its best "
                        "epoch) or a run summary field such as time_to_target_s (default auto: the task's own "
                        "validation target, val_accuracy, val_r2 or val_perplexity)")
    parser.add_argument("--direction", default="auto", help="maximize or minimize (default auto: the way the "
                        "metric improves)")
    parser.add_argument("--out", help="folder for the trials, trials.csv and best.toml (default: "
                        "<run store folder>/studies/<study name>)")
    parser.add_argument("--study-name", help="the study's name in the storage (default: the space file's name)")
    parser.add_argument("--storage", help="any database URL Optuna accepts, e.g. postgresql://user@host/db for "
                        "trials from several hosts (default: sqlite:///<out>/study.db)")
    parser.add_argument("--pruner", default="median", choices=("median", "none"),
                        help="stop trials whose metric trails the median of earlier trials at the same epoch")
    add_number(parser, "--prune-startup-trials", int, ge=0, default=3,
                        help="trials that finish before any pruning (default 3)")
    add_number(parser, "--prune-warmup-epochs", int, ge=0, default=1,
                        help="epochs of each trial before it can be pruned (default 1)")
    add_train_arguments(parser)


def run_tune(args: argparse.Namespace, argv: list[str]) -> int:
    from scaletrain.cli.console import wide_console
    from scaletrain.cli.train import config_from_args
    from scaletrain.experiments.space import SearchSpace
    from scaletrain.experiments.tune import Tuner, TuneSettings, epoch_metrics, resolve_objective
    from scaletrain.lifecycle.paths import check_folder_name, check_writable_dir, check_writable_file
    from scaletrain.training.preflight import run_task
    space = SearchSpace.load(args.space)
    cfg = config_from_args(args)
    task = run_task(cfg)
    metric, direction = resolve_objective(args.metric, args.direction, task)
    study_name = check_folder_name(args.study_name or Path(args.space).stem, "--study-name")
    out = Path(args.out) if args.out else Path(cfg.tracking.store).parent / "studies" / study_name
    storage = args.storage or f"sqlite:///{(out / 'study.db').resolve()}"
    # An existing --out is this study's own folder: a rerun continues the study (by design).
    check_writable_dir(out, "--out")
    if cfg.tracking.record:
        check_writable_file(cfg.tracking.store, "run store (--store)")
    out.mkdir(parents=True, exist_ok=True)
    settings = TuneSettings(space=space, trials=args.trials, parallel=args.parallel, metric=metric,
                            direction=direction, out=out, storage_url=storage, study_name=study_name,
                            pruner={"kind": args.pruner, "startup_trials": args.prune_startup_trials,
                                    "warmup_epochs": args.prune_warmup_epochs},
                            epoch_metrics=epoch_metrics(task))
    console = wide_console()
    tuner = Tuner(cfg, settings, console)
    tuner.run()
    best_path, table = tuner.write_results()
    console.print(table)
    if best_path is None:
        console.print("no trial finished; see the trials' train.log files under " + str(out / "trials"))
        return 1
    best = tuner.study.best_trial
    console.print(f"best: trial {best.number}, {metric} {best.value:.4f}, params {tuner.best_params(best)}; "
                  f"its config: {best_path} (scaletrain train --config {best_path}); runs in the store under group "
                  f"{tuner.group}", soft_wrap=True)
    return 0
