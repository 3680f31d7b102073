"""scaletrain, a hand loop and Lightning training the same model on the same data with the same
optimizer and schedule, in one process, each timed by the same clock: used by `benchmarks/peers.py`
(the CPU) and `benchmarks/gpu/peers.py` (the GPU kit). MEASURE.md's two tables, never mixed:

- **no flags** (`NO_FLAGS`): each tool as its users run it, with its own defaults.
    scaletrain  `Trainer(model, TrainConfig(...hyperparameters)).fit(dataset)`: precision auto
                (bf16-mixed on CUDA 8.0+, else fp32), channels_last auto (on for 2-D
                convolutions on a GPU), cudnn.benchmark auto, its device-resident batches, fused
                AdamW, the schedule on the device.
    hand loop   as PyTorch's tutorials write it: `DataLoader(TensorDataset(x, y), batch_size,
                shuffle=True)`, each batch `.to(device)`, `torch.optim.AdamW` (torch's own
                implementation choice), `OneCycleLR` stepped per batch; fp32 with PyTorch's
                defaults (TF32 convolutions on CUDA, IEEE matrix products).
    Lightning   `Trainer(max_epochs=E)` with its defaults (precision "32-true", its logger,
                checkpointing, progress bar and model summary, in a scratch folder), the same
                DataLoader, `configure_optimizers` returning the same AdamW and OneCycleLR
                (interval "step").
- **equal settings** (`Equal`): every side given the same precision, memory format, compile and
  data path: the data on the device, a permutation per epoch, the same fused AdamW with a tensor
  LR set from the same schedule each step; Lightning through an iterable of those batches and a
  `configure_optimizers` returning that optimizer (its users' one line each for channels_last and
  `torch.compile`).

The clock, the same on every side: from an epoch's start (before its first batch is asked for)
to the end of its last optimizer step, the device synchronised at both ends; validation after
each epoch, untimed, gives the accuracy that time to target reads. Every side starts from the same
initial weights (the case's seed).
"""

from __future__ import annotations

import contextlib
import io
import logging
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset


@dataclass(frozen=True, slots=True)
class Equal:
    """The settings every side is given in the equal-settings table."""
    precision: str = "fp32"         # a scaletrain policy name: fp32, bf16-mixed, ...
    channels_last: bool = False
    compile: bool = False

    @property
    def label(self) -> str:
        return " + ".join([self.precision, *(["channels_last"] if self.channels_last else []),
                           *(["compile"] if self.compile else [])])


NO_FLAGS = None    # each tool's own defaults


@dataclass
class Case:
    """What every side trains: `model()` builds the same initial weights each call. The splits are
    host tensors, already normalised (scaletrain normalises its own copy, `dataset`, the same way):
    a tutorial's DataLoader reads them there; the equal table's data path keeps them on the device."""
    name: str
    model: Callable[[], nn.Module]
    train: tuple[torch.Tensor, torch.Tensor]
    val: tuple[torch.Tensor, torch.Tensor]
    batch: int
    epochs: int
    lr: float = 0.01
    weight_decay: float = 0.05
    dataset: object = None                         # scaletrain's Dataset of the same samples (raw)
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    _on_device: tuple | None = None

    @property
    def steps(self) -> int:
        return len(self.train[1]) // self.batch          # every side drops the last partial batch

    @property
    def samples_per_epoch(self) -> int:
        return self.steps * self.batch

    def device_train(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self._on_device is None:
            self._on_device = tuple(t.to(self.device) for t in self.train)
        return self._on_device

    def lr_at(self) -> list[float]:
        """The one-cycle schedule scaletrain runs, step by step (every side's in the equal table)."""
        from scaletrain.config import OptimConfig
        from scaletrain.optim.schedules import build_schedule
        schedule = build_schedule(OptimConfig(lr=self.lr, lr_schedule="onecycle"), self.steps, self.epochs)
        return schedule.table(torch.device("cpu")).tolist()


@dataclass
class Result:
    epoch_s: list[float]
    val_accuracy: list[float]
    warmup_s: float | None = None

    def time_to(self, target: float) -> float | None:
        total = 0.0
        for seconds, acc in zip(self.epoch_s, self.val_accuracy, strict=True):
            total += seconds
            if acc >= target:
                return total
        return None


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def pytorch_defaults() -> None:
    """torch.backends' float32 settings as a fresh interpreter has them (scaletrain's policies set
    them process-wide; every arm starts from these)."""
    torch.backends.cudnn.allow_tf32 = True
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    torch.backends.cudnn.benchmark = False


@torch.no_grad()
def accuracy(model: nn.Module, split, device: torch.device, autocast: contextlib.AbstractContextManager) -> float:
    was = model.training
    model.eval()
    x, y = split
    correct = 0
    for i in range(0, len(x), 1000):
        with autocast:
            out = model(x[i:i + 1000].to(device))
        correct += int((out.argmax(1) == y[i:i + 1000].to(device)).sum())
    model.train(was)
    return correct / len(x)


def _autocast(device: torch.device, precision: str):
    from scaletrain.precision import get_policy
    return get_policy(precision).autocast(device)


def _prepared(case: Case, settings: Equal) -> tuple[nn.Module, Callable]:
    """The model with the equal settings applied as a user of any tool would: storage format, then
    torch.compile."""
    from scaletrain.precision import get_policy
    model = case.model().to(case.device)
    get_policy(settings.precision).configure_backend()
    if settings.channels_last:
        model = model.to(memory_format=torch.channels_last)
    return model, (torch.compile(model) if settings.compile else model)


def _device_batches(case: Case, settings: Equal, generator: torch.Generator):
    """One epoch of the equal table's data path: a permutation of the device-resident split."""
    x, y = case.device_train()
    order = torch.randperm(len(y), device=case.device, generator=generator)
    for b in range(case.steps):
        idx = order[b * case.batch:(b + 1) * case.batch]
        xb = x[idx]
        yield (xb.contiguous(memory_format=torch.channels_last) if settings.channels_last and xb.dim() == 4
               else xb), y[idx]


def _fused_adamw(case: Case, params) -> torch.optim.Optimizer:
    lr = torch.tensor(case.lr, device=case.device)
    return torch.optim.AdamW(params, lr=lr, weight_decay=case.weight_decay, fused=True)


# ------------------------------------------------------------------------ scaletrain
def run_scaletrain(case: Case, settings: Equal | None) -> Result:
    from scaletrain.config import DataConfig, OptimConfig, PrecisionConfig, TrainConfig
    from scaletrain.training import Trainer
    pytorch_defaults()
    cfg = TrainConfig(epochs=case.epochs, batch_size=case.batch, device=case.device.type, progress=False,
                      optim=OptimConfig(optimizer="adamw", lr=case.lr, weight_decay=case.weight_decay,
                                        decay_all=True, lr_schedule="onecycle"),
                      data=DataConfig(placement="device"), log_every=10**9)
    if settings is not None:
        cfg.precision = PrecisionConfig(policy=settings.precision)
        cfg.channels_last, cfg.compile, cfg.cudnn_benchmark = settings.channels_last, settings.compile, False
    cfg.tracking.record = False
    trainer = Trainer(case.model(), cfg)
    try:
        trainer.fit(case.dataset)
    finally:
        trainer.close()
    return Result([e["epoch_train_time_s"] for e in trainer.history], [e["val_accuracy"] for e in trainer.history],
                  trainer.warmup_s)


# ------------------------------------------------------------------------- hand loop
def run_hand(case: Case, settings: Equal | None) -> Result:
    pytorch_defaults()
    device = case.device
    if settings is None:      # the tutorial's loop
        model = case.model().to(device)
        forward, autocast = model, contextlib.nullcontext()
        loader = DataLoader(TensorDataset(*case.train), batch_size=case.batch, shuffle=True, drop_last=True)
        opt = torch.optim.AdamW(model.parameters(), lr=case.lr, weight_decay=case.weight_decay)
        schedule = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=case.lr, total_steps=case.steps * case.epochs)
        epoch_batches = lambda: ((x.to(device), y.to(device)) for x, y in loader)  # noqa: E731
        set_lr = lambda step: schedule.step()  # noqa: E731
    else:
        model, forward = _prepared(case, settings)
        autocast = _autocast(device, settings.precision)
        opt = _fused_adamw(case, model.parameters())
        lrs, generator = case.lr_at(), torch.Generator(device=device).manual_seed(0)
        epoch_batches = lambda: _device_batches(case, settings, generator)  # noqa: E731

        def set_lr(step):
            opt.param_groups[0]["lr"].fill_(lrs[step + 1])
        opt.param_groups[0]["lr"].fill_(lrs[0])
    model.train()
    epochs, accs, step = [], [], 0
    for _ in range(case.epochs):
        _sync(device)
        start = time.perf_counter()
        for x, y in epoch_batches():
            with autocast:
                loss = F.cross_entropy(forward(x).float(), y)
            loss.backward()
            opt.step()
            set_lr(step)
            opt.zero_grad(set_to_none=True)
            step += 1
        _sync(device)
        epochs.append(time.perf_counter() - start)
        accs.append(accuracy(model, case.val, device, autocast))
    return Result(epochs, accs)


# ------------------------------------------------------------------------- Lightning
def run_lightning(case: Case, settings: Equal | None) -> Result:   # noqa: C901 - Lightning's arm whole, as the other arms are: its settings, callbacks and timing read in order
    import lightning as L
    pytorch_defaults()
    device = case.device
    clock = {"epochs": [], "accs": [], "start": 0.0}
    if settings is None:
        model, forward = case.model(), None
        autocast = contextlib.nullcontext()
    else:
        model, forward = _prepared(case, settings)
        autocast = _autocast(device, settings.precision)
    lrs = case.lr_at()

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = model
            self.forward_fn = forward

        def training_step(self, batch, i):
            x, y = batch
            if settings is None:
                return F.cross_entropy(self.net(x), y)
            with autocast:
                loss = F.cross_entropy(self.forward_fn(x).float(), y)
            return loss

        def configure_optimizers(self):
            if settings is None:
                opt = torch.optim.AdamW(self.parameters(), lr=case.lr, weight_decay=case.weight_decay)
                sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=case.lr, total_steps=case.steps * case.epochs)
                return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}
            return _fused_adamw(case, self.parameters())

        def on_train_epoch_start(self):
            _sync(device)
            clock["start"] = time.perf_counter()

        def on_train_batch_start(self, batch, i):
            if settings is not None:   # the same per-step LR as the other sides
                self.optimizers().optimizer.param_groups[0]["lr"].fill_(lrs[self.global_step])

        def on_train_batch_end(self, outputs, batch, i):
            if i == case.steps - 1:
                _sync(device)
                clock["epochs"].append(time.perf_counter() - clock["start"])
                clock["accs"].append(accuracy(self.net, case.val, device, autocast))

    if settings is None:
        loader = DataLoader(TensorDataset(*case.train), batch_size=case.batch, shuffle=True, drop_last=True)
    else:
        generator = torch.Generator(device=device).manual_seed(0)

        class Batches(torch.utils.data.IterableDataset):
            def __iter__(self):
                return _device_batches(case, settings, generator)

            def __len__(self):
                return case.steps
        loader = DataLoader(Batches(), batch_size=None)
    with tempfile.TemporaryDirectory() as root, warnings.catch_warnings(), \
            contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        logging.getLogger("lightning").setLevel(logging.ERROR)
        logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
        kwargs = dict(max_epochs=case.epochs, default_root_dir=root, devices=1,
                      accelerator="gpu" if device.type == "cuda" else "cpu")
        if settings is not None:   # precision is the module's autocast, as on the other sides
            kwargs.update(precision="32-true", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                          enable_model_summary=False, num_sanity_val_steps=0)
        L.Trainer(**kwargs).fit(Module(), loader)
    return Result(clock["epochs"], clock["accs"])


ARMS = {"scaletrain": run_scaletrain, "hand loop": run_hand, "Lightning": run_lightning}
