"""Part d: scaletrain beside a hand loop and Lightning, in one process on one device, in MEASURE.md's
two tables (benchmarks/peer_arms.py says what each side runs and how it is timed):

- **no flags**: each tool's defaults on part c's model (WRN-16-10, 28×28×1, batch 512, synthetic
  data): scaletrain's (bf16-mixed and channels_last on this GPU, cudnn.benchmark) against a hand
  loop as PyTorch's tutorials write it and Lightning's Trainer (both fp32: TF32 convolutions);
  then the default recipe (MNIST-1D, cnn1d) to 94 % on each, seeds interleaved.
- **equal settings**: bf16-mixed + channels_last on every side (eager); the same with
  torch.compile is in part `compiled` (a minute of compilation a side).

Images/sec over the epochs after the first (12,800 samples each), MFU against the datasheet peak
of what each side computed in (H100 SXM: 989 bf16, 495 TF32) from FLOPs counted by FlopCounterMode.
"""

from __future__ import annotations

import statistics

import torch

from benchmarks.gpu.kit import Part, Skip, case
from benchmarks.gpu.precision import setup
from benchmarks.peer_arms import ARMS, NO_FLAGS, Case, Equal, Result

TITLE = "peers"
LIMIT_S = 120.0
SEEDS = (0, 1, 2)
TARGET = 0.94
EQUAL = Equal(precision="bf16-mixed", channels_last=True)
# What each side computes in under no flags on a GPU of compute capability 8.0 or newer (the peak
# its MFU is read against): scaletrain's auto is bf16-mixed; PyTorch's and Lightning's fp32 runs the
# convolutions in TF32.
NO_FLAGS_PRECISION = {"scaletrain": "bf16-mixed", "hand loop": "tf32", "Lightning": "tf32"}


def sizes(part: Part) -> dict:
    s = setup(part)
    return {**s, "epochs": 3}


def wrn_case(part: Part, s: dict) -> Case:
    from scaletrain.config import DataConfig
    from scaletrain.data import load_dataset
    from scaletrain.models import build_model
    ds = load_dataset(DataConfig(name="synthetic", shape=s["shape"], num_samples=s["batch"] * s["steps"] + 512,
                                 num_classes=10), seed=0)
    norm = lambda x: (x.float() - ds.mean) / ds.std  # noqa: E731
    val = ds.val if ds.val is not None else ds.test

    def model():
        torch.manual_seed(0)
        return build_model(s["model"], tuple(s["shape"]), 10)
    return Case(s["model"], model, (norm(ds.train.x), ds.train.y), (norm(val.x), val.y), s["batch"], s["epochs"],
                lr=1e-3, weight_decay=0.0, dataset=ds, device=part.device)


def recipe_case(part: Part, seed: int) -> Case:
    """The default recipe's data, model, optimizer and schedule (scaletrain/recipes/mnist1d-cnn.toml)."""
    from scaletrain.cli.train import load_recipe
    from scaletrain.config import DataConfig
    from scaletrain.data import load_dataset
    from scaletrain.models import build_model
    recipe = load_recipe("mnist1d-cnn")
    ds = load_dataset(DataConfig(name=recipe["data"]["name"], num_samples=1000 if part.rehearse else None), seed=seed)
    norm = lambda x: (x.float() - ds.mean) / ds.std  # noqa: E731

    def model():
        torch.manual_seed(seed)
        return build_model(recipe["model"]["name"], ds.input_shape, ds.num_classes)
    return Case("cnn1d", model, (norm(ds.train.x), ds.train.y), (norm(ds.val.x), ds.val.y), recipe["batch_size"],
                2 if part.rehearse else recipe["epochs"], lr=recipe["optim"]["lr"],
                weight_decay=recipe["optim"]["weight_decay"], dataset=ds, device=part.device)


def flops_per_sample(s: dict, device: torch.device) -> float:
    from benchmarks.common import train_flops_per_sample
    from scaletrain.models import build_model
    model = build_model(s["model"], tuple(s["shape"]), 10).to(device)
    return train_flops_per_sample(model, tuple(s["shape"]), device)


def throughput(part: Part, c: Case, result: Result, precision: str, flops: float | None) -> dict:
    from scaletrain.prediction.hardware import H100_PEAK
    timed = result.epoch_s[1:]
    rates = sorted(c.samples_per_epoch / t for t in timed)
    row = {"images_per_sec": round(statistics.median(rates), 1), "min": round(rates[0], 1), "max": round(rates[-1], 1),
           "timed_samples": c.samples_per_epoch * len(timed), "computes_in": precision}
    if flops and part.cuda:
        row["mfu_datasheet"] = round(row["images_per_sec"] * flops / H100_PEAK[precision], 4)
    return row


def run_arm(side: str, c: Case, settings: Equal | None) -> Result:
    if side == "Lightning":
        try:
            import lightning  # noqa: F401
        except ImportError:
            raise Skip("Lightning is not installed") from None
    return ARMS[side](c, settings)


def run(part: Part) -> None:
    s = sizes(part)
    part.note(model=s["model"], shape="x".join(map(str, s["shape"])), batch=s["batch"],
              epochs=f"{s['epochs']} of {s['steps']} steps, the first untimed", equal_settings=EQUAL.label)
    sides = list(ARMS)
    planned = ([f"no flags: {side}" for side in sides] + [f"equal settings ({EQUAL.label}): {side}" for side in sides]
               + [f"MNIST-1D to 94 %, no flags: {side} (seed {seed})" for seed in (SEEDS[:1] if part.rehearse else SEEDS)
                  for side in sides])
    part.plan(planned)
    c = wrn_case(part, s)
    flops = flops_per_sample(s, part.device) if part.cuda else None
    part.note(flops_per_sample=flops)
    for side in sides:
        case(part, f"no flags: {side}",
             lambda side=side: throughput(part, c, run_arm(side, c, NO_FLAGS), NO_FLAGS_PRECISION[side], flops),
             kind="no flags", side=side)
    for side in sides:
        case(part, f"equal settings ({EQUAL.label}): {side}",
             lambda side=side: throughput(part, c, run_arm(side, c, EQUAL), EQUAL.precision, flops),
             kind="equal settings", side=side)
    for seed in SEEDS[:1] if part.rehearse else SEEDS:
        recipe = recipe_case(part, seed)
        for side in sides[seed % 3:] + sides[:seed % 3]:
            def to_target(side=side):
                r = run_arm(side, recipe, NO_FLAGS)
                return {"time_to_94_s": r.time_to(TARGET), "train_time_s": round(sum(r.epoch_s), 4),
                        "final_val_accuracy": r.val_accuracy[-1]}
            case(part, f"MNIST-1D to 94 %, no flags: {side} (seed {seed})", to_target, kind="time to 94 %", side=side,
                 seed=seed)
