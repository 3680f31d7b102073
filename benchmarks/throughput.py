"""Steady-state training throughput against batch size (and precision, and compile), measured
through the real Trainer on synthetic data kept on the device.

Each configuration: an untimed warm-up (compile/capture, reported), then `--epochs` timed epochs of
`--steps` steps each; the first timed epoch is dropped as warm-up (Throughput callback), the rest
give the run's figure; `--repeats` runs give median and min-max.

  python benchmarks/throughput.py --model cnn1d --shape 1,40 --batch-sizes 32,64,128,256,512
  # On an H100 (issue 2's table):
  python benchmarks/throughput.py --model wrn-16-10 --shape 1,28,28 --batch-sizes 512 \
      --precisions fp32,tf32,bf16-mixed,fp16-mixed --compile both --steps 60
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.common import environment, mfu, spread, train_flops_per_sample  # noqa: E402
from scaletrain.callbacks import Throughput  # noqa: E402
from scaletrain.config import DataConfig, ModelConfig, OptimConfig, PrecisionConfig, TrainConfig  # noqa: E402
from scaletrain.data import load_dataset  # noqa: E402
from scaletrain.models import build_model  # noqa: E402
from scaletrain.training import Trainer, resolve_device  # noqa: E402


def measure(model_name, shape, batch, precision, compiled, steps, epochs, seed, device_name):
    data_cfg = DataConfig(name="synthetic", shape=list(shape), num_samples=batch * steps, num_classes=10)
    dataset = load_dataset(data_cfg, seed=seed)
    torch.manual_seed(seed)
    model = build_model(model_name, dataset.input_shape, 10)
    cfg = TrainConfig(model=ModelConfig(name=model_name), data=data_cfg, epochs=epochs, batch_size=batch,
                      optim=OptimConfig(optimizer="sgd", lr=1e-3), precision=PrecisionConfig(policy=precision),
                      compile=compiled, device=device_name, progress=False, seed=seed, log_every=10**9)
    meter = Throughput(verbose=False)
    trainer = Trainer(model, cfg, [meter])
    trainer.fit(dataset)
    return meter.steady_state(), trainer.warmup_s


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="cnn1d")
    p.add_argument("--shape", default="1,40")
    p.add_argument("--batch-sizes", default="32,64,128,256,512")
    p.add_argument("--precisions", default="fp32")
    p.add_argument("--compile", choices=["off", "on", "both"], default="off")
    p.add_argument("--steps", type=int, default=50, help="steps per timed epoch")
    p.add_argument("--epochs", type=int, default=3, help="epochs per run (the first is dropped)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--device", default="auto")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args()
    device = resolve_device(args.device)
    shape = tuple(int(s) for s in args.shape.split(","))
    env = environment(device)
    flops = train_flops_per_sample(build_model(args.model, shape, 10).to(device), shape, device)
    print(f"# {args.model} {shape} on {env['device']}, torch {env['torch']}, {env['date']}; "
          f"{flops / 1e9:.3f} GFLOP per training sample")
    print("| batch | precision | compile | images/sec median (min-max) | warm-up s | MFU |")
    print("|---|---|---|---|---|---|")
    rows = []
    compiles = {"off": [False], "on": [True], "both": [False, True]}[args.compile]
    for batch in (int(b) for b in args.batch_sizes.split(",")):
        for precision in args.precisions.split(","):
            for compiled in compiles:
                runs = [measure(args.model, shape, batch, precision, compiled, args.steps, args.epochs, r,
                                args.device) for r in range(args.repeats)]
                ips = spread([r[0] for r in runs])
                warm = spread([r[1] for r in runs])
                util = mfu(ips["median"], flops, precision, device)
                rows.append({"batch": batch, "precision": precision, "compile": compiled, "images_per_sec": ips,
                             "warmup_s": warm, "mfu": util})
                print(f"| {batch} | {precision} | {'yes' if compiled else 'no'} | {ips['median']:,.0f} "
                      f"({ips['min']:,.0f}-{ips['max']:,.0f}) | {warm['median']:.2f} | "
                      f"{'-' if util is None else f'{util:.1%}'} |", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"env": env, "model": args.model, "shape": shape,
                                               "flops_per_sample": flops, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
