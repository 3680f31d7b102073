"""Extra part (its own call, `--parts fp8`): issue 93's table, fp8 against bf16-mixed, both
compiled (float8 wants compile: torchao fuses its casts there), on two transformers trained on
char-corpus: the small GPT (dim 256, depth 4) and one of about 100 M parameters, Linear-heavy
(dim 1024, depth 8: 12 x 1024^2 x 8). Sides: bf16-mixed, fp8 tensorwise, fp8 rowwise
(`--fp8-recipe`), and tensorwise with only the layer shapes that measured faster in float8 on this
GPU (`--fp8-shapes auto`'s measurement, training/float8_shapes.py: each shape's verdict is in its
row). Tokens/s over the epochs after the first (which compiles), 20 steps each; the notes hold
fp8's speed over bf16-mixed's per model. Not yet run on a GPU.

The GPU image lacks torchao: wheels.sh downloads it with the other wheels (`--no-deps`: the
image's torch stays; torchao's float8 training calls torch's own `_scaled_mm`). The rehearsal runs
a toy GPT eager with `--fp8-emulate`, so the path is exercised on the CPU in CI.
"""

from __future__ import annotations

from benchmarks.gpu.kit import Part, Skip, case

TITLE = "fp8"
LIMIT_S = 560.0   # (the measured side also compiles three arms of each layer shape; a call holds 600 s)
MODELS = {"small GPT": dict(dim=256, depth=4, heads=8), "GPT ~100M": dict(dim=1024, depth=8, heads=16)}
SIZES = {"small GPT": (256, 64), "GPT ~100M": (256, 32)}      # (sequence length, batch)
TOY = (dict(dim=32, depth=1, heads=4), (16, 8))
SIDES = (("bf16-mixed", None), ("fp8", "tensorwise"), ("fp8", "rowwise"), ("fp8", "measured"))
MEASURED = "measured"     # tensorwise, the shapes that measured faster in float8 here
STEPS, EPOCHS = 20, 3


def measured_shapes(part: Part, options: dict, seq: int, batch: int, vocab: int, precision):
    """What `--fp8-shapes auto` measures for this model at this batch on this device (the
    rehearsal: emulated and eager)."""
    import torch

    from scaletrain.models import build_model
    from scaletrain.training.float8_shapes import choose_shapes, linear_shapes
    with torch.device("meta"):
        shapes = linear_shapes(build_model("gpt", (seq,), vocab, **options),
                               torch.zeros(batch, seq, dtype=torch.int64))
    device = torch.device("cuda" if part.cuda else "cpu")
    return choose_shapes(shapes, precision, device, compiled=not part.rehearse, run_id="gpu-kit")


def measure(part: Part, options: dict, seq: int, batch: int, policy: str, recipe: str | None) -> dict:
    import torch

    from benchmarks.gpu.precision import timed_fit
    from scaletrain.config import DataConfig, ModelConfig, OptimConfig, PrecisionConfig, TrainConfig
    from scaletrain.data import load_dataset
    from scaletrain.models import build_model

    data_cfg = DataConfig(name="char-corpus", seq_len=seq, train_subset=batch * STEPS, placement="device")
    dataset = load_dataset(data_cfg, seed=0)
    torch.manual_seed(0)
    model = build_model("gpt", dataset.input_shape, dataset.num_classes, **options)
    precision = PrecisionConfig(policy=policy, fp8_recipe="rowwise" if recipe == "rowwise" else "tensorwise",
                                fp8_emulate=not part.cuda)
    shapes = None
    if recipe == MEASURED:
        shapes = measured_shapes(part, options, seq, batch, dataset.num_classes, precision)
        precision.fp8_shapes = shapes.value
    cfg = TrainConfig(model=ModelConfig(name="gpt", options=options), data=data_cfg, epochs=EPOCHS, batch_size=batch,
                      optim=OptimConfig(optimizer="adamw", lr=3e-4), precision=precision, compile=not part.rehearse,
                      progress=False, log_every=10**9, save_model=False, eval_each_epoch=False)
    cfg.tracking.record = False
    rate, timed, warmup_s = timed_fit(model, cfg, dataset)
    return {"tokens_per_sec": rate * seq, "min": min(timed) * seq, "max": max(timed) * seq, "warmup_s": warmup_s,
            "params_m": round(sum(p.numel() for p in model.parameters()) / 1e6, 1), "emulated": not part.cuda,
            **({"fp8_shapes": shapes.value, "shapes_measured": shapes.why} if shapes is not None else {})}


def run(part: Part) -> None:
    import torch
    models = {"toy GPT": TOY} if part.rehearse else {name: (MODELS[name], SIZES[name]) for name in MODELS}
    part.plan(f"{name}: {policy}{f' {recipe}' if recipe else ''}" for name in models for policy, recipe in SIDES)
    fp8_here = not part.cuda or torch.cuda.get_device_capability() >= (8, 9)
    speeds: dict[str, dict[str, float]] = {}
    for name, (options, (seq, batch)) in models.items():
        for policy, recipe in SIDES:
            def one(options=options, seq=seq, batch=batch, policy=policy, recipe=recipe):
                if policy == "fp8" and not fp8_here:
                    raise Skip("this GPU has no float8 tensor cores (compute capability below 8.9)")
                return measure(part, options, seq, batch, policy, recipe)
            label = f"{policy}{f' {recipe}' if recipe else ''}"
            row = case(part, f"{name}: {label}", one, model=name, precision=label)
            if row["status"] == "passed":
                speeds.setdefault(name, {})[label] = row["tokens_per_sec"]
    part.note(fp8_speed_over_bf16={name: {label: round(v / found["bf16-mixed"], 3) for label, v in found.items()
                                          if label != "bf16-mixed"}
                                   for name, found in speeds.items() if "bf16-mixed" in found})
