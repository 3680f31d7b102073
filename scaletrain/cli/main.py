"""The `scaletrain` command: parses, wires, and turns user errors into one line and exit 2.

Each subcommand lives in its own module with an `add_*_arguments(parser)` and a
`run_*(args, argv)` (argv: the arguments after the subcommand's name); the table below wires
them, and a module is imported only when its command (or the parser) needs it.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
import threading
from dataclasses import dataclass

from scaletrain.distributed.env import hand_to_launcher, under_launcher
from scaletrain.errors import (
    DIVERGED_EXIT_CODE,
    INTERRUPTED_EXIT_CODE,
    PRUNED_EXIT_CODE,
    TERMINATED_EXIT_CODE,
    USER_CODE_FAILED_EXIT_CODE,
    WRITE_FAILED_EXIT_CODE,
    NonFiniteLossError,
    RunPruned,
    Terminated,
    UserError,
    WriteFailed,
)
from scaletrain.files import keep_compiled_artifacts
from scaletrain.lifecycle import stops
from scaletrain.training import threads
from scaletrain.user_code.failures import user_failure
from scaletrain.user_code.trust import trust_everything


@dataclass(frozen=True, slots=True)
class Command:
    name: str
    module: str
    add: str
    run: str
    help: str


COMMANDS = [
    Command("train", "train", "add_train_command_arguments", "run_train",
            "train a model (no arguments: the default MNIST-1D recipe)"),
    Command("scaling", "scaling", "add_scaling_arguments", "run_scaling",
            "measure one device and predict the step on many: data parallel, sharded, parameter servers, "
            "pipelines, tensor parallel"),
    Command("plan-memory", "plan_memory", "add_plan_memory_arguments", "run_plan_memory",
            "predict per-device memory for each strategy and the largest batch that fits, before running anything"),
    Command("find-batch-size", "find_batch_size", "add_find_batch_size_arguments", "run_find_batch_size",
            "find the largest batch that trains without running out of memory, with the throughput at every size"),
    Command("runs", "runs", "add_runs_arguments", "run_runs",
            "the run store: list, show, compare recorded runs; an HTML report"),
    Command("sweep", "sweep", "add_sweep_arguments", "run_sweep",
            "run one training per point of a sweep (batch size) and plot the results"),
    Command("tune", "tune", "add_tune_arguments", "run_tune",
            "hyperparameter search on Optuna (TPE, median pruning), trials in parallel as separate processes"),
    Command("autotune", "autotune", "add_autotune_arguments", "run_autotune",
            "find the fastest system settings (precision, compile, fusing, threads, ...) for a training here, "
            "each checked to train the same"),
    Command("multi", "multi", "add_multi_arguments", "run_multi",
            "run independent trainings side by side, one per device, each a run in the store"),
    Command("ensemble", "multi", "add_ensemble_arguments", "run_ensemble",
            "evaluate the averaged predictions of saved models on the test split"),
    Command("predict", "predict", "add_predict_arguments", "run_predict",
            "a run's predictions for new samples or a split, split over the replicas of --nproc processes"),
    Command("export", "export", "add_export_arguments", "run_export",
            "write a run's model as a self-contained program for serving (torch.export, or ONNX), checked against it"),
    Command("evaluate", "evaluate", "add_evaluate_arguments", "run_evaluate",
            "a sidecar evaluator: evaluate each checkpoint a run commits, beside its training, until it ends"),
    Command("shard", "shard", "add_shard_arguments", "run_shard",
            "write a data set into WebDataset tar shards with a manifest, for --data shards"),
    Command("list", "main", "add_list_arguments", "run_list",
            "list the models, data sets, precisions, strategies and recipes"),
]


class UsageError(UserError):
    """A command line argparse refuses (an unknown flag, a choice not offered, a missing value)."""


class _Parser(argparse.ArgumentParser):
    """argparse, but a refused command line is one line naming the problem and where the options
    are listed, not the usage block (`scaletrain train`'s is 60 lines, above the error)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.command_parsers: dict[str, _Parser] = {}

    def add_subparsers(self, **kwargs):
        # Named in the "required" error: "COMMAND", not the attribute it is stored in.
        kwargs.setdefault("metavar", "COMMAND")
        return super().add_subparsers(**kwargs)

    def parse_args(self, args=None, namespace=None):
        # argparse reports flags no command knows from the top parser; the command's own --help
        # is the one that lists what it takes.
        parsed, unknown = self.parse_known_args(args, namespace)
        if unknown:
            where = self.command_parsers.get(getattr(parsed, "command", ""), self)
            where.error(f"unrecognized arguments: {' '.join(unknown)}")
        return parsed

    def error(self, message: str):
        raise UsageError(f"{message} (`{self.prog} --help` lists the options)")


def _function(command: Command, attribute: str):
    return getattr(importlib.import_module(f"scaletrain.cli.{command.module}"), attribute)


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole command line, or (`only`) every command's name and help with only that command's
    arguments: a command then imports no other command's module (`list` answers in 0.2 s)."""
    parser = _Parser(prog="scaletrain", description="Fast, honestly measured training.")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        # No abbreviations: the launcher passes a worker's arguments through verbatim.
        command_parser = sub.add_parser(command.name, help=command.help, allow_abbrev=False)
        parser.command_parsers[command.name] = command_parser
        if only is None or command.name == only:
            _function(command, command.add)(command_parser)
    return parser


def add_list_arguments(parser: argparse.ArgumentParser) -> None:
    """`list` takes no options."""


def run_list(args: argparse.Namespace, argv: list[str]) -> int:
    # The config's choice lists, read from the source: `list` answers without importing torch.
    from scaletrain.cli.train import recipe_names
    from scaletrain.config import DATA_SETS, PRECISIONS, STRATEGIES
    from scaletrain.models.names import model_names
    print("models:     " + ", ".join(model_names()))
    print("data sets:  " + ", ".join((*DATA_SETS, "module:function (your own splits: docs/your-model-and-data.md)")))
    print("precisions: " + ", ".join(PRECISIONS))
    print("            fp8: torchao's float8 linear layers, bf16 autocast for the rest (pip install 'scaletrain[fp8]'; "
          "a GPU of compute capability 8.9 or newer, --fp8-emulate elsewhere: not faster); its gain here is not "
          "measured yet")
    print("strategies: " + ", ".join(STRATEGIES))
    print("recipes:    " + ", ".join(recipe_names()))
    return 0


def _end(line: str, code: int) -> int:
    """Ends with `line` on stderr; a torchrun worker hands it to its launcher instead, which prints
    the job's first failure once (distributed/env.py)."""
    if not hand_to_launcher(line):
        print(line, file=sys.stderr)
    return code


# SIGINT and SIGTERM: remembered (see _stopping), then raised as KeyboardInterrupt/Terminated;
# a run's stop watch ends a process whose main thread is stuck in C++ (lifecycle/stops.py).
_STOPS_RECEIVED = stops.RECEIVED
_on_stop_signal = stops.on_stop_signal


def _handlers_ran() -> None:
    """Nothing: calling a Python function runs any signal handler still pending."""


def _stopping() -> bool:
    """Whether this process was told to stop. A worker blocked in a collective when its launcher
    stops the job (Ctrl-C, SIGTERM) often fails next with a peer gone before its own signal's
    handler has run; that failure is the stop, not an error."""
    try:
        _handlers_ran()
    except (KeyboardInterrupt, Terminated):
        return True
    return bool(_STOPS_RECEIVED)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    named = argv[0] if argv and any(c.name == argv[0] for c in COMMANDS) else ""    # `--help`: no command's arguments
    if threading.current_thread() is not threading.main_thread():
        return _main(argv, named)
    # SIGTERM ends a command the way Ctrl-C does: every phase's cleanup runs (runner.py records the
    # run as interrupted), then one line and exit 143. The caller's handlers come back after (a
    # test or a notebook calling main()).
    stops.hold_stops_while_loading()    # torch's C++ initialisation cannot take a stop raised inside it
    previous = {sig: signal.signal(sig, _on_stop_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        return _main(argv, named)
    except KeyboardInterrupt:   # a second stop while the command's last line was being said
        return INTERRUPTED_EXIT_CODE
    except Terminated:
        return TERMINATED_EXIT_CODE
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _stopped(signum: int) -> int:
    """The command's last word on a stop it took."""
    stops.taken()
    if signum == signal.SIGINT:
        return _end("scaletrain: interrupted", INTERRUPTED_EXIT_CODE)
    return _end("scaletrain: terminated", TERMINATED_EXIT_CODE)


def _main(argv: list[str], named: str) -> int:
    stops.begin_command()
    try:
        # The machine's load from here on, before torch is imported: a training's thread count
        # reads it. Inside the handlers: a launcher stopping its workers this early (psutil's
        # import) ends them in one line too.
        threads.mark_start()
        threads.check_omp_num_threads()     # before torch, whose OpenMP reads it as it loads
        keep_compiled_artifacts()           # before torch fixes its compile cache's folder
        # A flag's own check (cli/flags.py) raises a ConfigError while parsing: one line, exit 2.
        args = build_parser(only=named).parse_args(argv)
        command = next(c for c in COMMANDS if c.name == args.command)
        if getattr(args, "trust_code", False):   # before anything reads a saved run
            trust_everything()
        code = _function(command, command.run)(args, argv[1:])
        stops.raise_if_owed()       # a stop swallowed on its way (stops.py) still ends the command
        return code
    except UserError as exc:
        return _end(f"scaletrain: error: {exc}", 2)
    except NonFiniteLossError as exc:
        return _end(f"scaletrain: training diverged: {exc}", DIVERGED_EXIT_CODE)
    except WriteFailed as exc:
        return _end(f"scaletrain: error: {exc}", WRITE_FAILED_EXIT_CODE)
    except RunPruned as exc:
        return _end(f"scaletrain: {exc}", PRUNED_EXIT_CODE)
    except KeyboardInterrupt:
        return _stopped(signal.SIGINT)
    except Terminated:
        return _stopped(signal.SIGTERM)
    except BrokenPipeError:
        # The reader went away (`scaletrain runs show ID --json | head -1`): end quietly, and keep
        # Python from complaining again when it flushes stdout at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as exc:
        owed = stops.owed()
        if owed is not None:      # a stop turned into another error on its way (torch._C's "initialization failed")
            return _stopped(owed)
        if under_launcher() and _stopping():
            # A worker of a job its launcher is stopping: the launcher says so, once.
            return INTERRUPTED_EXIT_CODE if signal.SIGINT in _STOPS_RECEIVED else TERMINATED_EXIT_CODE
        # The user's own code raised: their function named in one line, their frames only, exit 1.
        failure = user_failure(exc)
        if failure is not None:
            if not hand_to_launcher(failure.headline):   # a worker's launcher prints the job's first
                print(failure.headline, file=sys.stderr)
            if failure.frames:
                print(failure.frames, file=sys.stderr)
            return USER_CODE_FAILED_EXIT_CODE
        # A bug keeps its traceback; a worker also tells its launcher when it failed, so the
        # launcher names the rank that failed first, not a peer that failed because of it.
        hand_to_launcher(f"{type(exc).__name__}: {exc}")
        raise


if __name__ == "__main__":
    sys.exit(main())
