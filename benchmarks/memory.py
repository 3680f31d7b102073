"""Seed 004's experiment: the largest batch and the throughput for fp32, bf16-mixed and
bf16-mixed + activation checkpointing on one device, with the memory planner's prediction against
the measured peak at that batch.

Per configuration: the batch-size finder (real training steps) gives the largest batch; then the
trainer's own step runs at that batch, timed after an untimed warm-up, with the peak measured
(torch.cuda.max_memory_allocated on a GPU; live tensor bytes on a CPU, where --memory-limit is the
budget). The configurations are interleaved over --repeats rounds (MEASURE.md).

  python benchmarks/memory.py --model vit-base --model-option patch_size=16 --shape 3,224,224 --device cuda
  python benchmarks/memory.py --model vit --model-option dim=96 --model-option depth=6 --model-option heads=4 \\
      --shape 3,32,32 --device cpu --memory-limit 1GB
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.common import environment, spread  # noqa: E402
from scaletrain.config import DataConfig, ModelConfig, TrainConfig  # noqa: E402
from scaletrain.data import load_dataset  # noqa: E402
from scaletrain.memory.batch_finder import BatchSizeFinder  # noqa: E402
from scaletrain.memory.planner import Planner, PlanRequest  # noqa: E402
from scaletrain.memory.units import parse_bytes  # noqa: E402
from scaletrain.models import build_model  # noqa: E402
from scaletrain.training import Trainer  # noqa: E402
from scaletrain.training.snapshot import TrainingSnapshot  # noqa: E402

CONFIGS = (("fp32", False), ("bf16-mixed", False), ("bf16-mixed", True))


def _options(items):
    out = {}
    for item in items:
        key, value = item.split("=", 1)
        out[key] = json.loads(value) if value[:1].isdigit() or value[:1] in "[{" else value
    return out


def _trainer(args, precision, ac, dataset):
    cfg = TrainConfig(model=ModelConfig(name=args.model, options=_options(args.model_option)),
                      data=DataConfig(name="synthetic", shape=list(dataset.input_shape)),
                      epochs=1, batch_size=8, device=args.device, progress=False, compile=args.compile)
    cfg.precision.policy = precision
    cfg.memory.activation_checkpointing = ac
    torch.manual_seed(0)
    model = build_model(args.model, dataset.input_shape, dataset.num_classes, **cfg.model.options)
    return Trainer(model, cfg)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="vit")
    p.add_argument("--model-option", action="append", default=[])
    p.add_argument("--shape", default="3,32,32")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--memory-limit", default=None, help="budget per device (required on CPU)")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--compile", action="store_true")
    args = p.parse_args()
    shape = [int(s) for s in args.shape.split(",")]
    dataset = load_dataset(DataConfig(name="synthetic", shape=shape, num_samples=4096))
    limit = parse_bytes(args.memory_limit) if args.memory_limit else None
    found, trainers = {}, {}
    for precision, ac in CONFIGS:
        trainer = _trainer(args, precision, ac, dataset)
        finder = BatchSizeFinder(trainer, dataset, steps=3, margin=0.0, memory_limit=limit)
        found[(precision, ac)] = finder.run(start=8, max_batch=1 << 15).max_batch_size
        trainers[(precision, ac)] = (trainer, finder)
    timings = {key: [] for key in CONFIGS}
    peaks = {}
    for _ in range(args.repeats):            # interleaved: A B C A B C ...
        for key in CONFIGS:
            trainer, finder = trainers[key]
            batch = found[key]
            snapshot = TrainingSnapshot(trainer.model, trainer.optimizer, trainer.counters.tensors())
            peak, rate = finder.measure(batch, args.steps + 1)
            snapshot.restore()
            peaks[key] = peak
            timings[key].append(rate)
    print(json.dumps({"environment": environment(trainers[CONFIGS[0]][0].device), "date": time.strftime("%Y-%m-%d")}))
    print("| precision | activation checkpointing | largest batch | samples/s (median, min-max) | measured peak | "
          "planned peak | planned / measured |")
    print("|---|---|---|---|---|---|---|")
    for precision, ac in CONFIGS:
        batch = found[(precision, ac)]
        planner = Planner(PlanRequest(model=args.model, model_options=_options(args.model_option),
                                      input_shape=tuple(shape), num_classes=dataset.num_classes, batch_size=batch,
                                      precision=precision, activation_checkpointing=ac))
        plan = planner.plan("ddp", 1, batch)
        # One device: no DDP buckets, no cuBLAS workspace on a CPU.
        planned = plan.total_bytes - (plan.workspace_bytes if args.device == "cpu" else 0)
        s = spread(timings[(precision, ac)])
        print(f"| {precision} | {'yes' if ac else 'no'} | {batch} | {s['median']:,.0f} "
              f"({s['min']:,.0f}-{s['max']:,.0f}) | {peaks[(precision, ac)] / 2**20:,.1f} MiB | "
              f"{planned / 2**20:,.1f} MiB | {planned / peaks[(precision, ac)]:.3f} |")


if __name__ == "__main__":
    main()
