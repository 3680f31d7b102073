"""`scaletrain autotune [train options] [--trials N] [--steps S] [--out DIR]`: the fastest system
settings for this training on this machine, each candidate measured as its own job (its own
process, or --nproc workers under the launcher, where the strategy is searched too) and checked
to train the same as the given configuration (experiments/autotune/)."""

from __future__ import annotations

import argparse
from pathlib import Path

from scaletrain.cli.flags import add_number

# The default bound of a whole autotune (issue 64): unbounded, the default search took 22 min on
# the 2-core CPU with one core busy; bounded, the search leaves its confirmation its share and the
# whole command ends within 10 minutes (BENCHMARKS.md, "Autotune under a default budget").
DEFAULT_BUDGET_S = 480.0


def add_autotune_arguments(parser: argparse.ArgumentParser) -> None:
    from scaletrain.cli.train import add_train_arguments
    g = parser.add_argument_group("autotune")
    add_number(g, "--trials", int, ge=1, default=12, help="candidates to measure, the given configuration "
                   "included (default 12; at most every candidate the planner lets through)")
    add_number(g, "--steps", int, ge=1, default=25, help="optimizer steps per epoch of each candidate's measured "
                   "window (default 25: 50 measured steps over the default 3 epochs)")
    add_number(g, "--window-epochs", int, ge=2, default=3, help="epochs per candidate, the first a warm-up "
                   "(compilation) timed apart (default 3)")
    g.add_argument("--out", help="folder for the study, the trials, autotune.json and best.toml (default: "
                   "<run store folder>/autotune/<study name>); rerun with the same folder to go on")
    g.add_argument("--study-name", default="autotune", help="the study's name (default autotune)")
    g.add_argument("--objective", default="throughput", choices=("throughput", "time-to-target"),
                   help="throughput: samples/s over a short window of the same seeded steps (default); "
                        "time-to-target: training time until validation first reaches --target, each candidate "
                        "trained until it does, batch size searched too")
    g.add_argument("--lr-rule", default="sqrt", help="time-to-target: how the learning rate follows a new batch "
                   "size: none, linear or sqrt (default sqrt)")
    g.add_argument("--exhaustive", action="store_true", help="measure every candidate the planner keeps (the "
                   "whole grid) instead of --trials proposed by Optuna's TPE")
    g.add_argument("--knobs", default="", help="comma list of the knobs to search, e.g. precision,compile "
                   "(default: every knob that applies; the table's header names them)")
    add_number(g, "--budget-s", float, ge=0, default=DEFAULT_BUDGET_S,
               help="bound the whole search, its confirmation included, to this many seconds: the search stops "
                    "starting candidates when what is left is the confirmation's, a run still going at the end is "
                    "stopped, and the best found so far is reported (default 480: done within 10 minutes on a "
                    "2-core machine, loaded or not; 0: no bound)")
    add_number(g, "--cap-factor", float, gt=1, default=10.0,
               help="stop a candidate that runs longer than this many times the baseline's whole run (its start, "
                    "data, warm-up and window), as hopeless (default 10)")
    add_number(g, "--prune-factor", float, gt=1, default=3.0,
               help="stop a candidate training slower than the best so far divided by this, a second into an epoch ("
                    "default 3; one process per candidate)")
    add_number(g, "--confirm-rounds", int, ge=0, default=5,
               help="before the winner is named, the given configuration and the --finalists best are measured "
                    "again this many rounds, interleaved; a finalist wins only if it beat the given configuration "
                    "in every round, else it is a tie and the given configuration stays (0: the search's own "
                    "figures decide; default 5)")
    add_number(g, "--test-tolerance", float, ge=0, default=0.005,
               help="time-to-target: the confirmation's rounds are seeds, and a finalist whose median final test "
                    "metric is below the given configuration's by more than this is refused (default 0.005)")
    add_number(g, "--finalists", int, ge=1, default=2, help="candidates confirmed beside the given configuration "
                                                            "(default 2)")
    g.add_argument("--emulated-precisions", action="store_true",
                   help="also measure the precisions this device only emulates (no 16-bit units: slower than "
                        "float32 by construction; skipped with a note by default)")
    g.add_argument("--device-memory", metavar="BYTES", help="the memory a candidate may use, e.g. 16GiB (default: "
                   "the GPU's, or the host memory free now)")
    add_number(g, "--loss-tolerance", float, gt=0, default=None,
                   help="largest relative departure of a candidate's per-epoch training loss from the given "
                        "configuration's (default 0.02)")
    add_number(g, "--loss-tolerance-16bit", float, gt=0, default=None,
                   help="the same where the candidate's precision changes the arithmetic (default 0.05)")
    add_train_arguments(parser)


def run_autotune(args: argparse.Namespace, argv: list[str]) -> int:
    from scaletrain.cli.console import wide_console
    from scaletrain.cli.train import config_from_args
    from scaletrain.experiments.autotune.search import AutoTuner
    from scaletrain.experiments.autotune.settings import (
        LOSS_TOLERANCE,
        LOSS_TOLERANCE_16BIT,
        OBJECTIVES,
        AutotuneSettings,
    )
    from scaletrain.lifecycle.paths import check_folder_name, check_writable_dir, check_writable_file
    from scaletrain.memory.units import parse_bytes
    check_folder_name(args.study_name, "--study-name")
    cfg = config_from_args(args)
    out = Path(args.out) if args.out else Path(cfg.tracking.store).parent / "autotune" / args.study_name
    check_writable_dir(out, "--out")
    check_writable_file(cfg.tracking.store, "run store (--store)")
    settings = AutotuneSettings(
        out=out, trials=args.trials, steps=args.steps, epochs=args.window_epochs, study_name=args.study_name,
        exhaustive=args.exhaustive, objective=OBJECTIVES[args.objective], lr_rule=args.lr_rule,
        budget_s=args.budget_s or None, cap_factor=args.cap_factor, prune_factor=args.prune_factor,
        emulated=args.emulated_precisions, confirm_rounds=args.confirm_rounds, finalists=args.finalists,
        test_tolerance=args.test_tolerance, only=tuple(k.strip() for k in args.knobs.split(",") if k.strip()),
        device_memory=parse_bytes(args.device_memory, "--device-memory") if args.device_memory else None,
        loss_tolerance=LOSS_TOLERANCE if args.loss_tolerance is None else args.loss_tolerance,
        loss_tolerance_16bit=LOSS_TOLERANCE_16BIT if args.loss_tolerance_16bit is None else args.loss_tolerance_16bit)
    console = wide_console()
    tuner = AutoTuner(cfg, settings, console)
    rows = tuner.run()
    best_path, table = tuner.write_results(rows)
    console.print(table)
    if tuner.budget_ran_out:
        console.print(f"the --budget-s of {args.budget_s:g} s ran out: the best of what was measured by then is "
                      "reported", soft_wrap=True)
    if settings.objective.name == "throughput" and any(k.numerics for k in tuner.knobs):
        console.print("* changes the arithmetic (checked against the baseline's loss with the 16-bit tolerance)")
    if best_path is None:
        console.print(f"no candidate was measured; see the trials' train.log files under {out / 'trials'}")
        return 1
    best = tuner.best(rows)
    figure = (f"{best.images_per_sec:,.0f} samples/s" if settings.objective.name == "throughput"
              else f"{best.value:.2f} s of training and warm-up to {cfg.target_metric} {cfg.target}")
    console.print(f"best: {figure} with "
                  f"{', '.join(f'{k}={v}' for k, v in best.params.items())}; its config: {best_path} "
                  f"(scaletrain train --config {best_path}); trials in the store under group {tuner.group} "
                  f"(scaletrain runs report --group {tuner.group})",
                  soft_wrap=True)
    return 0
