"""Pipeline parallelism measured: step time against the number of micro-batches beside the bubble
fraction and the predictor (prediction/scaling.py `predict_pipeline`), activation memory per stage
for GPipe against 1F1B, and pipeline / tensor / data parallelism at the same process count.

Every run is the real trainer (`build_training`, `fit`) in real processes (torchrun, gloo): the step
time is the trainer's own training clock (warm-up excluded) over the second epoch, divided by its
steps. Activation memory is the peak of the bytes autograd holds for backward (distinct storages,
weights excluded, each released when the graph node holding it is freed), counted by a
saved-tensors hook around the training: what GPipe keeps for M micro-batches and 1F1B for at most
P. One thread per process (as torchrun gives each worker), so P processes on a P-core CPU
compare with one process on one core.

  python benchmarks/pipeline.py                 # the driver: runs every configuration, prints JSON
  python benchmarks/pipeline.py --repeats 3 --steps 12
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import weakref
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def worker(settings: dict, args, out: Path) -> None:
    """One configuration in this process (one rank of it under torchrun)."""
    import torch
    from torch.distributed.tensor import DTensor

    from scaletrain.config import DataConfig, ModelConfig, OptimConfig, TrainConfig
    from scaletrain.training import build_training

    cfg = TrainConfig(model=ModelConfig(name="gpt", options={"dim": args.dim, "depth": args.depth, "heads": 4}),
                      data=DataConfig(name="char-corpus", seq_len=args.seq_len, train_subset=args.batch_size * args.steps),
                      optim=OptimConfig(lr=1e-3), epochs=2, batch_size=args.batch_size, progress=False,
                      eval_each_epoch=False, device="cpu")
    for key, value in settings.items():
        setattr(cfg.distributed, key, value)
    live, peak, held = [0], [0], {}

    class Saved:   # what autograd keeps for backward: freed with the graph node that holds it
        __slots__ = ("tensor", "__weakref__")

    def release(key):
        held[key][0] -= 1
        if held[key][0] == 0:
            live[0] -= held.pop(key)[1]

    def storage_of(t):
        return (t.to_local() if isinstance(t, DTensor) else t).untyped_storage()

    def pack(t):
        storage = storage_of(t)
        key = storage.data_ptr()
        if key in weights:        # a layer's weight saved for its backward: not an activation
            return t
        entry = held.setdefault(key, [0, storage.nbytes()])
        if entry[0] == 0:         # distinct storages only: views of one activation count once
            live[0] += entry[1]
            peak[0] = max(peak[0], live[0])
        entry[0] += 1
        box = Saved()
        # Detached: a box holding a saved *output* itself would form a cycle through the graph
        # (output -> grad_fn -> box -> output) that outlives a graph dropped without backward,
        # such as the forward torch.distributed.pipelining runs to infer a stage's shapes.
        box.tensor = t.detach()
        weakref.finalize(box, release, key)
        return box

    def unpack(box):
        return box.tensor if isinstance(box, Saved) else box

    with build_training(cfg) as built:
        weights = {storage_of(p).data_ptr() for p in built.trainer.model.parameters()}
        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            built.trainer.fit(built.dataset)
        second = built.trainer.history[-1]
        result = {"rank": built.strategy.rank, "step_s": second["epoch_train_time_s"] / built.trainer.steps_per_epoch,
                  "saved_peak_bytes": peak[0], "stage": getattr(built.strategy, "stage_rank", 0),
                  "layout": built.strategy.describe()}
    (out / f"rank{result['rank']}.json").write_text(json.dumps(result))


def run_config(name: str, nproc: int, settings: dict, args, folder: Path) -> list[dict]:
    folder.mkdir(parents=True)
    own = [__file__, "--worker", json.dumps(settings), "--out", str(folder), *args.passthrough]
    cmd = ([sys.executable, *own] if nproc == 1 else
           [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc), *own])
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise SystemExit(f"{name} failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
    return [json.loads((folder / f"rank{r}.json").read_text()) for r in range(nproc)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--depth", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--steps", type=int, default=10, help="steps per epoch (the second epoch is timed)")
    p.add_argument("--stages", type=int, default=2)
    p.add_argument("--microbatches", default="2,4,8,16")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    args.passthrough = ["--dim", str(args.dim), "--depth", str(args.depth), "--seq-len", str(args.seq_len),
                        "--batch-size", str(args.batch_size), "--steps", str(args.steps)]
    if args.worker:
        worker(json.loads(args.worker), args, Path(args.out))
        return

    import torch

    from benchmarks.common import environment, spread
    from scaletrain.prediction.scaling import predict_pipeline

    P = args.stages
    configs = {"single": (1, {"strategy": "single"}),
               "ddp": (P, {"strategy": "ddp"}),
               "tensor": (P, {"strategy": "tensor", "tensor_parallel": P})}
    for m in map(int, args.microbatches.split(",")):
        for schedule in ("gpipe", "1f1b"):
            configs[f"{schedule} M={m}"] = (P, {"strategy": "pipeline", "stages": P, "microbatches": m,
                                                "schedule": schedule})
    results: dict[str, list[list[dict]]] = {name: [] for name in configs}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):      # interleaved, so drift hits every configuration alike
            for name, (nproc, settings) in configs.items():
                results[name].append(run_config(name, nproc, settings, args, Path(tmp) / f"{r}-{name.replace(' ', '_')}"))

    def step_ms(name):   # a step ends when its slowest rank ends
        return spread([max(rank["step_s"] for rank in repeat) * 1e3 for repeat in results[name]])

    single = statistics.median(max(rank["step_s"] for rank in repeat) for repeat in results["single"])
    samples = args.batch_size
    table = {}
    for name in configs:
        row = {"step_ms": step_ms(name), "samples_per_s": samples / (step_ms(name)["median"] / 1e3)}
        if name.startswith(("gpipe", "1f1b")):
            m = configs[name][1]["microbatches"]
            predicted = predict_pipeline(single, P, m)
            row |= {"bubble_fraction": predicted.bubble_fraction, "predicted_step_ms": predicted.step_time_s * 1e3,
                    "saved_activation_peak_mib_per_stage": [
                        round(max(rk["saved_peak_bytes"] for rk in results[name][0] if rk["stage"] == s) / 2**20, 2)
                        for s in range(P)],
                    "layout": results[name][0][0]["layout"]}
        else:
            row["saved_activation_peak_mib"] = round(results[name][0][0]["saved_peak_bytes"] / 2**20, 2)
        if name == "ddp":
            row["note"] = f"{P} replicas of batch {samples // P}: a step processes the same {samples} samples"
        table[name] = row
    print(json.dumps({"env": environment(torch.device("cpu")) | {"processes_threads": 1},
                      "args": {k: v for k, v in vars(args).items() if k not in ("worker", "out", "passthrough")},
                      "results": table}, indent=2))


if __name__ == "__main__":
    main()
