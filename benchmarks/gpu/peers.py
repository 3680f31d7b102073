"""Part d: scaletrain beside what a practitioner would otherwise run, in one process on one device.

Throughput on part c's model and batch (WRN-16-10, 28×28×1, batch 512, SGD, data on the device),
each pair built to differ in one thing:
  hand fp32 eager loop      | scaletrain fp32 eager            (the harness's own cost; both IEEE
                                                               float32: PyTorch's default runs
                                                               cuDNN convolutions in TF32, also shown)
  Lightning bf16-mixed      | scaletrain bf16-mixed eager      (the same recipe in each framework)
and scaletrain's best eager settings (bf16-mixed, channels_last, CUDA-graph fusing); the compiled
pair (hand bf16 + channels_last + compile against scaletrain's) is in part `compiled`.
Each: untimed warm-up steps, then 3 timed windows of 15 steps (device synchronised at each end);
median (min-max) over the windows.

Then the default recipe (MNIST-1D, cnn1d, AdamW 0.01, one-cycle over 6 epochs, batch 128) trained
by `scaletrain train`, by a hand loop and by Lightning on the same model, data, optimizer and
schedule, seeds interleaved: training time until validation accuracy first reaches 94 %
(evaluation excluded) and the final test accuracy.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

from benchmarks.gpu.kit import Part, Skip, case
from benchmarks.gpu.precision import setup

TITLE = "peers"
LIMIT_S = 90.0
ROOT = Path(__file__).resolve().parents[2]
WINDOWS, WINDOW_STEPS, WARMUP_STEPS = 3, 15, 5
REHEARSAL_WINDOW_STEPS, REHEARSAL_WARMUP_STEPS = 4, 2
SEEDS = (0, 1, 2)
TARGET = 0.94


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _batches(s: dict, device: torch.device, count: int = 4) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(s["batch"], *s["shape"], generator=g).to(device),
             torch.randint(0, 10, (s["batch"],), generator=g).to(device)) for _ in range(count)]


def _windows(step, device: torch.device, s: dict) -> dict:
    """Images/sec of WINDOWS windows of s["window_steps"] calls of `step(i)` after s["warmup_steps"]."""
    for i in range(s["warmup_steps"]):
        step(i)
    _sync(device)
    rates = []
    for w in range(WINDOWS):
        start = time.perf_counter()
        for i in range(s["window_steps"]):
            step(i)
        _sync(device)
        rates.append(s["batch"] * s["window_steps"] / (time.perf_counter() - start))
    rates.sort()
    return {"images_per_sec": rates[len(rates) // 2], "min": rates[0], "max": rates[-1],
            "timed_steps": WINDOWS * s["window_steps"]}


def _model(s: dict, device: torch.device, channels_last: bool = False) -> nn.Module:
    from scaletrain.models import build_model
    torch.manual_seed(0)
    model = build_model(s["model"], tuple(s["shape"]), 10).to(device)
    return model.to(memory_format=torch.channels_last) if channels_last and len(s["shape"]) == 3 else model


def hand_loop(part: Part, s: dict, bf16_compiled: bool, tf32: bool | None = False) -> dict:
    """tf32=False: IEEE float32 throughout, as scaletrain's fp32; None: PyTorch's defaults (cuDNN
    convolutions in TF32, matrix products in float32)."""
    device = part.device
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    if tf32 is not None:
        torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = tf32
    try:
        return _hand_loop(part, s, bf16_compiled, device)
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def _hand_loop(part: Part, s: dict, bf16_compiled: bool, device: torch.device) -> dict:
    model = _model(s, device, channels_last=bf16_compiled)
    forward = torch.compile(model) if bf16_compiled else model
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    batches = _batches(s, device)
    if bf16_compiled:
        batches = [(x.contiguous(memory_format=torch.channels_last), y) for x, y in batches]

    def step(i):
        x, y = batches[i % len(batches)]
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16_compiled):
            loss = nn.functional.cross_entropy(forward(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    start = time.perf_counter()
    step(0)
    step(1)   # compile's second call (recompiles once for the grad state), as the trainer's warm-up does
    _sync(device)
    warm = time.perf_counter() - start
    return {**_windows(step, device, s), "warmup_s": round(warm, 2)}


def lightning_loop(part: Part, s: dict) -> dict:
    try:
        import lightning as L
    except ImportError:
        raise Skip("Lightning is not installed") from None
    device = part.device
    model = _model(s, device)
    batches = _batches(s, device)
    total = s["warmup_steps"] + WINDOWS * s["window_steps"]
    marks: list[float] = []

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = model

        def training_step(self, batch, i):
            x, y = batch
            return nn.functional.cross_entropy(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=1e-3, momentum=0.9)

        def on_train_batch_end(self, outputs, batch, i):
            if i + 1 >= s["warmup_steps"] and (i + 1 - s["warmup_steps"]) % s["window_steps"] == 0:
                _sync(device)
                marks.append(time.perf_counter())

    # Whole batches already on the device: Lightning's loop gets them as they are (batch_size=None).
    loader = torch.utils.data.DataLoader([batches[i % len(batches)] for i in range(total)], batch_size=None)
    trainer = L.Trainer(accelerator="gpu" if part.cuda else "cpu", devices=1, precision="bf16-mixed",
                        max_steps=total, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0)
    trainer.fit(Module(), loader)
    rates = sorted(s["batch"] * s["window_steps"] / (b - a) for a, b in zip(marks, marks[1:]))
    return {"images_per_sec": rates[len(rates) // 2], "min": rates[0], "max": rates[-1],
            "timed_steps": s["window_steps"] * len(rates), "lightning": L.__version__}


def scaletrain_loop(part: Part, s: dict, precision: str, channels_last: bool = False, compiled: bool = False,
                    graphs: bool = False) -> dict:
    """The Trainer's own step (built as `fit` builds it) driven over the same batches and windows."""
    from scaletrain.callbacks import Throughput
    from scaletrain.config import DataConfig, ModelConfig, OptimConfig, PrecisionConfig, TrainConfig
    from scaletrain.data import load_dataset
    from scaletrain.training import Trainer

    steps = s["window_steps"]
    data_cfg = DataConfig(name="synthetic", shape=s["shape"], num_samples=s["batch"] * steps, num_classes=10,
                          placement="device")
    dataset = load_dataset(data_cfg, seed=0)
    cfg = TrainConfig(model=ModelConfig(name=s["model"]), data=data_cfg, epochs=1 + WINDOWS, batch_size=s["batch"],
                      optim=OptimConfig(optimizer="sgd", lr=1e-3), precision=PrecisionConfig(policy=precision),
                      compile=compiled, channels_last=channels_last, progress=False, log_every=10**9,
                      save_model=False, eval_each_epoch=False, steps_per_execution=5 if graphs else 1,
                      cuda_graphs=graphs)
    cfg.tracking.record = False
    meter = Throughput(verbose=False)
    trainer = Trainer(_model(s, torch.device("cpu")), cfg, [meter])
    try:
        trainer.fit(dataset)
    finally:
        trainer.close()
    rates = sorted(meter.per_epoch[1:])
    return {"images_per_sec": rates[len(rates) // 2], "min": rates[0], "max": rates[-1],
            "timed_steps": steps * len(rates), "warmup_s": round(trainer.warmup_s, 2)}


# ------------------------------------------------------------------ time to 94 % on MNIST-1D
def recipe_scaletrain(part: Part, seed: int) -> dict:
    folder = Path(tempfile.mkdtemp(prefix="scaletrain-gpu-peers-"))
    argv = [sys.executable, "-m", "scaletrain", "train", "--seed", str(seed), "--device", part.device.type,
            "--run-dir", str(folder / "run"), "--summary-json", str(folder / "s.json"), "--no-progress", "--no-record"]
    if part.rehearse:
        argv += ["--num-samples", str(REHEARSAL_RECIPE["num_samples"]), "--epochs", str(REHEARSAL_RECIPE["epochs"]),
                 "--patience", str(REHEARSAL_RECIPE["epochs"])]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120)
    if done.returncode:
        raise RuntimeError(f"scaletrain train exited {done.returncode}: {(done.stderr.strip() or 'no output').splitlines()[-1]}")
    summary = json.loads((folder / "s.json").read_text())
    return {"time_to_94_s": summary["time_to_target_s"], "train_time_s": summary["train_time_s"],
            "warmup_s": summary["warmup_s"], "test_accuracy": summary["test_accuracy"]}


# The rehearsal's recipe: fewer samples and epochs (a CPU trains the full one in ~10 s a run).
REHEARSAL_RECIPE = {"num_samples": 1000, "epochs": 2}


def _recipe_parts(seed: int, device: torch.device, small: bool):
    """The default recipe's pieces, read from the recipe itself: data, model, optimizer, schedule."""
    from scaletrain.cli.train import load_recipe
    from scaletrain.config import DataConfig, OptimConfig
    from scaletrain.data import load_dataset
    from scaletrain.models import build_model
    from scaletrain.optim.schedules import build_schedule

    recipe = load_recipe("mnist1d-cnn")
    ds = load_dataset(DataConfig(name=recipe["data"]["name"], num_samples=REHEARSAL_RECIPE["num_samples"] if small
                                 else None), seed=seed)
    norm = lambda x: ((x - ds.mean) / ds.std).to(device)  # noqa: E731 - the trainer's normaliser
    train_x, train_y = norm(ds.train.x), ds.train.y.to(device)
    val = (norm(ds.val.x), ds.val.y.to(device))
    test = (norm(ds.test.x), ds.test.y.to(device))
    batch, epochs = recipe["batch_size"], REHEARSAL_RECIPE["epochs"] if small else recipe["epochs"]
    steps = len(train_x) // batch   # drop_last, as the trainer
    optim = OptimConfig(**recipe["optim"])
    schedule = build_schedule(optim, steps, epochs)
    lrs = [schedule.value_at(i) for i in range(steps * epochs)]
    torch.manual_seed(seed)
    model = build_model(recipe["model"]["name"], ds.input_shape, ds.num_classes).to(device)
    make_opt = lambda params: torch.optim.AdamW(params, lr=optim.lr, weight_decay=optim.weight_decay)  # noqa: E731
    return model, make_opt, lrs, (train_x, train_y), val, test, batch, epochs, steps


@torch.no_grad()
def _accuracy(model: nn.Module, split) -> float:
    model.eval()
    x, y = split
    correct = sum((model(x[i:i + 1000]).argmax(1) == y[i:i + 1000]).sum() for i in range(0, len(x), 1000))
    model.train()
    return float(correct) / len(x)


def recipe_hand(part: Part, seed: int) -> dict:
    device = part.device
    model, make_opt, lrs, (tx, ty), val, test, batch, epochs, steps = _recipe_parts(seed, device, part.rehearse)
    opt = make_opt(model.parameters())
    g = torch.Generator(device=device).manual_seed(seed)
    train_s, reached, step = 0.0, None, 0
    for _ in range(epochs):
        _sync(device)
        start = time.perf_counter()
        order = torch.randperm(len(tx), generator=g, device=device)
        for b in range(steps):
            idx = order[b * batch:(b + 1) * batch]
            for group in opt.param_groups:
                group["lr"] = lrs[step]
            loss = nn.functional.cross_entropy(model(tx[idx]), ty[idx])
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            step += 1
        _sync(device)
        train_s += time.perf_counter() - start
        if reached is None and _accuracy(model, val) >= TARGET:
            reached = train_s
    return {"time_to_94_s": reached, "train_time_s": train_s, "test_accuracy": _accuracy(model, test)}


def recipe_lightning(part: Part, seed: int) -> dict:
    try:
        import lightning as L
    except ImportError:
        raise Skip("Lightning is not installed") from None
    device = part.device
    model, make_opt, lrs, (tx, ty), val, test, batch, epochs, steps = _recipe_parts(seed, device, part.rehearse)
    clock = {"train_s": 0.0, "reached": None, "start": 0.0}

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = model

        def training_step(self, b, i):
            for group in self.optimizers().optimizer.param_groups:
                group["lr"] = lrs[self.global_step]
            x, y = b
            return nn.functional.cross_entropy(self.net(x), y)

        def configure_optimizers(self):
            return make_opt(self.parameters())

        def on_train_epoch_start(self):
            _sync(device)
            clock["start"] = time.perf_counter()

        def on_train_epoch_end(self):   # after the epoch's batches; validation below is not timed
            _sync(device)
            clock["train_s"] += time.perf_counter() - clock["start"]
            if clock["reached"] is None and _accuracy(self.net, val) >= TARGET:
                clock["reached"] = clock["train_s"]

    class Shuffled(torch.utils.data.IterableDataset):   # the hand loop's device-side shuffle
        def __init__(self):
            self.g = torch.Generator(device=device).manual_seed(seed)

        def __iter__(self):
            order = torch.randperm(len(tx), generator=self.g, device=device)
            for b in range(steps):
                idx = order[b * batch:(b + 1) * batch]
                yield tx[idx], ty[idx]

    trainer = L.Trainer(accelerator="gpu" if part.cuda else "cpu", devices=1, precision="32-true", max_epochs=epochs,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0)
    trainer.fit(Module(), torch.utils.data.DataLoader(Shuffled(), batch_size=None))
    model.to(device)   # Lightning's teardown moved it back to the CPU
    return {"time_to_94_s": clock["reached"], "train_time_s": clock["train_s"], "test_accuracy": _accuracy(model, test)}


def fused(part: Part, s: dict) -> dict:
    if not part.cuda:
        raise Skip("no CUDA")
    return scaletrain_loop(part, s, "bf16-mixed", channels_last=True, graphs=True)


def sizes(part: Part) -> dict:
    return {**setup(part), "window_steps": REHEARSAL_WINDOW_STEPS if part.rehearse else WINDOW_STEPS,
            "warmup_steps": REHEARSAL_WARMUP_STEPS if part.rehearse else WARMUP_STEPS}


def run(part: Part) -> None:
    s = sizes(part)
    part.note(model=s["model"], shape="x".join(map(str, s["shape"])), batch=s["batch"],
              windows=f"{WINDOWS} x {s['window_steps']} steps after {s['warmup_steps']} warm-up")

    throughput = (
        ("hand loop, PyTorch defaults (TF32 convolutions)", lambda: hand_loop(part, s, False, tf32=None)),
        ("hand loop, fp32 eager (TF32 off, as scaletrain's fp32)", lambda: hand_loop(part, s, False)),
        ("scaletrain, fp32 eager", lambda: scaletrain_loop(part, s, "fp32")),
        ("Lightning, bf16-mixed", lambda: lightning_loop(part, s)),
        ("scaletrain, bf16-mixed eager", lambda: scaletrain_loop(part, s, "bf16-mixed")),
        ("scaletrain, bf16-mixed + channels_last + CUDA-graph fusing", lambda: fused(part, s)),
    )
    recipe = [(f"MNIST-1D to 94 %: {who}", fn, seed) for seed in (SEEDS if not part.rehearse else SEEDS[:1])
              for who, fn in (("scaletrain train (default recipe)", recipe_scaletrain), ("hand loop", recipe_hand),
                              ("Lightning", recipe_lightning))]
    part.plan([name for name, _ in throughput] + [f"{name} (seed {seed})" for name, _, seed in recipe])
    for name, fn in throughput:
        case(part, name, fn, kind="throughput")
    for name, fn, seed in recipe:
        case(part, f"{name} (seed {seed})", lambda fn=fn, seed=seed: fn(part, seed), kind="time to 94 %", seed=seed)
