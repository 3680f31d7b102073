"""When does the input pipeline hold training back? Images/sec and time blocked on the loader for
the device-resident path and for streamed shards (`--data shards`) at several worker counts and
prefetch depths, with a simulated per-sample decode cost (busy-waiting, like a JPEG decoder), all
in one script run on the same data, model and batch size. Runs are interleaved over repeats.

  python benchmarks/input_pipeline.py                       # CPU: synthetic 3x32x32, MLP 3072-512-10
  python benchmarks/input_pipeline.py --decode-us 0,100,300 --workers 0,1,2 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.common import environment, spread  # noqa: E402
from scaletrain.callbacks import Throughput  # noqa: E402
from scaletrain.config import DataConfig, ModelConfig, OptimConfig, TrainConfig  # noqa: E402
from scaletrain.data import load_dataset  # noqa: E402
from scaletrain.data.shards import write_shards  # noqa: E402
from scaletrain.data.shards.stream import ShardStream  # noqa: E402
from scaletrain.training import build_training  # noqa: E402


def config(args, data: DataConfig) -> TrainConfig:
    options = {"hidden": [args.hidden]} if args.model == "mlp" else {}
    return TrainConfig(model=ModelConfig(name=args.model, options=options), data=data, optim=OptimConfig(lr=1e-3),
                       epochs=args.epochs, batch_size=args.batch_size, progress=False, eval_each_epoch=False,
                       save_model=False, device=args.device, seed=0)


def measure(cfg: TrainConfig, decode_s: float) -> dict:
    """Steady-state images/sec (epochs after the first) and the share of that time spent blocked on the loader."""
    ShardStream.decode_cost_s = decode_s
    throughput = Throughput(verbose=False)
    with build_training(cfg, callbacks=[throughput]) as built:
        history = built.trainer.fit(built.dataset)
    steady = history[1:]
    train_s = sum(h["epoch_train_time_s"] for h in steady)
    return {"images_per_sec": throughput.steady_state(),
            "data_wait_share": sum(h["data_wait_s"] for h in steady) / train_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--hidden", type=int, default=512, help="the MLP's hidden width")
    parser.add_argument("--samples", type=int, default=6144)
    parser.add_argument("--samples-per-shard", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--decode-us", default="0,25,100", help="simulated decode cost per sample, microseconds")
    parser.add_argument("--workers", default="0,1,2")
    parser.add_argument("--prefetch", default="1,2,4", help="prefetch depths tried with the most workers")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    torch.set_num_threads(1)   # the main process computes on one core; the workers get the rest
    source = DataConfig(name="synthetic", shape=[3, 32, 32], num_samples=args.samples)
    workers = [int(w) for w in args.workers.split(",")]
    prefetch = [int(p) for p in args.prefetch.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        write_shards(load_dataset(source), Path(tmp) / "s", args.samples_per_shard)
        points = [("device-resident", 0.0, source)]
        for us in (float(u) for u in args.decode_us.split(",")):
            for w in workers:
                for p in (prefetch if w == max(workers) else [2]):
                    shards = DataConfig(name="shards", data_dir=str(Path(tmp) / "s"), num_workers=w, prefetch=p)
                    points.append((f"shards decode {us:g} us, {w} worker(s), prefetch {p}", us * 1e-6, shards))
        results: dict[str, list[dict]] = {name: [] for name, _, _ in points}
        for _ in range(args.repeats):
            for name, decode_s, data in points:
                results[name].append(measure(config(args, data), decode_s))
    env = environment(torch.device(args.device))
    print(f"# {env}  model {args.model}, batch {args.batch_size}, {args.samples} samples 3x32x32, "
          f"{args.repeats} repeats (median, min-max)")
    print("| pipeline | images/sec | time blocked on the loader |")
    print("|---|---|---|")
    table = {}
    for name, runs in results.items():
        ips = spread([r["images_per_sec"] for r in runs])
        wait = spread([r["data_wait_share"] for r in runs])
        table[name] = {"images_per_sec": ips, "data_wait_share": wait}
        print(f"| {name} | {ips['median']:,.0f} ({ips['min']:,.0f}-{ips['max']:,.0f}) | "
              f"{wait['median']:.0%} ({wait['min']:.0%}-{wait['max']:.0%}) |")
    if args.json:
        args.json.write_text(json.dumps({"environment": env, "results": table}, indent=2))


if __name__ == "__main__":
    main()
