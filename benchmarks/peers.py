"""scaletrain against a hand loop and Lightning on the default recipe's model and data, the two
tables of MEASURE.md (benchmarks/peer_arms.py says what each side runs): **no flags** (each tool's
defaults) and **equal settings** (each given the same precision, memory format, compile and data
path). The same model, initial weights, data, batch, AdamW and one-cycle schedule everywhere.

    python benchmarks/peers.py --rounds 12                        # both tables, MNIST-1D cnn1d
    python benchmarks/peers.py --tables equal --equal fp32,fp32+compile --rounds 3
    python benchmarks/peers.py --model mlp --data synthetic --shape 1,8,8 --batch-size 64

Rounds interleave the sides (A B C, B C A, C A B, ...), all in this process; each side's
per-epoch training time is the median of its epochs after the first (the first holds the
start-up: compilation, allocator growth), and each round's ratio is scaletrain's over the other
side's. Reported: per side the median epoch (min-max over rounds), time to the target accuracy,
final validation accuracy; per pair the median ratio (min-max). A ratio below 1: scaletrain is
faster.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import environment  # noqa: E402
from benchmarks.peer_arms import ARMS, NO_FLAGS, Case, Equal  # noqa: E402


def make_case(args, seed: int, device: torch.device) -> Case:
    from scaletrain.config import DataConfig
    from scaletrain.data import load_dataset
    from scaletrain.models import build_model
    data_cfg = DataConfig(name=args.data, shape=[int(s) for s in args.shape.split(",")] if args.shape else [3, 32, 32],
                          num_samples=args.samples)
    ds = load_dataset(data_cfg, seed=0)
    norm = lambda x: (x.float() - ds.mean) / ds.std  # noqa: E731 - the trainer's own normalisation
    val = ds.val if ds.val is not None else ds.test

    def model():
        torch.manual_seed(seed)
        return build_model(args.model, ds.input_shape, ds.num_classes)
    return Case(args.model, model, (norm(ds.train.x), ds.train.y), (norm(val.x), val.y), args.batch_size, args.epochs,
                lr=args.lr, weight_decay=args.weight_decay, dataset=ds, device=device)


def parse_equal(text: str) -> list[Equal]:
    out = []
    for item in text.split(","):
        parts = item.split("+")
        out.append(Equal(precision=parts[0], channels_last="channels_last" in parts, compile="compile" in parts))
    return out


def spread(values: list[float | None], fmt: str = ".3f") -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    return f"{statistics.median(values):{fmt}} ({min(values):{fmt}}-{max(values):{fmt}})"


def table(title: str, settings: Equal | None, args, device: torch.device) -> dict:
    sides = list(ARMS)
    results: dict[str, list] = {s: [] for s in sides}
    for r in range(args.rounds):
        case = make_case(args, seed=r, device=device)
        for side in sides[r % len(sides):] + sides[:r % len(sides)]:
            result = ARMS[side](case, settings)
            results[side].append(result)
            print(json.dumps({"table": title, "round": r, "side": side, "epoch_s": [round(t, 4) for t in result.epoch_s],
                              "val_accuracy": result.val_accuracy}), flush=True)
    epoch = {s: [statistics.median(res.epoch_s[1:]) for res in results[s]] for s in sides}
    print(f"\n## {title}: {args.model} on {args.data}, batch {args.batch_size}, {args.epochs} epochs, "
          f"{args.rounds} rounds")
    for s in sides:
        print(f"{s:11s} epoch {spread([e * 1e3 for e in epoch[s]], ',.1f')} ms  time to {args.target:g} "
              f"{spread([res.time_to(args.target) for res in results[s]])} s  final val acc "
              f"{spread([res.val_accuracy[-1] for res in results[s]], '.4f')}")
    ratios = {}
    for other in sides[1:]:
        pairs = sorted(a / b for a, b in zip(epoch["scaletrain"], epoch[other], strict=True))
        ratios[other] = pairs
        print(f"scaletrain / {other}: epoch time {statistics.median(pairs):.3f} ({pairs[0]:.3f}-{pairs[-1]:.3f})")
    return {"title": title, "epoch_s": epoch, "ratios": ratios}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="cnn1d")
    p.add_argument("--data", default="mnist1d")
    p.add_argument("--shape", default="", help="sample shape of --data synthetic, e.g. 1,8,8")
    p.add_argument("--samples", type=int, default=None, help="--num-samples of a generated data set")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--weight-decay", type=float, default=0.05)
    p.add_argument("--target", type=float, default=0.94)
    p.add_argument("--rounds", type=int, default=12)
    p.add_argument("--tables", default="no-flags,equal")
    p.add_argument("--equal", default="fp32", help="equal-settings rows, e.g. fp32,fp32+compile,bf16-mixed")
    p.add_argument("--device", default="cpu")
    args = p.parse_args()
    device = torch.device(args.device)
    print(json.dumps(environment(device)), flush=True)
    tables = args.tables.split(",")
    if "no-flags" in tables:
        table("no flags", NO_FLAGS, args, device)
    if "equal" in tables:
        for settings in parse_equal(args.equal):
            table(f"equal settings: {settings.label}", settings, args, device)


if __name__ == "__main__":
    main()
