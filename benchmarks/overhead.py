"""The trainer's overhead against a plain hand-written PyTorch loop: same model, same data on the
device, same batch, same precision, same fused optimizer, same number of steps, in one process,
interleaved (A B A B ...) so drift hits both sides alike. Reports the ratio of per-step times.

  python benchmarks/overhead.py --model cnn1d --shape 1,40 --batch-size 128
  python benchmarks/overhead.py --model wrn-16-10 --shape 1,28,28 --batch-size 512 --precision bf16-mixed
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.common import environment, spread  # noqa: E402
from scaletrain.callbacks import Throughput  # noqa: E402
from scaletrain.config import DataConfig, ModelConfig, OptimConfig, PrecisionConfig, TrainConfig  # noqa: E402
from scaletrain.data import load_dataset  # noqa: E402
from scaletrain.models import build_model  # noqa: E402
from scaletrain.precision import get_policy  # noqa: E402
from scaletrain.training import Trainer, resolve_device  # noqa: E402
from scaletrain.training.clock import synchronize  # noqa: E402


def handwritten_epoch_time(model, opt, x_all, y_all, mean, std, batch, policy, device) -> float:
    """What a careful user writes by hand: device-resident data, one randperm, fused AdamW."""
    n = len(y_all) // batch
    perm = torch.randperm(len(y_all), device=device)
    synchronize(device)
    start = time.perf_counter()
    for i in range(n):
        idx = perm[i * batch:(i + 1) * batch]
        x = ((x_all[idx].float() - mean) / std).to(policy.input_dtype)
        y = y_all[idx]
        with policy.autocast(device):
            out = model(x)
        loss = F.cross_entropy(out.float(), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    synchronize(device)
    return (time.perf_counter() - start) / n


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="cnn1d")
    p.add_argument("--shape", default="1,40")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--precision", default="fp32")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--device", default="auto")
    args = p.parse_args()
    device = resolve_device(args.device)
    shape = tuple(int(s) for s in args.shape.split(","))
    data_cfg = DataConfig(name="synthetic", shape=list(shape), num_samples=args.batch_size * args.steps)
    dataset = load_dataset(data_cfg)
    policy = get_policy(args.precision)

    # scaletrain: one Trainer, fit for 1 + repeats epochs; the Throughput callback times each.
    cfg = TrainConfig(model=ModelConfig(name=args.model), data=data_cfg, batch_size=args.batch_size,
                      epochs=1, optim=OptimConfig(optimizer="adamw", lr=1e-4),
                      precision=PrecisionConfig(policy=args.precision), device=args.device, progress=False,
                      log_every=10**9)
    torch.manual_seed(0)
    # The hand-written side: same model class and weights, same fused AdamW.
    torch.manual_seed(0)
    hand_model = policy.convert_module(build_model(args.model, shape, 10)).to(device)
    hand_opt = torch.optim.AdamW(hand_model.parameters(), lr=torch.tensor(1e-4, device=device), fused=True)
    x_all, y_all = dataset.train.x.to(device), dataset.train.y.to(device)
    mean, std = dataset.mean.to(device), dataset.std.to(device)
    handwritten_epoch_time(hand_model, hand_opt, x_all, y_all, mean, std, args.batch_size, policy, device)  # warm-up

    torch.manual_seed(0)
    meter = Throughput(verbose=False)
    trainer = Trainer(build_model(args.model, shape, 10), cfg, [meter])
    ours, theirs = [], []
    for _ in range(args.repeats):  # interleaved: trainer epoch, hand-written epoch, ...
        trainer.config.epochs = 1
        trainer.history.clear()
        trainer.fit(dataset)
        ours.append(args.batch_size / meter.per_epoch[-1])
        theirs.append(handwritten_epoch_time(hand_model, hand_opt, x_all, y_all, mean, std, args.batch_size,
                                             policy, device))
    # The first trainer epoch includes its own warm-up effects; drop the first pair.
    ours, theirs = ours[1:], theirs[1:]
    ratios = [a / b for a, b in zip(ours, theirs, strict=True)]
    env = environment(device)
    print(f"# overhead: {args.model} {shape} batch {args.batch_size} {args.precision} on {env['device']}, "
          f"torch {env['torch']}, {env['date']}, {args.steps} steps/epoch, {len(ratios)} interleaved pairs")
    s, h, r = spread([t * 1e3 for t in ours]), spread([t * 1e3 for t in theirs]), spread(ratios)
    print(f"scaletrain step  {s['median']:.3f} ms (min {s['min']:.3f}, max {s['max']:.3f})")
    print(f"hand-written     {h['median']:.3f} ms (min {h['min']:.3f}, max {h['max']:.3f})")
    print(f"ratio scaletrain/hand-written: median {r['median']:.3f} (min {r['min']:.3f}, max {r['max']:.3f}); "
          f"overhead {statistics.median(ratios) - 1:+.1%}")


if __name__ == "__main__":
    main()
