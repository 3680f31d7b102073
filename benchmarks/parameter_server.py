"""Seed 002's parameter-server claims, measured: with worker 1 slowed on purpose, does a step of
sync follow the slow worker, sync with one backup the fast ones, and async keep everyone busy?
And what does a push/pull cost per step against DDP's all-reduce? Real torchrun processes over
gloo (3 workers + 1 server, or 3 DDP ranks), interleaved over repeats, one thread per process.

The step time is the chief's (a fast worker's): its training time per step over the epochs after
the first. The epoch's wall time also counts the wait at the epoch's end, where every worker meets
for the metrics and the evaluation.

  python benchmarks/parameter_server.py --repeats 3 --delay-s 0.05 [--epochs 30]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.common import slow_worker, spread, with_plugins  # noqa: E402

BASE = ["--model", "mlp", "--model-option", "hidden=[64]", "--data", "digits", "--no-progress", "--no-record",
        "--target-accuracy", "0.999", "--lr", "0.003", "--batch-size", "66", "--no-save-model"]


def setups(delay: float) -> dict[str, list[str]]:
    slow = slow_worker(delay)
    return {
        "ddp, 3 ranks (no delay)": ["--strategy", "ddp", "--nproc", "3"],
        "ps sync (no delay)": ["--strategy", "ps", "--nproc", "4"],
        "ps sync, worker 1 slow": ["--strategy", "ps", "--nproc", "4", *slow],
        "ps sync + 1 backup, worker 1 slow": ["--strategy", "ps", "--nproc", "4", "--backup-workers", "1", *slow],
        "ps async (no delay)": ["--strategy", "ps", "--nproc", "4", "--ps-mode", "async"],
        "ps async, worker 1 slow": ["--strategy", "ps", "--nproc", "4", "--ps-mode", "async", *slow],
        "ps async + 1 backup, worker 1 slow": ["--strategy", "ps", "--nproc", "4", "--ps-mode", "async",
                                               "--backup-workers", "1", *slow],
    }


def one(root: Path, name: str, args: list[str], epochs: int) -> dict:
    run_dir = root / name
    started = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "scaletrain", "train", *BASE, "--epochs", str(epochs), *args,
                             "--run-dir", str(run_dir)],
                            capture_output=True, text=True, env=with_plugins({**os.environ, "OMP_NUM_THREADS": "1"}), cwd=root)
    if result.returncode != 0:
        raise SystemExit(result.stderr[-3000:])
    wall = time.perf_counter() - started
    epochs = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()][1:]
    per_epoch_steps = epochs[-1]["optimizer_steps"] // epochs[-1]["epoch"]
    train_s = sum(e["epoch_train_time_s"] for e in epochs)
    return {"step_ms": 1e3 * train_s / (per_epoch_steps * len(epochs)), "wall_s": wall, "steps": per_epoch_steps,
            "dropped": sum(e.get("ps_dropped", 0) for e in epochs), "pushes": sum(e.get("ps_pushes", 0) for e in epochs),
            "staleness_max": max((e.get("ps_staleness_max", 0) for e in epochs), default=0),
            "staleness_mean": sum(e.get("ps_staleness_mean", 0.0) for e in epochs) / len(epochs),
            "val_accuracy": epochs[-1]["val_accuracy"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--delay-s", type=float, default=0.05, help="worker 1's sleep in each training forward")
    parser.add_argument("--epochs", type=int, default=3,
                        help="per run; the first is not timed. With backups the epoch's end waits for the slow "
                             "worker's step in flight, a wait that depends on where it is: more epochs average it")
    args = parser.parse_args()
    table = setups(args.delay_s)
    results: dict[str, list[dict]] = {name: [] for name in table}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            for name in (list(table) if r % 2 == 0 else list(reversed(table))):
                folder = f"{len(results[name])}-{list(table).index(name)}"
                results[name].append(one(Path(tmp), folder, table[name], args.epochs))
    print(f"| setup (digits MLP, global batch 66, delay {args.delay_s * 1e3:g} ms) | chief's step ms | predicted ms | "
          f"run wall s | dropped / pushes (epochs 2-{args.epochs}) | staleness mean / max | final val accuracy |")
    print("|---|---|---|---|---|---|---|")
    for name, runs in results.items():
        step, wall = spread([r["step_ms"] for r in runs]), spread([r["wall_s"] for r in runs])
        last = runs[-1]
        guess = predicted(name, results, args.delay_s * 1e3)
        shown = "-" if guess is None else f"{guess:.2f} ({guess / step['median'] - 1:+.0%})"
        print(f"| {name} | {step['median']:.2f} ({step['min']:.2f}-{step['max']:.2f}) | {shown} | "
              f"{wall['median']:.1f} | {last['dropped']} / {last['pushes']} | {last['staleness_mean']:.2f} / "
              f"{last['staleness_max']} | {last['val_accuracy']:.3f} |")


def predicted(name: str, results: dict[str, list[dict]], delay_ms: float) -> float | None:
    """The straggler term's step for a slow-worker setup (prediction/scaling.py's predict_stragglers):
    the same mode's measured no-delay step for the fast workers, that plus the delay for worker 1."""
    from scaletrain.prediction.scaling import predict_stragglers
    if "slow" not in name:
        return None
    mode = "async" if "async" in name else "sync"
    base = spread([r["step_ms"] for r in results[f"ps {mode} (no delay)"]])["median"]
    steps = results[name][-1]["steps"]
    backups = 1 if "backup" in name else 0
    return predict_stragglers([[base], [base + delay_ms], [base]], backups=backups, mode=mode,
                              steps_per_epoch=steps).step_time_s


if __name__ == "__main__":
    main()
