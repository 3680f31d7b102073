"""The `scaletrain` command: parses, wires, and turns user errors into one line and exit 2."""

from __future__ import annotations

import argparse
import sys

from scaletrain.errors import PRUNED_EXIT_CODE, RunPruned, UserError


def build_parser() -> argparse.ArgumentParser:
    from scaletrain.cli.train import add_train_arguments
    parser = argparse.ArgumentParser(prog="scaletrain", description="Fast, honestly measured training.")
    sub = parser.add_subparsers(dest="command", required=True)
    # No abbreviations: the launcher passes a worker's arguments through verbatim.
    train = sub.add_parser("train", help="train a model (no arguments: the default MNIST-1D recipe)",
                           allow_abbrev=False)
    add_train_arguments(train)
    from scaletrain.cli.scaling import add_scaling_arguments
    scaling = sub.add_parser("scaling", help="measure one device and predict data-parallel speedup on 1..64 devices",
                             allow_abbrev=False)
    add_scaling_arguments(scaling)
    from scaletrain.cli.plan_memory import add_plan_memory_arguments
    plan = sub.add_parser("plan-memory", help="predict per-device memory for each strategy and the largest batch "
                          "that fits, before running anything", allow_abbrev=False)
    add_plan_memory_arguments(plan)
    from scaletrain.cli.find_batch_size import add_find_batch_size_arguments
    finder = sub.add_parser("find-batch-size", help="find the largest batch that trains without running out of "
                            "memory, with the throughput at every size tried", allow_abbrev=False)
    add_find_batch_size_arguments(finder)
    from scaletrain.cli.runs import add_runs_arguments
    runs = sub.add_parser("runs", help="the run store: list, show, compare recorded runs; an HTML report",
                          allow_abbrev=False)
    add_runs_arguments(runs)
    from scaletrain.cli.sweep import add_sweep_arguments
    sweep = sub.add_parser("sweep", help="run one training per point of a sweep (batch size) and plot the results",
                           allow_abbrev=False)
    add_sweep_arguments(sweep)
    from scaletrain.cli.tune import add_tune_arguments
    tune = sub.add_parser("tune", help="hyperparameter search on Optuna (TPE, median pruning), trials in parallel "
                          "as separate processes, each a run in the store", allow_abbrev=False)
    add_tune_arguments(tune)
    from scaletrain.cli.multi import add_ensemble_arguments, add_multi_arguments
    multi = sub.add_parser("multi", help="run independent trainings side by side, one per device, each a run in "
                           "the store", allow_abbrev=False)
    add_multi_arguments(multi)
    ensemble = sub.add_parser("ensemble", help="evaluate the averaged predictions of saved models on the test split",
                              allow_abbrev=False)
    add_ensemble_arguments(ensemble)
    sub.add_parser("list", help="list the models, data sets, precisions, strategies and recipes")
    return parser


def _list() -> int:
    from scaletrain.cli.train import recipe_names
    from scaletrain.data import DATASETS
    from scaletrain.models import MODEL_NAMES
    from scaletrain.precision import POLICIES
    print("models:     " + ", ".join(MODEL_NAMES))
    print("data sets:  " + ", ".join(DATASETS))
    print("precisions: " + ", ".join(POLICIES))
    from scaletrain.distributed import STRATEGIES
    print("strategies: auto, " + ", ".join(STRATEGIES))
    print("recipes:    " + ", ".join(recipe_names()))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    try:
        if args.command == "train":
            from scaletrain.cli.train import run_train
            return run_train(args, argv[1:])
        if args.command == "scaling":
            from scaletrain.cli.scaling import run_scaling
            return run_scaling(args, argv[1:])
        if args.command == "plan-memory":
            from scaletrain.cli.plan_memory import run_plan_memory
            return run_plan_memory(args, argv[1:])
        if args.command == "find-batch-size":
            from scaletrain.cli.find_batch_size import run_find_batch_size
            return run_find_batch_size(args, argv[1:])
        if args.command == "runs":
            from scaletrain.cli.runs import run_runs
            return run_runs(args)
        if args.command == "sweep":
            from scaletrain.cli.sweep import run_sweep
            return run_sweep(args)
        if args.command == "tune":
            from scaletrain.cli.tune import run_tune
            return run_tune(args)
        if args.command == "multi":
            from scaletrain.cli.multi import run_multi_command
            return run_multi_command(args)
        if args.command == "ensemble":
            from scaletrain.cli.multi import run_ensemble_command
            return run_ensemble_command(args)
        return _list()
    except UserError as exc:
        print(f"scaletrain: error: {exc}", file=sys.stderr)
        return 2
    except RunPruned as exc:
        print(f"scaletrain: {exc}", file=sys.stderr)
        return PRUNED_EXIT_CODE
    except KeyboardInterrupt:
        print("scaletrain: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
