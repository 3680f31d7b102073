"""Seed 002's bandwidth claim, measured and predicted: at a fixed number of workers, does sharding
the parameters over more servers shorten the exchange? Real torchrun processes over gloo on this
host (2 workers + K servers, sync mode, one thread each), a 1.1M-parameter MLP (five 512-wide
layers: four equal 1 MiB tensors a server can hold whole), interleaved over repeats.

Each run's exchange time per step is the workers' `ps_exchange_s` over the epochs after the first
(what a push and pull cost, waiting included). The predictor (`predict_parameter_server`) is
calibrated on K=1 only: its link bandwidth is fitted so that K=1's measured exchange is met, then
K=2 and 4 are predicted and set beside their measurements.

  python benchmarks/parameter_server_scaling.py --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from itertools import pairwise
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.common import spread  # noqa: E402
from scaletrain.prediction.hardware import Interconnect  # noqa: E402
from scaletrain.prediction.scaling import predict_parameter_server  # noqa: E402

WORKERS, BATCH = 2, 64
LAYERS = [64, 512, 512, 512, 512, 512, 10]
BASE = ["--model", "mlp", "--model-option", "hidden=[512,512,512,512,512]", "--data", "digits", "--no-progress",
        "--no-record", "--target-accuracy", "0.999", "--epochs", "3", "--batch-size", str(BATCH), "--no-save-model",
        "--no-eval-each-epoch", "--strategy", "ps", "--device", "cpu"]


def tensor_bytes() -> list[int]:
    out = []
    for a, b in pairwise(LAYERS):
        out += [4 * a * b, 4 * b]
    return out


def one(root: Path, name: str, servers: int) -> dict:
    run_dir = root / name
    args = [*BASE, "--nproc", str(WORKERS + servers), "--num-ps", str(servers), "--run-dir", str(run_dir)]
    result = subprocess.run([sys.executable, "-m", "scaletrain", "train", *args], capture_output=True, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"}, cwd=root)
    if result.returncode != 0:
        raise SystemExit(result.stderr[-3000:])
    epochs = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()][1:]
    steps = sum(e["ps_pushes"] for e in epochs) / WORKERS
    train_s = sum(e["epoch_train_time_s"] for e in epochs)
    return {"step_ms": 1e3 * train_s / steps, "exchange_ms": 1e3 * sum(e["ps_exchange_s"] for e in epochs) / steps,
            "images_per_sec": sum(e["samples"] for e in epochs) / train_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--servers", type=int, nargs="+", default=[1, 2, 4])
    args = parser.parse_args()
    results: dict[int, list[dict]] = {k: [] for k in args.servers}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            for k in (args.servers if r % 2 == 0 else list(reversed(args.servers))):
                results[k].append(one(Path(tmp), f"{r}-{k}", k))
    median = {k: {key: spread([run[key] for run in runs])["median"] for key in runs[0]} for k, runs in results.items()}
    # Calibrate one number on K=1: the bandwidth that makes the model's K=1 exchange the measured one.
    sizes, k1 = tensor_bytes(), min(args.servers)
    unit = predict_parameter_server(0.0, BATCH // WORKERS, sizes, WORKERS, k1, Interconnect("fit", 1.0, 0.0, ""))
    link = Interconnect("loopback (fitted on K=1)", unit.exchange_s / (median[k1]["exchange_ms"] / 1e3), 0.0, "")
    compute_ms = median[k1]["step_ms"] - median[k1]["exchange_ms"]
    print(f"fitted link: {link.bus_bandwidth / 1e9:.2f} GB/s; compute per step {compute_ms:.2f} ms (K={k1})")
    print("| servers | largest shard MiB | exchange ms measured | exchange ms predicted | step ms measured | "
          "step ms predicted | images/s measured |")
    print("|---|---|---|---|---|---|---|")
    for k, runs in results.items():
        p = predict_parameter_server(compute_ms / 1e3, BATCH // WORKERS, sizes, WORKERS, k, link)
        ex, step = spread([r["exchange_ms"] for r in runs]), spread([r["step_ms"] for r in runs])
        print(f"| {k} | {p.largest_shard_bytes / 2**20:.2f} | {ex['median']:.2f} ({ex['min']:.2f}-{ex['max']:.2f}) | "
              f"{p.exchange_s * 1e3:.2f} | {step['median']:.2f} ({step['min']:.2f}-{step['max']:.2f}) | "
              f"{p.step_time_s * 1e3:.2f} | {median[k]['images_per_sec']:,.0f} |")


if __name__ == "__main__":
    main()
