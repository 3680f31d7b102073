"""Seed 002's update modes against the clock: validation accuracy against wall time on MNIST-1D
(the 1-D CNN, global batch 126 over 3 workers + 1 server, AdamW one-cycle as the default recipe)
with worker 1 slowed on purpose, for sync, sync + 1 backup, async, async with staleness-scaled
LR, and async + 1 backup. Real torchrun processes over gloo, one thread each, interleaved over
repeats; every run is recorded in one run store, and the run report (its accuracy-against-wall-
time and staleness plots) is written beside it.

  python benchmarks/parameter_server_accuracy.py --repeats 2 --delay-s 0.03 --out /tmp/ps-accuracy
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.common import slow_worker, spread, with_plugins  # noqa: E402

BASE = ["--model", "cnn1d", "--data", "mnist1d", "--no-progress", "--epochs", "12", "--batch-size", "126",
        "--optimizer", "adamw", "--lr", "0.01", "--weight-decay", "0.05", "--lr-schedule", "onecycle",
        "--target-accuracy", "0.999", "--no-save-model", "--strategy", "ps", "--nproc", "4", "--device", "cpu"]
SETUPS = {
    "sync": [],
    "sync + 1 backup": ["--backup-workers", "1"],
    "async": ["--ps-mode", "async"],
    "async, stale LR": ["--ps-mode", "async", "--stale-lr"],
    "async + 1 backup": ["--ps-mode", "async", "--backup-workers", "1"],
}
TARGET = 0.85


def one(out: Path, name: str, extra: list[str], delay: float, repeat: int) -> dict:
    run_dir = out / "runs" / f"{name.replace(' ', '').replace(',', '-').replace('+', 'plus')}-{repeat}"
    store = out / "runs.db"
    result = subprocess.run([sys.executable, "-m", "scaletrain", "train", *BASE, *extra, *slow_worker(delay, "cnn1d"),
                             "--store", str(store), "--run-dir", str(run_dir)],
                            capture_output=True, text=True, env=with_plugins({**os.environ, "OMP_NUM_THREADS": "1"}),
                            cwd=out)
    if result.returncode != 0:
        raise SystemExit(result.stderr[-3000:])
    from scaletrain.tracking.store import RunStore
    run_id = json.loads((run_dir / "summary.json").read_text())["run_id"]
    epochs = RunStore(store).epochs(run_id)
    reached = next((e["elapsed_s"] for e in epochs if e["val_accuracy"] >= TARGET), None)
    return {"wall_s": epochs[-1]["elapsed_s"], "to_target_s": reached, "val_accuracy": epochs[-1]["val_accuracy"],
            "best": max(e["val_accuracy"] for e in epochs), "dropped": sum(e["ps_dropped"] for e in epochs),
            "pushes": sum(e["ps_pushes"] for e in epochs),
            "staleness_mean": sum(e["ps_staleness_mean"] for e in epochs) / len(epochs)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--delay-s", type=float, default=0.03, help="worker 1's sleep before each push")
    parser.add_argument("--out", required=True, help="a new folder: the run store, the runs and report.html")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=False)
    results: dict[str, list[dict]] = {name: [] for name in SETUPS}
    for r in range(args.repeats):
        for name in (list(SETUPS) if r % 2 == 0 else list(reversed(SETUPS))):
            results[name].append(one(out, name, SETUPS[name], args.delay_s, r))
    report = subprocess.run([sys.executable, "-m", "scaletrain", "runs", "report", "--store", str(out / "runs.db"),
                             "-o", str(out / "report.html")], capture_output=True, text=True)
    if report.returncode != 0:
        raise SystemExit(report.stderr)
    print(f"| setup (worker 1 +{args.delay_s * 1e3:g} ms per push) | wall s, 12 epochs | wall s to val acc "
          f"{TARGET} | final val acc | best val acc | dropped / pushes | staleness mean |")
    print("|---|---|---|---|---|---|---|")
    for name, runs in results.items():
        wall = spread([r["wall_s"] for r in runs])
        reached = [r["to_target_s"] for r in runs if r["to_target_s"] is not None]
        to_target = (f"{spread(reached)['median']:.1f}" if len(reached) == len(runs)
                     else f"{len(reached)}/{len(runs)} reached")
        acc = spread([r["val_accuracy"] for r in runs])
        best = spread([r["best"] for r in runs])
        print(f"| {name} | {wall['median']:.1f} ({wall['min']:.1f}-{wall['max']:.1f}) | {to_target} | "
              f"{acc['median']:.3f} | {best['median']:.3f} | {int(runs[-1]['dropped'])} / {int(runs[-1]['pushes'])} | "
              f"{runs[-1]['staleness_mean']:.2f} |")
    print(f"report: {out / 'report.html'}")


if __name__ == "__main__":
    main()
