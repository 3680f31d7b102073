"""Part b: does every training path run on this device? The suite's CUDA tests, then one short
training per path (each precision, channels_last, CUDA-graph step fusing, the streaming
loader with pinned memory and workers, activation checkpointing, ddp and fsdp on one rank over
NCCL), then the command line end to end (train with checkpoints, resume, export, predict). Each
case is pass/fail with its error line; none stops the others."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

from benchmarks.gpu.kit import Part, Skip, case
from scaletrain.distributed.env import scaletrain_command  # the CLI started as scaletrain starts its children

TITLE = "smoke"
LIMIT_S = 85.0
ROOT = Path(__file__).resolve().parents[2]

# (case, config overrides, needs CUDA). Fusing without CUDA graphs runs on a CPU too. Compilation
# is part `compiled`'s (a minute a case).
TRAINER_CASES = (
    ("fp32", {}, False),
    ("tf32", {"precision.policy": "tf32"}, False),
    ("bf16-mixed", {"precision.policy": "bf16-mixed"}, False),
    ("fp16-mixed (dynamic loss scale)", {"precision.policy": "fp16-mixed"}, False),
    ("bf16-true", {"precision.policy": "bf16-true"}, False),
    ("bf16-mixed + channels_last", {"precision.policy": "bf16-mixed", "channels_last": True}, False),
    ("activation checkpointing", {"precision.policy": "bf16-mixed", "memory.activation_checkpointing": True},
     False),
    ("fused steps (4 per call), no graph", {"steps_per_execution": 4, "cuda_graphs": False}, False),
    ("CUDA-graph fused steps (4 per call)", {"precision.policy": "bf16-mixed", "steps_per_execution": 4,
                                             "cuda_graphs": True}, True),
    ("streaming loader, pinned, 2 workers", {"data.placement": "stream", "data.num_workers": 2}, False),
    ("ddp on one rank", {"distributed.strategy": "ddp"}, False),
    ("fsdp on one rank", {"distributed.strategy": "fsdp", "precision.policy": "bf16-mixed"}, False),
)


def _sizes(part: Part) -> dict:
    if part.rehearse:
        return {"model": "wrn-10-1", "shape": [3, 8, 8], "num_samples": 160, "batch_size": 32, "epochs": 1,
                "precision": "fp32"}
    return {"model": "wrn-16-2", "shape": [3, 32, 32], "num_samples": 2048, "batch_size": 128, "epochs": 2,
            "precision": "bf16-mixed"}


def _set(cfg, dotted: str, value) -> None:
    *owners, key = dotted.split(".")
    target = cfg
    for owner in owners:
        target = getattr(target, owner)
    setattr(target, key, value)


def train_case(part: Part, overrides: dict) -> dict:
    import torch.distributed as dist

    from scaletrain.config import DataConfig, ModelConfig, TrainConfig
    from scaletrain.data import load_dataset
    from scaletrain.models import build_model
    from scaletrain.training import Trainer

    size = _sizes(part)
    cfg = TrainConfig(model=ModelConfig(name=size["model"]),
                      data=DataConfig(name="synthetic", shape=size["shape"], num_samples=size["num_samples"]),
                      epochs=size["epochs"], batch_size=size["batch_size"], progress=False, log_every=10**9, save_model=False)
    cfg.tracking.record = False
    for key, value in overrides.items():
        _set(cfg, key, value)
    dataset = load_dataset(cfg.data, seed=0)
    torch.manual_seed(0)
    model = build_model(size["model"], dataset.input_shape, dataset.num_classes)
    trainer = Trainer(model, cfg)
    try:
        history = trainer.fit(dataset)
    finally:
        trainer.close()
        if dist.is_initialized():
            dist.destroy_process_group()
    last = history[-1]
    loss = float(last["train_loss"])
    if not math.isfinite(loss):
        raise AssertionError(f"training loss is {loss}")
    return {"train_loss": round(loss, 4), "val_accuracy": last.get("val_accuracy"), "device": str(trainer.device),
            "steps_per_execution": cfg.steps_per_execution}


def _cli(args: list[str], timeout: float) -> str:
    done = subprocess.run([*scaletrain_command(), *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        lines = (done.stderr.strip() or done.stdout.strip() or "no output").splitlines()
        raise RuntimeError(f"scaletrain {args[0]} exited {done.returncode}: {lines[-1]}")
    return done.stdout


def cli_cases(part: Part) -> None:
    """The user's path end to end: train with checkpoints, resume for one more epoch, export,
    predict; the run folder's own files are the evidence."""
    size = _sizes(part)
    folder = Path(tempfile.mkdtemp(prefix="scaletrain-gpu-smoke-"))
    store, run_dir = str(folder / "runs.db"), folder / "run"
    common = ["--model", size["model"], "--data", "synthetic", "--shape", ",".join(map(str, size["shape"])),
              "--num-samples", str(size["num_samples"]), "--batch-size", str(size["batch_size"]),
              "--precision", size["precision"], "--run-dir", str(run_dir), "--store", store, "--no-progress"]
    state = {}

    def train():
        _cli(["train", *common, "--epochs", "1", "--checkpoint-every", "2", "--summary-json",
              str(folder / "first.json")], 120)
        first = json.loads((folder / "first.json").read_text())
        state["run_id"] = first["run_id"]
        return {"checkpoints_saved": first["checkpoints_saved"], "device": first["device"]}

    def resume():
        _cli(["train", *common, "--epochs", "2", "--resume", "auto", "--summary-json", str(folder / "second.json")], 120)
        second = json.loads((folder / "second.json").read_text())
        if not second.get("resumed_from") or second["epochs_run"] < 1:
            raise AssertionError(f"did not resume: resumed_from={second.get('resumed_from')}")
        return {"resumed_from": Path(str(second["resumed_from"])).name, "epochs_run": second["epochs_run"]}

    def export():
        _cli(["export", state["run_id"], "--store", store], 120)
        exported = run_dir / "model.pt2"
        if not exported.exists():
            raise AssertionError("no model.pt2 written")
        return {"bytes": exported.stat().st_size}

    def predict():
        x = np.random.default_rng(0).standard_normal((16, *size["shape"])).astype(np.float32)
        np.save(folder / "x.npy", x)
        _cli(["predict", state["run_id"], "--input", str(folder / "x.npy"), "--out", str(folder / "p.npy"),
              "--store", store], 120)
        p = np.load(folder / "p.npy")
        if p.shape[0] != 16 or not np.isfinite(p).all():
            raise AssertionError(f"predictions of shape {p.shape}, finite={np.isfinite(p).all()}")
        return {"predictions": list(p.shape)}

    for name, fn in zip(CLI_CASES, (train, resume, export, predict), strict=True):
        row = case(part, name, fn)
        if row["status"] != "passed" and name == CLI_CASES[0]:
            return   # nothing to resume, export or predict


def suite_cases(part: Part) -> dict:
    if not part.cuda:
        raise Skip("no CUDA: the suite's CUDA tests are skipped on this device")
    files = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("test_*.py")
                   if "mark.cuda" in p.read_text() or "needs CUDA" in p.read_text())
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "cuda", "-p", "no:cacheprovider",
                           "--timeout", "30", *files], cwd=ROOT, capture_output=True, text=True,
                          timeout=max(part.left_s() - 2, 5))
    print(done.stdout[-5000:], done.stderr[-2000:], flush=True)   # which test failed, and why: in output_tail
    last = (done.stdout.strip().splitlines() or ["no output"])[-1]
    if done.returncode not in (0, 5):   # 5: nothing collected
        raise RuntimeError(f"pytest -m cuda: {last}")
    return {"files": len(files), "result": last}


CLI_CASES = ("cli: train with checkpoints", "cli: resume", "cli: export pt2", "cli: predict")
SUITE_CASE = "the suite's CUDA tests (pytest -m cuda)"


def run(part: Part) -> None:
    part.plan([name for name, _, _ in TRAINER_CASES] + list(CLI_CASES) + [SUITE_CASE])
    for name, overrides, needs_cuda in TRAINER_CASES:
        def one(overrides=overrides, needs_cuda=needs_cuda):
            if needs_cuda and not part.cuda:
                raise Skip("no CUDA")
            return train_case(part, overrides)
        case(part, name, one)
    cli_cases(part)
    case(part, SUITE_CASE, lambda: suite_cases(part))
