"""DDP's cost against single-process training at the same per-replica batch, through the real CLI
and launcher, interleaved (single, ddp-1, ddp-N, single, ...) so drift hits every side alike.

  single  : one process, plain strategy, batch b
  ddp x1  : one process, --strategy ddp (the wrapper, its hooks and a world-size-1 all-reduce)
  ddp xN  : --nproc N, per-replica batch b (adds the real all-reduce between processes)

Per-step time = per-replica batch / per-replica throughput; overhead = ratio to `single`.
Every process gets one thread (OMP_NUM_THREADS=1, what torchrun gives each worker) so N ranks on
an N-core CPU compare with one rank on one core.

  python benchmarks/ddp_overhead.py --model cnn1d --shape 1,40 --batch-size 128
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.common import environment, spread  # noqa: E402
from scaletrain.distributed import resolve_device  # noqa: E402


def one_run(kind: str, args, out: Path, nproc: int) -> float:
    """Per-step seconds of one replica (steady-state epochs only)."""
    summary = out / f"{kind}.json"
    cmd = [sys.executable, "-m", "scaletrain", "train", "--model", args.model, "--data", "synthetic",
           "--shape", args.shape, "--num-samples", str(args.batch_size * args.steps * (nproc if kind == "ddpN" else 1)),
           "--epochs", str(args.epochs), "--per-replica-batch-size", str(args.batch_size), "--precision", args.precision,
           "--device", args.device, "--no-eval-each-epoch", "--no-progress", "--no-save-model", "--log-every", "1000000",
           "--run-dir", str(out / kind), "--summary-json", str(summary)]
    if kind == "single":
        cmd += ["--strategy", "single"]
    elif kind == "ddp1":
        cmd += ["--strategy", "ddp"]
    else:
        cmd += ["--nproc", str(nproc)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run(cmd, check=True, capture_output=True, env=env)
    s = json.loads(summary.read_text())
    replicas = s["world_size"]
    return args.batch_size / (s["images_per_sec"] / replicas)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="cnn1d")
    p.add_argument("--shape", default="1,40")
    p.add_argument("--batch-size", type=int, default=128, help="per-replica batch")
    p.add_argument("--precision", default="fp32")
    p.add_argument("--steps", type=int, default=60, help="steps per epoch")
    p.add_argument("--epochs", type=int, default=4, help="the first is a warm-up epoch, the rest are timed")
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--device", default="cpu")
    args = p.parse_args()
    times: dict[str, list[float]] = {"single": [], "ddp1": [], "ddpN": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            for kind in times:
                times[kind].append(one_run(kind, args, Path(tmp) / f"r{r}", args.nproc))
    base = statistics.median(times["single"])
    result = {"env": environment(resolve_device(args.device)), "args": vars(args),
              "step_ms": {k: spread([t * 1e3 for t in v]) for k, v in times.items()},
              "overhead_ratio": {k: spread([t / base for t in v]) for k, v in times.items() if k != "single"}}
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
