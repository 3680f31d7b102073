"""A user's own Dataset through the trainer, against the two things it should be compared with, on
MNIST-1D with the default recipe's model, batch and optimizer, in one process, interleaved
(A B C A B C ...), one epoch each, the first round dropped (warm-up):

  (a) device-resident: our in-memory data set, the whole split on the device (the default path);
  (b) general path: the same samples as a user's map-style `torch.utils.data.Dataset` given to
      `Trainer.fit` (host DataLoader, per-sample seeds, copied to the device a batch ahead);
  (c) hand loop: a plain `DataLoader(dataset, shuffle=True)` over the same Dataset and the same
      step (autocast, cross-entropy, fused AdamW) written by hand;
  (d) stream: the same samples as a user's `IterableDataset` (with `__len__`), read in its order
      (data/user.py's StreamBatches: each batch under its own seed, the others' samples skipped).

The goal (issue 46): (b) at most 3 % over (c). Per-epoch training time as the trainer's clock
records it (`epoch_train_time_s`: its epoch's steps, data waits included, evaluation not); the
hand loop timed the same way (a synchronised clock around the epoch's steps).

  python benchmarks/user_data.py
  python benchmarks/user_data.py --num-workers 2
  python benchmarks/user_data.py --time-to-target 5     # through the CLI, each run a process
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, IterableDataset

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.common import environment, print_epochs, spread  # noqa: E402
from scaletrain.config import DataConfig, ModelConfig, OptimConfig, TrainConfig  # noqa: E402
from scaletrain.data import load_dataset  # noqa: E402
from scaletrain.models import build_model  # noqa: E402
from scaletrain.training import Trainer  # noqa: E402
from scaletrain.training.clock import synchronize  # noqa: E402


class Samples(Dataset):
    """What a user writes: features already centred (as the device path centres them), one sample
    a call."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


class Streamed(IterableDataset):
    """The same samples as a user's stream, in order, with its length."""

    def __init__(self, samples: Samples):
        self.samples = samples

    def __len__(self):
        return len(self.samples)

    def __iter__(self):
        return (self.samples[i] for i in range(len(self.samples)))


def hand_epoch(model, opt, loader, device) -> float:
    synchronize(device)
    start = time.perf_counter()
    for x, y in loader:
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        loss = F.cross_entropy(model(x).float(), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    synchronize(device)
    return time.perf_counter() - start


def mnist1d_as_dataset():
    """`--data benchmarks.user_data:mnist1d_as_dataset`: MNIST-1D's own splits as a user's Datasets,
    centred with the training split's statistics as the device path centres them."""
    dataset = load_dataset(DataConfig(name="mnist1d"))
    centre = lambda split: Samples((split.x - dataset.mean) / dataset.std, split.y)   # noqa: E731
    return {"train": centre(dataset.train), "val": centre(dataset.val), "test": centre(dataset.test)}


def time_to_target(runs: int) -> None:
    """The default recipe (`scaletrain train`) against the same with its data as a user's Dataset,
    alternating, each run a process of its own: time to 94 % validation accuracy (the trainer's
    clock: training only) and the epoch it came in."""
    import json
    import subprocess
    import tempfile
    repo = Path(__file__).resolve().parent.parent
    got: dict[str, list[tuple[float, int]]] = {"device-resident": [], "general path": []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(runs):
            for name, extra in (("device-resident", []),
                                ("general path", ["--data", "benchmarks.user_data:mnist1d_as_dataset",
                                                  "--target-accuracy", "0.94"])):
                out = Path(tmp) / f"{name}-{i}.json"
                subprocess.run([sys.executable, "-m", "scaletrain", "train", "--no-progress", *extra,
                                "--run-dir", str(Path(tmp) / f"{name}-{i}"), "--summary-json", str(out)],
                               cwd=repo, check=True, capture_output=True)
                summary = json.loads(out.read_text())
                got[name].append((summary["time_to_target_s"], summary["epochs_run"]))
    env = environment(torch.device("cpu"))
    print(f"# time to 94 %: the default recipe, {runs} alternating runs each, on {env['device']}, torch "
          f"{env['torch']}, {env['date']}")
    for name, values in got.items():
        times = [t for t, _ in values if t is not None]
        s = spread(times) if times else None
        print(f"{name:16s} reached {len(times)}/{runs}; "
              + (f"{s['median']:.2f} s (min {s['min']:.2f}, max {s['max']:.2f}); " if s else "")
              + f"epochs run {[e for _, e in values]}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--num-workers", type=int, default=0)
    p.add_argument("--repeats", type=int, default=6)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--time-to-target", type=int, metavar="RUNS",
                   help="instead: time to 94 %% through the CLI, the default recipe against its data as a user's "
                        "Dataset")
    args = p.parse_args()
    if args.time_to_target:
        time_to_target(args.time_to_target)
        return
    device = torch.device(args.device)
    dataset = load_dataset(DataConfig(name="mnist1d"))
    centred = (dataset.train.x - dataset.mean) / dataset.std
    users = Samples(centred, dataset.train.y)

    def trainer(placement: str) -> Trainer:
        cfg = TrainConfig(model=ModelConfig(name="cnn1d"), data=DataConfig(name="mnist1d", placement=placement,
                                                                            num_workers=args.num_workers),
                          batch_size=args.batch_size, epochs=1, optim=OptimConfig(optimizer="adamw", lr=1e-3),
                          device=args.device, progress=False, log_every=10**9)
        torch.manual_seed(0)
        return Trainer(build_model("cnn1d", dataset.input_shape, 10), cfg)

    resident = trainer("device")
    general = trainer("device")    # placement is not asked: a user Dataset streams
    streamed = trainer("device")
    users_val = Samples((dataset.val.x - dataset.mean) / dataset.std, dataset.val.y)
    torch.manual_seed(0)
    hand_model = build_model("cnn1d", dataset.input_shape, 10).to(device)
    hand_opt = torch.optim.AdamW(hand_model.parameters(), lr=torch.tensor(1e-3, device=device), fused=True)
    hand_loader = DataLoader(users, batch_size=args.batch_size, shuffle=True, drop_last=True,
                             num_workers=args.num_workers, persistent_workers=args.num_workers > 0,
                             pin_memory=device.type == "cuda")

    times: dict[str, list[float]] = {"device-resident": [], "general path": [], "hand loop": [], "stream": []}
    for _ in range(args.repeats + 1):
        for t in (resident, general, streamed):
            t.history.clear()
        resident.fit(dataset)
        times["device-resident"].append(resident.history[-1]["epoch_train_time_s"])
        general.fit(users, val=users_val)
        times["general path"].append(general.history[-1]["epoch_train_time_s"])
        times["hand loop"].append(hand_epoch(hand_model, hand_opt, hand_loader, device))
        streamed.fit(Streamed(users), val=users_val)
        times["stream"].append(streamed.history[-1]["epoch_train_time_s"])
    times = {k: v[1:] for k, v in times.items()}   # the first round: warm-up
    env = environment(device)
    print(f"# user data: cnn1d on MNIST-1D ({len(users)} train samples), batch {args.batch_size}, fp32, "
          f"{args.num_workers} loader workers, on {env['device']}, torch {env['torch']}, {env['date']}, "
          f"{args.repeats} interleaved rounds")
    print_epochs(times)
    over_hand = [g / h for g, h in zip(times["general path"], times["hand loop"], strict=True)]
    over_resident = [g / r for g, r in zip(times["general path"], times["device-resident"], strict=True)]
    stream_over_general = [s / g for s, g in zip(times["stream"], times["general path"], strict=True)]
    for label, ratios in (("general path / hand loop", over_hand), ("general path / device-resident", over_resident),
                          ("stream / general path", stream_over_general)):
        r = spread(ratios)
        print(f"{label}: median {r['median']:.3f} (min {r['min']:.3f}, max {r['max']:.3f}); "
              f"{statistics.median(ratios) - 1:+.1%}")


if __name__ == "__main__":
    main()
