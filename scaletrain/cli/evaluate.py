"""`scaletrain evaluate --watch RUN_DIR`: the sidecar evaluator (evaluation/sidecar.py)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from scaletrain.cli.flags import add_number, add_trust_code
from scaletrain.console import make_console
from scaletrain.errors import ConfigError


def add_evaluate_arguments(parser: argparse.ArgumentParser) -> None:
    add_trust_code(parser)
    parser.add_argument("--watch", required=True, metavar="RUN_DIR",
                        help="the run folder of a training: evaluate each checkpoint it commits, until it ends")
    parser.add_argument("--once", action="store_true",
                        help="evaluate the checkpoints committed so far and stop, instead of following the run")
    add_number(parser, "--poll-s", float, gt=0, default=2.0, help="seconds between looks for new checkpoints")
    add_number(parser, "--start-timeout-s", float, ge=0, default=300.0,
               help="without --once: how long to wait for the training to start in RUN_DIR (a sidecar may "
                    "be started first; default 300)")
    parser.add_argument("--device", default=None, help="the one device to evaluate on (default: the run's --device)")
    parser.add_argument("--store", default=None,
                        help="the run store to record into (default: the run's own, relative to this folder)")


def run_evaluate(args: argparse.Namespace, argv: list[str]) -> int:
    return watch_run(args.watch, once=args.once, poll_s=args.poll_s, device=args.device, store=args.store,
                     start_timeout_s=args.start_timeout_s)


def watch_run(run_dir: str, once: bool = False, poll_s: float = 2.0, device: str | None = None,
              store: str | None = None, start_timeout_s: float = 300.0) -> int:
    from scaletrain.evaluation import SidecarEvaluator
    if not poll_s > 0:
        raise ConfigError(f"--poll-s must be positive (got {poll_s})")
    console = make_console()
    if not once:
        _wait_for_start(run_dir, poll_s, start_timeout_s, console)
    with SidecarEvaluator(run_dir, device=device, store=store, console=console) as evaluator:
        console.print(f"evaluator: watching {run_dir} ({evaluator.split} split, {len(evaluator.done)} checkpoint(s) "
                      "already evaluated)")
        count = evaluator.watch(poll_s=poll_s, once=once)
    console.print(f"evaluator: {count} checkpoint(s) evaluated; results in {run_dir}/evaluations.jsonl")
    return 0


def _wait_for_start(run_dir: str, poll_s: float, timeout_s: float, console) -> None:
    """A sidecar started beside its training (`train ... &` then `evaluate --watch`) may look
    before the training has written its config: wait for it, up to `timeout_s`. What is there
    and is not a run is the evaluator's to refuse, at once."""
    from scaletrain.lifecycle.folder import CONFIG
    config = Path(run_dir) / CONFIG     # what the evaluator reads first; written whole (a rename)
    deadline = time.monotonic() + timeout_s
    told = False
    while not config.is_file() and time.monotonic() < deadline:
        if not told:
            console.print(f"evaluator: waiting for a training to start in {run_dir} (up to {timeout_s:g} s)")
            told = True
        time.sleep(min(poll_s, 0.5))
