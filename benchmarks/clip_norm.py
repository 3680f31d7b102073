"""Gradient clipping as the training step does it (`optim/clipping.py`: a float64 sum of the
float32 per-tensor norms, so every split of the gradients clips by the same factor) against
torch's `clip_grad_norm_(foreach=True)`, on one model's real gradients, in one process,
interleaved (A B A B ...), each timed over `--steps` clips after a warm-up.

  python benchmarks/clip_norm.py --model cnn1d --shape 1,40
  python benchmarks/clip_norm.py --model wrn-16-4 --shape 3,32,32
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
from scaletrain.models import build_model  # noqa: E402
from scaletrain.optim import squared_norm  # noqa: E402
from scaletrain.training.clock import synchronize  # noqa: E402


def ours(grads: list[torch.Tensor], max_norm: float, device: torch.device) -> None:
    """TrainStep.clip_'s arithmetic for whole gradients."""
    total = squared_norm(grads, device).sqrt()
    torch._foreach_mul_(grads, (max_norm / (total + 1e-6)).clamp(max=1.0).float())


def torchs(params: list[torch.nn.Parameter], max_norm: float) -> None:
    torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=True)


def timed(fn, steps: int, device: torch.device) -> float:
    synchronize(device)
    start = time.perf_counter()
    for _ in range(steps):
        fn()
    synchronize(device)
    return (time.perf_counter() - start) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="cnn1d")
    parser.add_argument("--shape", default="1,40")
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    device = torch.device(args.device)
    shape = tuple(int(s) for s in args.shape.split(","))
    model = build_model(args.model, shape, args.classes).to(device)
    x = torch.randn(8, *shape, device=device)
    model(x).sum().backward()
    params = [p for p in model.parameters() if p.grad is not None]
    grads = [p.grad for p in params]
    # A max norm far above the gradients' so neither shrinks them while being timed.
    max_norm = 1e30
    a = lambda: ours(grads, max_norm, device)   # noqa: E731
    b = lambda: torchs(params, max_norm)          # noqa: E731
    for fn in (a, b):
        timed(fn, 10, device)
    times = {"scaletrain": [], "torch": []}
    for _ in range(args.repeats):
        times["scaletrain"].append(timed(a, args.steps, device))
        times["torch"].append(timed(b, args.steps, device))
    ratios = [s / t for s, t in zip(times["scaletrain"], times["torch"], strict=True)]
    print(json.dumps({"model": args.model, "tensors": len(grads), "parameters": sum(g.numel() for g in grads),
                      "us_per_clip": {k: spread([v * 1e6 for v in vs]) for k, vs in times.items()},
                      "ratio_scaletrain_over_torch": spread(ratios), **environment(device)}, indent=1))


if __name__ == "__main__":
    main()
