"""Does checkpointing change the throughput a run reports? The same training through the whole
run (`run_training`: run folder, checkpointer, callbacks) with and without `--checkpoint-every`,
in one process, interleaved (A B, B A, ...). The reported steady-state images/sec must agree
within noise: checkpoint saves are not training time, and pausing the epoch clock around them
must neither add their time nor drop the steps before them. Also reports the time spent saving.

  python benchmarks/checkpoint_clock.py --every 5 --repeats 5                  # 0.4 ms steps
  python benchmarks/checkpoint_clock.py --model cnn1d --data mnist1d --every 5 --epochs 4
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.common import environment, spread  # noqa: E402
from scaletrain.config import DataConfig, ModelConfig, OptimConfig, TrackingConfig, TrainConfig  # noqa: E402
from scaletrain.console import make_console  # noqa: E402
from scaletrain.runner import run_training  # noqa: E402


def config(root: Path, name: str, every: int, epochs: int, model: str = "mlp", data: str = "digits") -> TrainConfig:
    options = {"hidden": [64]} if model == "mlp" else {}
    cfg = TrainConfig(model=ModelConfig(name=model, options=options), data=DataConfig(name=data),
                      optim=OptimConfig(lr=0.003), epochs=epochs, batch_size=128, progress=False,
                      tracking=TrackingConfig(record=False), run_dir=str(root / name), device="cpu")
    cfg.checkpoint.every = every
    return cfg


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--data", default="digits")
    parser.add_argument("--every", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    quiet = make_console(quiet=True)
    results: dict[str, list] = {"plain": [], "checkpointed": []}
    saving: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for repeat in range(args.repeats):
            order = ("plain", "checkpointed") if repeat % 2 == 0 else ("checkpointed", "plain")
            for side in order:
                every = args.every if side == "checkpointed" else 0
                summary, _ = run_training(config(root, f"{side}-{repeat}", every, args.epochs, args.model, args.data),
                                          console=quiet)
                results[side].append(summary.images_per_sec)
                if every:
                    saving.append(summary.checkpoint_time_s / max(summary.checkpoints_saved, 1) * 1e3)
    import torch
    env = environment(torch.device("cpu"))
    plain, ckpt = spread(results["plain"]), spread(results["checkpointed"])
    ratios = spread([c / p for c, p in zip(results["checkpointed"], results["plain"], strict=True)])
    print(f"{env}")
    print(f"{args.model} on {args.data}, batch 128, {args.epochs} epochs, --checkpoint-every {args.every}, "
          f"{args.repeats} repeats")
    print(f"images/sec without checkpoints: {plain['median']:,.0f} ({plain['min']:,.0f}-{plain['max']:,.0f})")
    print(f"images/sec with checkpoints:    {ckpt['median']:,.0f} ({ckpt['min']:,.0f}-{ckpt['max']:,.0f})")
    print(f"ratio (checkpointed / plain):   {ratios['median']:.3f} ({ratios['min']:.3f}-{ratios['max']:.3f})")
    print(f"time per checkpoint save: {spread(saving)['median']:.1f} ms (median)")


if __name__ == "__main__":
    main()
