"""One LightningModule, unchanged, trained by Lightning's own Trainer and by scaletrain, in one
process, interleaved (A B, B A, A B, ...), the first round dropped (warm-up): per-epoch training
time and time to a validation accuracy (issue 48, item 6).

  (a) scaletrain: `Trainer(LitClassifier(), cfg).fit(train, val=val)`: its training_step and
      validation_step through our step (configure_optimizers read into our fused SGD and schedule);
  (b) Lightning: `lightning.Trainer(...).fit(module, train_loader, val_loader)` on the CPU, no
      logger, checkpointing, progress bar or sanity check (its fastest settings).

Per-epoch training time excludes validation on both sides: scaletrain's clock records it so
(`epoch_train_time_s`); Lightning's is timed by a callback from the epoch's first batch start to
its last batch end (its validation runs after that). Time to target: the training time summed up
to the end of the first epoch whose validation accuracy reaches `--target` (evaluation excluded),
the same epochs on both sides, each round under its own seed (the same on both sides: initial
weights; each side shuffles by its own rules, so an epoch's luck evens out over rounds).

  python benchmarks/lightning_peer.py
  python benchmarks/lightning_peer.py --hidden 1024 --samples 16384
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch
from torch.utils.data import DataLoader, TensorDataset

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "plugins"))
import lit_classifier  # noqa: E402

from benchmarks.common import environment, print_epochs, spread  # noqa: E402
from scaletrain.config import TrainConfig  # noqa: E402
from scaletrain.training import Trainer  # noqa: E402


def time_to_target(epoch_times: list[float], accuracies: list[float], target: float) -> float | None:
    total = 0.0
    for seconds, acc in zip(epoch_times, accuracies, strict=True):
        total += seconds
        if acc >= target:
            return total
    return None


def lightning_run(args, train, val) -> tuple[list[float], list[float]]:
    import lightning as L

    class Clock(L.Callback):
        def __init__(self):
            self.epochs, self.accuracies, self.start = [], [], 0.0

        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            if batch_idx == 0:
                self.start = time.perf_counter()

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            self.end = time.perf_counter()

        def on_validation_epoch_start(self, trainer, module):
            self.epochs.append(self.end - self.start)

        def on_validation_epoch_end(self, trainer, module):
            self.accuracies.append(float(trainer.callback_metrics["val_acc"]))

    torch.manual_seed(args.seed)
    module, clock = lit_classifier.LitClassifier(hidden=args.hidden, lr=args.lr), Clock()
    trainer = L.Trainer(max_epochs=args.epochs, accelerator="cpu", devices=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        num_sanity_val_steps=0, callbacks=[clock])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(module, DataLoader(train, batch_size=args.batch_size, shuffle=True, drop_last=True),
                    DataLoader(val, batch_size=512))
    return clock.epochs, clock.accuracies


def scaletrain_run(args, train, val) -> tuple[list[float], list[float]]:
    cfg = TrainConfig(batch_size=args.batch_size, epochs=args.epochs, seed=args.seed, progress=False,
                      log_every=10**9)
    torch.manual_seed(args.seed)
    with Trainer(lit_classifier.LitClassifier(hidden=args.hidden, lr=args.lr), cfg) as trainer:
        history = trainer.fit(train, val=val)
    return [h["epoch_train_time_s"] for h in history], [h["val_acc"] for h in history]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--samples", type=int, default=8192)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--target", type=float, default=0.9)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    logging.getLogger("lightning").setLevel(logging.ERROR)
    x, y = lit_classifier.samples(args.samples + 2048)
    train, val = TensorDataset(x[:args.samples], y[:args.samples]), TensorDataset(x[args.samples:], y[args.samples:])

    epochs: dict[str, list[float]] = {"scaletrain": [], "lightning": []}
    to_target: dict[str, list[float | None]] = {"scaletrain": [], "lightning": []}
    runs = {"scaletrain": scaletrain_run, "lightning": lightning_run}
    base_seed = args.seed
    for i in range(args.repeats + 1):   # A B, B A, ...: neither side always runs second
        # Each round its own seed (both sides the same): the two shuffle the data differently, so
        # when an epoch reaches the target depends on the order; over rounds that luck evens out.
        args.seed = base_seed + i
        for name in (("scaletrain", "lightning") if i % 2 == 0 else ("lightning", "scaletrain")):
            times, accuracies = runs[name](args, train, val)
            if i > 0:   # the first round: warm-up (imports, allocator, thread pools)
                epochs[name].append(statistics.median(times))
                to_target[name].append(time_to_target(times, accuracies, args.target))
                print(f"  round {i} (seed {args.seed}) {name}: epochs {', '.join(f'{t:.3f}' for t in times)} s; val "
                      f"acc {', '.join(f'{a:.3f}' for a in accuracies)}", flush=True)
    env = environment(torch.device("cpu"))
    import lightning
    print(f"# lightning peer: MLP 16-{args.hidden}-4, {args.samples} samples, batch {args.batch_size}, SGD momentum "
          f"0.9 + StepLR, fp32, {args.epochs} epochs, on {env['device']}, torch {env['torch']}, lightning "
          f"{lightning.__version__}, {env['date']}, {args.repeats} interleaved rounds")
    print("median epoch training time (s):")
    print_epochs(epochs)
    ratios = [a / b for a, b in zip(epochs["scaletrain"], epochs["lightning"], strict=True)]
    r = spread(ratios)
    print(f"epoch time scaletrain / lightning: median {r['median']:.3f} (min {r['min']:.3f}, max {r['max']:.3f})")
    for name, values in to_target.items():
        reached = [v for v in values if v is not None]
        print(f"time to val acc {args.target}: {name}: "
              + (f"median {statistics.median(reached):.3f} s (min {min(reached):.3f}, max {max(reached):.3f}); "
                 if reached else "") + f"reached in {len(reached)}/{len(values)} rounds")


if __name__ == "__main__":
    main()
