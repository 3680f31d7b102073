"""Part c: seed 000/001's table, eager half. WideResNet-16-10 on 28×28×1 at batch 512, synthetic
data kept on the device, through the real Trainer: fp32 / tf32 / bf16-mixed / fp16-mixed /
fp32-strict (IEEE float32 everywhere) × eager /
eager + CUDA-graph fusing (the compiled half is part `compiled`: its compilation takes a minute a
case). Images/sec over 50 timed steps (2 epochs of 25 after an untimed first epoch, as the
Throughput callback counts; min-max over those 2 epochs), MFU from FLOPs counted by
FlopCounterMode, against the datasheet peak and against the matrix rate part a measured, and the
warm-up (capture, compile) time beside it.

Cases run most-wanted first; those the part's limit leaves unreached stay listed in the result file.
"""

from __future__ import annotations

import json

import torch

from benchmarks.gpu.kit import Part, Skip, case, result_path

TITLE = "precision"
LIMIT_S = 55.0

PRECISIONS = ("fp32", "tf32", "bf16-mixed", "fp16-mixed", "fp32-strict")
# The datasheet peak each precision's MFU is read against on this convnet: `fp32` (PyTorch's own)
# runs its convolutions, nearly all of its FLOPs, in TF32.
PEAK_OF = {"fp32": "tf32"}
# (precision, mode, compile, CUDA-graph fusing): most-wanted first.
ORDER = ([(p, "eager", False, False) for p in PRECISIONS]
         + [("bf16-mixed", "eager + graphs", False, True)]
         + [(p, "eager + graphs", False, True) for p in ("fp16-mixed", "tf32", "fp32")])
FUSED_STEPS = 5   # steps per host round-trip when fusing (25 steps per epoch: 5 calls)


def setup(part: Part) -> dict:
    if part.rehearse:
        return {"model": "wrn-10-1", "shape": [1, 12, 12], "batch": 32, "steps": 5, "epochs": 3}
    return {"model": "wrn-16-10", "shape": [1, 28, 28], "batch": 512, "steps": 25, "epochs": 3}


def measured_peak(part: Part) -> float | None:
    """bf16 matrix rate (FLOP/s) that part a measured on this machine, if it ran."""
    path = result_path(part.out, "environment")
    if not path.exists():
        return None
    rows = json.loads(path.read_text()).get("rows", [])
    rates = [r.get("tflops_median") for r in rows if r.get("case") == "bf16 matrix product"]
    return rates[0] * 1e12 if rates and rates[0] else None


def measure(part: Part, s: dict, precision: str, compiled: bool, graphs: bool) -> dict:
    from scaletrain.config import DataConfig, ModelConfig, OptimConfig, PrecisionConfig, TrainConfig
    from scaletrain.data import load_dataset
    from scaletrain.models import build_model

    data_cfg = DataConfig(name="synthetic", shape=s["shape"], num_samples=s["batch"] * s["steps"], num_classes=10,
                          placement="device")
    dataset = load_dataset(data_cfg, seed=0)
    torch.manual_seed(0)
    model = build_model(s["model"], dataset.input_shape, 10)
    cfg = TrainConfig(model=ModelConfig(name=s["model"]), data=data_cfg, epochs=s["epochs"], batch_size=s["batch"],
                      optim=OptimConfig(optimizer="sgd", lr=1e-3), precision=PrecisionConfig(policy=precision),
                      compile=compiled, progress=False, log_every=10**9, save_model=False, eval_each_epoch=False,
                      steps_per_execution=FUSED_STEPS if graphs else 1, cuda_graphs=graphs)
    cfg.tracking.record = False
    rate, timed, warmup_s = timed_fit(model, cfg, dataset)
    return {"images_per_sec": rate, "min": min(timed), "max": max(timed), "warmup_s": warmup_s,
            "timed_steps": s["steps"] * len(timed)}


def timed_fit(model, cfg, dataset) -> tuple[float, list[float], float]:
    """Trains `model` under `cfg` on `dataset`: (steady-state samples/s, each timed epoch's
    samples/s: the epochs after the first, the warm-up's seconds)."""
    from scaletrain.callbacks import Throughput
    from scaletrain.training import Trainer
    meter = Throughput(verbose=False)
    trainer = Trainer(model, cfg, [meter])
    try:
        trainer.fit(dataset)
    finally:
        trainer.close()
    return meter.steady_state(), meter.per_epoch[1:], round(trainer.warmup_s, 2)


def table(part: Part, order) -> None:
    """Measures `order`'s cases, most-wanted first (this part's and part `compiled`'s body)."""
    from scaletrain.models import build_model
    from scaletrain.prediction.hardware import H100_PEAK
    from scaletrain.prediction.measure import train_flops_per_sample

    s = setup(part)
    device = part.device
    flops = train_flops_per_sample(build_model(s["model"], tuple(s["shape"]), 10).to(device), tuple(s["shape"]), device)
    peak_bf16 = measured_peak(part)
    part.note(model=s["model"], shape="x".join(map(str, s["shape"])), batch=s["batch"],
              gflop_per_training_sample=round(flops / 1e9, 3), measured_bf16_tflops=peak_bf16 and peak_bf16 / 1e12,
              fused_steps_per_call=FUSED_STEPS)
    part.plan(f"{p} {m}" for p, m, _, _ in order)
    for precision, mode, compiled, graphs in order:
        def one(precision=precision, compiled=compiled, graphs=graphs):
            if graphs and not part.cuda:
                raise Skip("no CUDA")
            if compiled and part.rehearse:
                raise Skip("the rehearsal does not compile (minutes on a CPU; the suite tests compile)")
            row = measure(part, s, precision, compiled, graphs)
            if part.cuda:
                row["mfu_datasheet"] = round(row["images_per_sec"] * flops / H100_PEAK[PEAK_OF.get(precision, precision)], 4)
                if peak_bf16 and precision in ("bf16-mixed", "fp16-mixed"):
                    row["mfu_measured_peak"] = round(row["images_per_sec"] * flops / peak_bf16, 4)
            return row
        case(part, f"{precision} {mode}", one, precision=precision, mode=mode)


def run(part: Part) -> None:
    table(part, ORDER)
