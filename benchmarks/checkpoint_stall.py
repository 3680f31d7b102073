"""How long does a checkpoint stop training? The same run (`run_training`: run folder,
checkpointer, callbacks) saving every N steps with `--no-async-save` (training waits for the
whole write and the commit's SHA-256 manifest) and with background saves (training waits for the
copy to host memory; the writing and the commit run on DCP's writer thread), interleaved
(A B, B A, ...), fresh run folders each time.

Each `Checkpointer.save` call is timed on the training thread: that is the stall. The wait at the
end for the last background save is reported apart, and so are the steady-state images/sec (a
background write shares the CPU with the training) and the whole run's wall time.

  python benchmarks/checkpoint_stall.py --model vit-small --repeats 3
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.common import environment, spread  # noqa: E402
from scaletrain.checkpoint.checkpointer import Checkpointer  # noqa: E402
from scaletrain.config import DataConfig, ModelConfig, OptimConfig, TrackingConfig, TrainConfig  # noqa: E402
from scaletrain.console import make_console  # noqa: E402
from scaletrain.runner import run_training  # noqa: E402


def config(root: Path, name: str, args, background: bool) -> TrainConfig:
    cfg = TrainConfig(model=ModelConfig(name=args.model),
                      data=DataConfig(name="synthetic", shape=[3, 32, 32], num_samples=args.samples, num_classes=10),
                      optim=OptimConfig(optimizer="adamw", lr=1e-4), epochs=args.epochs, batch_size=args.batch_size,
                      progress=False, tracking=TrackingConfig(record=False), run_dir=str(root / name), device="cpu")
    cfg.checkpoint.every = args.every
    cfg.checkpoint.async_save = background
    cfg.checkpoint.keep = 2
    return cfg


class TimedSaves:
    """Times each Checkpointer.save and the final wait on the training thread."""

    def __init__(self):
        self.saves: list[float] = []
        self.final_wait: list[float] = []
        self._save, self._wait = Checkpointer.save, Checkpointer.wait

    def __enter__(self):
        timer = self

        def save(checkpointer, trainer):
            start = time.perf_counter()
            try:
                return timer._save(checkpointer, trainer)
            finally:
                timer.saves.append(time.perf_counter() - start)

        def wait(checkpointer):
            start = time.perf_counter()
            try:
                return timer._wait(checkpointer)
            finally:
                timer.final_wait.append(time.perf_counter() - start)

        Checkpointer.save, Checkpointer.wait = save, wait
        return self

    def __exit__(self, *exc):
        Checkpointer.save, Checkpointer.wait = self._save, self._wait


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="vit-small")
    parser.add_argument("--samples", type=int, default=400)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--every", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    quiet = make_console(quiet=True)
    sides = {"sync": False, "async": True}
    stalls: dict[str, list[float]] = {s: [] for s in sides}
    end_waits: dict[str, list[float]] = {s: [] for s in sides}
    speed: dict[str, list[float]] = {s: [] for s in sides}
    saved: dict[str, list[int]] = {s: [] for s in sides}
    walls: dict[str, list[float]] = {s: [] for s in sides}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for repeat in range(args.repeats):
            for side in (("sync", "async") if repeat % 2 == 0 else ("async", "sync")):
                with TimedSaves() as timed:
                    start = time.perf_counter()
                    summary, _ = run_training(config(root, f"{side}-{repeat}", args, sides[side]), console=quiet)
                    walls[side].append(time.perf_counter() - start)
                # The final save happens after the last epoch (not a mid-training stall): leave it out.
                stalls[side] += timed.saves[:-1] if len(timed.saves) > 1 else timed.saves
                end_waits[side].append(sum(timed.final_wait))
                speed[side].append(summary.images_per_sec)
                saved[side].append(summary.checkpoints_saved)
    import torch
    print(environment(torch.device("cpu")))
    print(f"{args.model} on synthetic 3x32x32, batch {args.batch_size}, {args.samples} samples, {args.epochs} epochs, "
          f"--checkpoint-every {args.every}, {args.repeats} repeats each, interleaved")
    for side in sides:
        st, ips = spread(stalls[side]), spread(speed[side])
        print(f"{side:>5}: stall per mid-run save {st['median'] * 1e3:,.0f} ms (min {st['min'] * 1e3:,.0f}, max "
              f"{st['max'] * 1e3:,.0f}, n={st['n']}); end-of-run wait {spread(end_waits[side])['median'] * 1e3:,.0f} "
              f"ms; images/sec {ips['median']:,.1f} ({ips['min']:,.1f}-{ips['max']:,.1f}); run wall "
              f"{spread(walls[side])['median']:.1f} s; saves per run {saved[side]}")
    ratio = spread(stalls["sync"])["median"] / spread(stalls["async"])["median"]
    print(f"stall ratio (sync / async, medians): {ratio:.1f}x")


if __name__ == "__main__":
    main()
