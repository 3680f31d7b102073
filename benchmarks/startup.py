"""What a user waits for before anything trains, measured: the reading commands (`--help`,
`list`, `train --help`, `runs list`, `runs show`) and a training's start-up (process start to the
first training step of the default recipe: interpreter, imports, data, model build). This tree
beside a baseline checkout (`--baseline DIR`, e.g. a `git worktree` of the commit before), each
measurement its own process, the variants interleaved so a busy machine slows all alike.

    git worktree add /tmp/before ab68414
    python benchmarks/startup.py --baseline /tmp/before --repeats 7

The start-up is timed from just before the process is started to the first
`on_train_batch_begin`, whose process then exits: the first step itself is not in the figure.
"New" is timed with the data cache warm (one untimed run fills it) and with an empty one.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(HERE))
from benchmarks.common import environment  # noqa: E402

COMMANDS = {"--help": ["--help"], "list": ["list"], "train --help": ["train", "--help"],
            "runs list": ["runs", "list"], "runs show": ["runs", "show", "abcd1234"]}

# Builds the default recipe's config as `scaletrain train` does and runs it until its first step.
FIRST_STEP = """
import os, sys, time
from scaletrain.cli.main import build_parser
from scaletrain.cli.train import config_from_args
from scaletrain.runner import run_training
args = build_parser().parse_args(["train", "--no-progress", "--no-record", "--run-dir", sys.argv[1]])

class FirstStep:
    def on_train_batch_begin(self, *args):
        print(f"FIRST {time.time()!r}", flush=True)
        os._exit(0)

run_training(config_from_args(args), callbacks=[FirstStep()])
"""


def _env(tree: Path, cache: Path) -> dict:
    return {**os.environ, "PYTHONPATH": str(tree), "SCALETRAIN_CACHE_DIR": str(cache), "OMP_NUM_THREADS": "2"}


def command_seconds(tree: Path, args: list[str], cwd: Path, cache: Path) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "scaletrain", *args], cwd=cwd, env=_env(tree, cache), check=True,
                   capture_output=True)
    return time.perf_counter() - start


def startup_seconds(tree: Path, cwd: Path, cache: Path) -> float:
    run_dir = Path(tempfile.mkdtemp(dir=cwd))
    start = time.time()
    out = subprocess.run([sys.executable, "-c", FIRST_STEP, str(run_dir / "run")], cwd=cwd, env=_env(tree, cache),
                         check=True, capture_output=True, text=True)
    first = next(float(line.split()[1]) for line in out.stdout.splitlines() if line.startswith("FIRST"))
    return first - start


def imports_torch(tree: Path, args: list[str], cwd: Path, cache: Path) -> bool:
    probe = ("import sys\nfrom scaletrain.cli.main import main\ntry:\n    main(sys.argv[1:])\n"
             "except SystemExit:\n    pass\nprint('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe, *args], cwd=cwd, env=_env(tree, cache), check=True,
                         capture_output=True, text=True)
    return out.stdout.strip().splitlines()[-1] == "True"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", type=Path, required=True, help="a checkout of the code to compare with")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    trees = {"before": args.baseline.resolve(), "after": HERE}
    work = Path(tempfile.mkdtemp(prefix="startup-bench-"))
    warm, cold_root = work / "cache-warm", work / "cache-cold"
    sys.path.insert(0, str(HERE))
    from scaletrain.tracking.store import RunStore
    store = RunStore(work / "scaletrain-runs" / "runs.db")
    store.start_run("abcd1234", name="probe", config={"model": {"name": "cnn1d"}}, environment={"device": "cpu"})
    # (with an accuracy: the baseline's `runs list` cannot show a run without one)
    store.finish_run("abcd1234", "finished", summary={"epochs_run": 1, "best_val_accuracy": 0.9})
    store.close()

    results: dict[str, dict[str, list[float]]] = {}
    for name, argv in COMMANDS.items():
        for label, tree in trees.items():
            command_seconds(tree, argv, work, warm)                  # untimed: the page cache
            results.setdefault(name, {})[label] = []
        for _ in range(args.repeats):
            for label, tree in trees.items():
                results[name][label].append(command_seconds(tree, argv, work, warm))
    torch_imported = {f"{name} ({label})": imports_torch(tree, argv, work, warm)
                      for name, argv in COMMANDS.items() for label, tree in trees.items()}

    startup = {"before": [], "after, cache warm": [], "after, cache empty": []}
    startup_seconds(HERE, work, warm)                               # untimed: fills the warm cache
    for i in range(args.repeats):
        startup["before"].append(startup_seconds(trees["before"], work, warm))
        startup["after, cache warm"].append(startup_seconds(HERE, work, warm))
        startup["after, cache empty"].append(startup_seconds(HERE, work, cold_root / str(i)))

    import torch
    print(json.dumps(environment(torch.device("cpu"))))
    print(f"{'command':<16}{'before (median, min-max)':>28}{'after (median, min-max)':>28}")
    for name, by_tree in results.items():
        cells = [f"{statistics.median(v):.2f} s ({min(v):.2f}-{max(v):.2f})" for v in by_tree.values()]
        print(f"{name:<16}{cells[0]:>28}{cells[1]:>28}")
    print("imports torch:", json.dumps(torch_imported))
    print("start-up to the first step of the default recipe:")
    for label, values in startup.items():
        print(f"  {label:<20} median {statistics.median(values):.2f} s ({min(values):.2f}-{max(values):.2f}), "
              f"n={len(values)}")
    if args.json:
        args.json.write_text(json.dumps({"commands": results, "imports_torch": torch_imported, "startup": startup},
                                        indent=1))


if __name__ == "__main__":
    main()
