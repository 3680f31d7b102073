"""Does moving evaluation to a sidecar keep training's pace? The same training run twice, as real
CLI processes, interleaved over repeats: (a) evaluating the validation split in the loop after
every epoch, (b) with --no-eval-each-epoch while `scaletrain evaluate --watch` evaluates each
epoch's checkpoint in a second process. Reports the training's wall time, its steady-state
images/sec and training time (evaluation excluded in both), and how many checkpoints the sidecar
evaluated. Each process gets one thread (OMP_NUM_THREADS=1), so on a 2-core machine each has a core.

  python benchmarks/sidecar.py --repeats 3
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
from benchmarks.common import spread  # noqa: E402

TRAIN = ["--model", "cnn1d", "--data", "mnist1d", "--num-samples", "8000", "--val-fraction", "0.3",
         "--epochs", "6", "--batch-size", "64", "--target-accuracy", "0.999", "--no-progress", "--no-record",
         "--val-batch-size", "64"]


def _cli(args, cwd, **popen):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "scaletrain", *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **popen)


def one(root: Path, name: str, sidecar: bool, steps_per_epoch: int) -> dict:
    run_dir = root / name
    extra = ["--no-eval-each-epoch", "--checkpoint-every", str(steps_per_epoch)] if sidecar else \
            ["--checkpoint-every", str(steps_per_epoch)]
    started = time.perf_counter()
    training = _cli(["train", *TRAIN, *extra, "--run-dir", str(run_dir)], root)
    evaluator = None
    if sidecar:
        while not (run_dir / "config.json").is_file() and training.poll() is None:
            time.sleep(0.05)
        evaluator = _cli(["evaluate", "--watch", str(run_dir), "--poll-s", "0.2"], root)
    out, _ = training.communicate()
    wall = time.perf_counter() - started
    if training.returncode != 0:
        raise SystemExit(out[-3000:])
    evaluated = 0
    if evaluator is not None:
        evaluator.communicate(timeout=300)
        evaluated = sum(1 for _ in (run_dir / "evaluations.jsonl").open())
    summary = json.loads((run_dir / "summary.json").read_text())
    return {"wall_s": wall, "images_per_sec": summary["images_per_sec"], "train_time_s": summary["train_time_s"],
            "eval_time_s": summary["eval_time_s"], "evaluated": evaluated}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    from scaletrain.config import DataConfig
    from scaletrain.data import load_dataset
    train = load_dataset(DataConfig(name="mnist1d", num_samples=8000, val_fraction=0.3)).train
    steps_per_epoch = len(train) // 64   # a checkpoint at every epoch's end
    results = {"in-loop evaluation": [], "sidecar evaluator": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            for label in (list(results) if r % 2 == 0 else list(reversed(results))):
                results[label].append(one(Path(tmp), f"{label[:4]}{r}", label.startswith("sidecar"), steps_per_epoch))
    print("| evaluation | training wall s | images/sec (training) | in-loop eval s | checkpoints evaluated by the "
          "sidecar |")
    print("|---|---|---|---|---|")
    for label, runs in results.items():
        wall, ips = spread([r["wall_s"] for r in runs]), spread([r["images_per_sec"] for r in runs])
        ev = spread([r["eval_time_s"] for r in runs])
        print(f"| {label} | {wall['median']:.2f} ({wall['min']:.2f}-{wall['max']:.2f}) | {ips['median']:,.0f} "
              f"({ips['min']:,.0f}-{ips['max']:,.0f}) | {ev['median']:.2f} | {runs[0]['evaluated']} |")


if __name__ == "__main__":
    main()
