"""The default recipe's promise, measured: test accuracy, epochs and time to 94 % validation
accuracy of `mnist1d-cnn` on seeds 0-N under 1 and 2 intra-op threads, today's recipe beside the
one it replaced (40 epochs of one-cycle stopped at 94 % validation, patience 1), interleaved.

    python benchmarks/default_recipe.py --seeds 10
    python benchmarks/default_recipe.py --seeds 5 --threads 2 --variants new,tuned --tuned best.toml
    PYTHONPATH=benchmarks python benchmarks/default_recipe.py --seeds 5 --threads 2 --variants new,tuned \
        --tuned best.toml --base "--model user_cnn:build"      # a user's model on the default recipe

`--tuned` adds a configuration file (e.g. the `best.toml` of `autotune`) as the variant `tuned`;
wall time is the whole process (start-up and data included). Each later variant is also paired
with the first, seed by seed: steady-state images/sec (what `autotune`'s throughput objective
claims) and training time.

Each run is its own process (`scaletrain train --threads T --seed S`), so no state carries over.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import environment  # noqa: E402

# The recipe before 2026-11-24: stop as soon as validation accuracy reaches 94 %.
OLD = ["--epochs", "40", "--patience", "1"]


def one(variant: list[str], seed: int, threads: int, folder: Path, base: list[str] = ()) -> dict:
    summary = folder / "summary.json"
    argv = [sys.executable, "-m", "scaletrain", "train", *variant, *base, "--seed", str(seed), "--threads", str(threads),
            "--run-dir", str(folder / "run"), "--summary-json", str(summary), "--no-progress", "--no-record"]
    start = time.perf_counter()
    subprocess.run(argv, check=True, capture_output=True)
    wall = time.perf_counter() - start
    s = json.loads(summary.read_text())
    return {"test": s["test_accuracy"], "epochs": s["epochs_run"], "time_to_94": s["time_to_target_s"],
            "train_s": s["train_time_s"], "images_per_sec": s["images_per_sec"], "wall_s": wall}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--variants", default="old,new", help="old, new and (with --tuned) tuned, interleaved")
    parser.add_argument("--tuned", help="a configuration file to run as the variant 'tuned'")
    parser.add_argument("--base", default="", help="flags every variant gets, e.g. \"--model user_cnn:build\"")
    args = parser.parse_args()
    variants = {"old": OLD, "new": [], "tuned": ["--config", str(Path(args.tuned).resolve())] if args.tuned else None}
    chosen = [(name, variants[name]) for name in args.variants.split(",")]
    if any(v is None for _, v in chosen):
        parser.error("the variant 'tuned' needs --tuned FILE")
    results: dict[str, list[dict]] = {name: [] for name, _ in chosen}
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(args.seeds):
            for threads in map(int, args.threads.split(",")):
                for name, variant in chosen:      # interleaved, in the order given
                    folder = Path(tmp) / f"{name}-{seed}-{threads}"
                    r = {"seed": seed, "threads": threads, **one(variant, seed, threads, folder, shlex.split(args.base))}
                    results[name].append(r)
                    print(name, json.dumps(r), flush=True)
    print(json.dumps(environment(torch.device("cpu"))))
    first = chosen[0][0]
    for name, rows in results.items():   # paired with the first variant's run of the same seed and threads
        if name == first:
            continue
        speed = sorted(r["images_per_sec"] / b["images_per_sec"] for r, b in zip(rows, results[first], strict=True))
        train = sorted(b["train_s"] / r["train_s"] for r, b in zip(rows, results[first], strict=True))
        print(f"{name} against {first}, paired by seed: steady-state images/sec {statistics.median(speed):.2f}x "
              f"({speed[0]:.2f}-{speed[-1]:.2f}); training time {statistics.median(train):.2f}x "
              f"({train[0]:.2f}-{train[-1]:.2f}), first epoch included")
    for name, rows in results.items():
        tests = [r["test"] for r in rows]
        times = [r["time_to_94"] for r in rows if r["time_to_94"] is not None]
        print(f"{name}: test accuracy median {statistics.median(tests):.3f} (min {min(tests):.3f}, max "
              f"{max(tests):.3f}); runs under 94 % test: {sum(t < 0.94 for t in tests)} of {len(tests)}; epochs "
              f"median {statistics.median(r['epochs'] for r in rows)}; training time median "
              f"{statistics.median(r['train_s'] for r in rows):.2f} s; wall median "
              f"{statistics.median(r['wall_s'] for r in rows):.2f} s; time to 94 % validation median "
              f"{statistics.median(times):.2f} s ({len(times)} of {len(rows)} reached)")


if __name__ == "__main__":
    main()
