"""What autotune's speed floor (experiments/pruning.SpeedFloor: a clock read and a comparison at
the end of every execution) costs a candidate: two trainers of the same model on the same data,
one with the floor at 0 (it never stops a run: the baseline's case), one without, fit an epoch
each in turn (A B A B ...) in one process; the per-step times are paired epoch by epoch.

  python benchmarks/speed_floor.py --model cnn1d --shape 1,40 --batch-size 128
  python benchmarks/speed_floor.py --model mlp --shape 64 --batch-size 16     # a tiny step: the worst case
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.common import environment, spread  # noqa: E402
from scaletrain.callbacks import Throughput  # noqa: E402
from scaletrain.config import DataConfig, ModelConfig, OptimConfig, TrainConfig  # noqa: E402
from scaletrain.data import load_dataset  # noqa: E402
from scaletrain.experiments.pruning import SpeedFloor  # noqa: E402
from scaletrain.models import build_model  # noqa: E402
from scaletrain.training import Trainer, resolve_device  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="cnn1d")
    p.add_argument("--shape", default="1,40")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--repeats", type=int, default=9)
    args = p.parse_args()
    device = resolve_device("auto")
    shape = tuple(int(s) for s in args.shape.split(","))
    data_cfg = DataConfig(name="synthetic", shape=list(shape), num_samples=args.batch_size * args.steps)
    dataset = load_dataset(data_cfg)
    sides = {}
    for name, extra in (("without", []), ("with the floor", [SpeedFloor(0.0)])):
        cfg = TrainConfig(model=ModelConfig(name=args.model), data=data_cfg, batch_size=args.batch_size, epochs=1,
                          optim=OptimConfig(optimizer="adamw", lr=1e-4), progress=False, log_every=10**9,
                          eval_each_epoch=False)
        torch.manual_seed(0)
        meter = Throughput(verbose=False)
        sides[name] = (Trainer(build_model(args.model, shape, 10), cfg, [meter, *extra]), meter)
    steps_ms = {name: [] for name in sides}
    for _ in range(args.repeats + 1):      # interleaved; the first pair (each trainer's first epoch) dropped
        for name, (trainer, meter) in sides.items():
            trainer.history.clear()
            trainer.fit(dataset)
            steps_ms[name].append(args.batch_size / meter.per_epoch[-1] * 1e3)   # per_epoch: samples/s
    steps_ms = {name: times[1:] for name, times in steps_ms.items()}
    ratios = [a / b for a, b in zip(steps_ms["with the floor"], steps_ms["without"], strict=True)]
    env = environment(device)
    print(f"# speed floor: {args.model} {shape} batch {args.batch_size} on {env['device']}, torch {env['torch']}, "
          f"{env['date']}, {args.steps} steps/epoch, {len(ratios)} interleaved pairs")
    for name, times in steps_ms.items():
        s = spread(times)
        print(f"{name:15s} {s['median']:.4f} ms/step (min {s['min']:.4f}, max {s['max']:.4f})")
    r = spread(ratios)
    print(f"ratio with/without: median {r['median']:.4f} (min {r['min']:.4f}, max {r['max']:.4f})")


if __name__ == "__main__":
    main()
