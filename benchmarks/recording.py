"""What recording a run costs: the same training with and without the run store's recorder
(per-epoch SQLite writes plus the system-sampling thread), in one process, interleaved
(A B, B A, ...) so drift hits both sides alike. Reports the ratio of steady-state training time
per epoch (the sampler thread competing with the step loop would show here) and of the whole
fit's wall time (the epoch-end writes show here).

  python benchmarks/recording.py --model cnn1d --data mnist1d --batch-size 128
  python benchmarks/recording.py --model mlp --data digits --batch-size 64 --sample-interval-s 0.1
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.common import environment, spread  # noqa: E402
from scaletrain.config import DataConfig, ModelConfig, TrainConfig  # noqa: E402
from scaletrain.data import load_dataset  # noqa: E402
from scaletrain.models import build_model  # noqa: E402
from scaletrain.tracking import RunStore, new_run_id  # noqa: E402
from scaletrain.tracking.recorder import RunRecorder  # noqa: E402
from scaletrain.tracking.system_monitor import SystemMonitor  # noqa: E402
from scaletrain.training import Trainer  # noqa: E402


def fit_once(cfg: TrainConfig, dataset, store: RunStore | None, interval: float) -> tuple[float, float]:
    torch.manual_seed(cfg.seed)
    model = build_model(cfg.model.name, dataset.input_shape, dataset.num_classes, **cfg.model.options)
    start = time.perf_counter()
    callbacks = []
    if store is not None:
        run_id = new_run_id()
        store.start_run(run_id, name="bench")
        callbacks.append(RunRecorder(store, run_id, start, SystemMonitor(interval, torch.device(cfg.device))))
    trainer = Trainer(model, cfg, callbacks)
    trainer.fit(dataset)
    wall = time.perf_counter() - start
    steady = [h["epoch_train_time_s"] for h in trainer.history[1:]]  # epoch 1 holds the warm-up
    return statistics.fmean(steady), wall


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="cnn1d")
    p.add_argument("--data", default="mnist1d")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--repeats", type=int, default=6)
    p.add_argument("--sample-interval-s", type=float, default=1.0)
    p.add_argument("--device", default="cpu")
    args = p.parse_args()
    cfg = TrainConfig(model=ModelConfig(name=args.model), data=DataConfig(name=args.data), epochs=args.epochs,
                      batch_size=args.batch_size, device=args.device, progress=False)
    dataset = load_dataset(cfg.data)
    ratios_train, ratios_wall, on_train, off_train = [], [], [], []
    with tempfile.TemporaryDirectory() as folder, RunStore(Path(folder) / "runs.db") as store:
        fit_once(cfg, dataset, store, args.sample_interval_s)  # untimed warm-up of both paths
        fit_once(cfg, dataset, None, args.sample_interval_s)
        for i in range(args.repeats):
            order = [True, False] if i % 2 == 0 else [False, True]
            result = {record: fit_once(cfg, dataset, store if record else None, args.sample_interval_s)
                      for record in order}
            on_train.append(result[True][0])
            off_train.append(result[False][0])
            ratios_train.append(result[True][0] / result[False][0])
            ratios_wall.append(result[True][1] / result[False][1])
    env = environment(torch.device(args.device))
    print(f"{env}; {args.model} on {args.data}, batch {args.batch_size}, {args.epochs} epochs, "
          f"sampling every {args.sample_interval_s} s, {args.repeats} interleaved pairs")
    print(f"training s/epoch: recorded {statistics.median(on_train):.4f}, not recorded "
          f"{statistics.median(off_train):.4f}")
    print(f"ratio training time (recorded / not): {spread(ratios_train)}")
    print(f"ratio fit wall time (recorded / not): {spread(ratios_wall)}")


if __name__ == "__main__":
    main()
