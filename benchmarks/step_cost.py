"""What a scaletrain step costs against a hand loop's, as whole processes (issue 96).

Every side is its own fresh Python process, run in turn and interleaved (A B C D, B C D A, ...), so
no side inherits another's process-wide settings (threads, flush-to-zero, allocator, imports):

    scaletrain   `scaletrain train` as a user runs it (its record, metrics log, monitor thread and
                 every callback on), each epoch's training time from its metrics.jsonl;
    hand         the careful hand loop at **equal settings**: the same model and initial weights,
                 the same data on the device, normalised once, gathered by a per-epoch
                 permutation, fused AdamW over scaletrain's parameter groups with a tensor LR
                 filled from the same one-cycle table each step, the same loss, thread count and
                 flush-to-zero; no metric, no log;
    tutorial     the loop as PyTorch's tutorials write it (**no flags**): DataLoader(TensorDataset,
                 shuffle=True), torch.optim.AdamW, OneCycleLR, torch's own thread count;
    lightning    Lightning at equal settings: the hand loop's batches, optimizer and LR in a
                 LightningModule, logger, checkpointing, progress bar and summary off.

Each side's epoch is the median of its epochs after the first (the first holds the warm-up);
every side evaluates the validation split after each epoch, untimed. A round's ratio is
scaletrain's epoch over the other side's; printed: median (min-max) over rounds.

    python benchmarks/step_cost.py --case cnn1d --rounds 5                       # equal settings, 1 thread
    python benchmarks/step_cost.py --case cnn1d --no-flags --rounds 5            # both sides' defaults
    python benchmarks/step_cost.py --case cnn1d --ablate --rounds 5              # what measuring costs
    python benchmarks/step_cost.py --case cnn1d --breakdown                      # op-by-op, per step
    python benchmarks/step_cost.py --case wide-mlp --rounds 5
    python benchmarks/step_cost.py --case small-gpt --rounds 5 --pair              # scaletrain and the hand loop only

`--ablate` runs scaletrain beside itself with measuring pieces turned off (the run record and its
monitor thread; the metrics log; the training metric), each as its own side.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


@dataclass(frozen=True)
class Case:
    """One workload, as scaletrain's command line names it and as the hand loop builds it."""
    model: str
    data: str
    batch: int
    epochs: int
    lr: float
    weight_decay: float
    options: dict = field(default_factory=dict)      # the model's options
    data_options: dict = field(default_factory=dict)  # DataConfig fields beside the name

    def cli(self) -> list[str]:
        args = ["--model", self.model, "--data", self.data, "--batch-size", str(self.batch),
                "--epochs", str(self.epochs), "--optimizer", "adamw", "--lr", str(self.lr),
                "--weight-decay", str(self.weight_decay), "--lr-schedule", "onecycle"]
        for k, v in self.options.items():
            args += ["--model-option", f"{k}={json.dumps(v)}"]
        for k, v in self.data_options.items():
            args += [f"--{k.replace('_', '-')}", ",".join(map(str, v)) if isinstance(v, (list, tuple)) else str(v)]
        return args


CASES = {
    # The default recipe (recipes/mnist1d-cnn.toml) over 4 epochs.
    "cnn1d": Case("cnn1d", "mnist1d", 128, 4, 0.01, 0.05),
    "wide-mlp": Case("mlp", "mnist1d", 128, 3, 0.001, 0.05, {"hidden": [2048, 2048]}),
    "small-gpt": Case("gpt", "char-corpus", 16, 3, 0.003, 0.01, {"dim": 256, "depth": 4},
                      {"seq_len": 64, "train_subset": 320}),
}


# ------------------------------------------------------------------------------ the children
def _dataset(case: Case):
    from scaletrain.config import DataConfig
    from scaletrain.data import load_dataset
    return load_dataset(DataConfig(name=case.data, **case.data_options), seed=0)


def _model(case: Case, ds):
    import torch

    from scaletrain.models import build_model
    torch.manual_seed(0)   # scaletrain's seed: the same initial weights
    return build_model(case.model, ds.input_shape, ds.num_classes, **case.options)


def _loss(case: Case):
    from torch.nn import functional as F
    if case.data == "char-corpus":
        return lambda out, y: F.cross_entropy(out.float().flatten(0, 1), y.flatten())
    return lambda out, y: F.cross_entropy(out.float(), y)


def _normalised(ds, split):
    x = split.x
    return x if ds.mean is None else (x.float() - ds.mean) / ds.std


def _validate(model, ds, loss_of) -> float:
    import torch
    val = ds.val if ds.val is not None else ds.test
    x, y = _normalised(ds, val), val.y
    model.eval()
    with torch.no_grad():
        loss = sum(float(loss_of(model(x[i:i + 256]), y[i:i + 256])) * len(y[i:i + 256]) for i in range(0, len(y), 256))
    model.train()
    return loss / len(y)


class Turns:
    """A child's side of the turn-taking: before each epoch it says `ready` and waits for `go` on
    stdin (blocked, using no CPU); after the epoch and its validation it prints the epoch's
    seconds. The parent hands the turn to one side at a time. It writes to the stdout it was made
    with: a side's own printing goes to stderr."""

    def __init__(self):
        self.out = sys.stdout

    def begin(self) -> None:
        print("ready", file=self.out, flush=True)
        if sys.stdin.readline().strip() != "go":
            raise SystemExit(0)

    def end(self, seconds: float) -> None:
        print(json.dumps({"epoch_s": seconds}), file=self.out, flush=True)


def _equal_optimizer(case: Case, params, steps: int):
    """Fused AdamW over scaletrain's parameter groups with one tensor LR, and its one-cycle table."""
    import torch

    from scaletrain.config import OptimConfig
    from scaletrain.optim.optimizers import _param_groups
    from scaletrain.optim.schedules import build_schedule
    lr = torch.tensor(case.lr)
    groups = _param_groups(list(params), case.weight_decay)
    for g in groups:
        g["lr"] = lr
    lrs = build_schedule(OptimConfig(lr=case.lr, lr_schedule="onecycle"), steps, case.epochs).table(
        torch.device("cpu")).tolist()
    return torch.optim.AdamW(groups, lr=lr, fused=True), lr, lrs


def child_hand(case: Case, threads: int | None, turns: Turns, extra: list[str]) -> None:
    import torch
    torch.set_num_threads(threads)
    torch.set_flush_denormal(True)
    ds = _dataset(case)
    model, loss_of = _model(case, ds), _loss(case)
    x, y = _normalised(ds, ds.train), ds.train.y
    steps = len(y) // case.batch
    opt, lr, lrs = _equal_optimizer(case, model.parameters(), steps)
    generator = torch.Generator().manual_seed(0)
    step = 0
    for _ in range(case.epochs):
        turns.begin()
        start = time.perf_counter()
        order = torch.randperm(len(y), generator=generator)
        for b in range(steps):
            idx = order[b * case.batch:(b + 1) * case.batch]
            lr.fill_(lrs[step])
            loss = loss_of(model(x[idx]), y[idx])
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            step += 1
        seconds = time.perf_counter() - start
        _validate(model, ds, loss_of)
        turns.end(seconds)


def child_tutorial(case: Case, threads: int | None, turns: Turns, extra: list[str]) -> None:
    import torch
    from torch.utils.data import DataLoader, TensorDataset
    if threads:
        torch.set_num_threads(threads)
    ds = _dataset(case)
    model, loss_of = _model(case, ds), _loss(case)
    loader = DataLoader(TensorDataset(_normalised(ds, ds.train), ds.train.y), batch_size=case.batch, shuffle=True,
                        drop_last=True)
    opt = torch.optim.AdamW(model.parameters(), lr=case.lr, weight_decay=case.weight_decay)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=case.lr, total_steps=len(loader) * case.epochs)
    for _ in range(case.epochs):
        turns.begin()
        start = time.perf_counter()
        for xb, yb in loader:
            loss = loss_of(model(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
        seconds = time.perf_counter() - start
        _validate(model, ds, loss_of)
        turns.end(seconds)


def lightning_module(net, loss_of) -> type:
    """A LightningModule class around `net` whose training step is `loss_of` on its batch; each
    side adds its own optimizer and hooks."""
    import lightning as L

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = net

        def training_step(self, batch, i):
            return loss_of(self.net(batch[0]), batch[1])
    return Module


def child_lightning(case: Case, threads: int | None, turns: Turns, extra: list[str]) -> None:
    import logging
    import warnings

    import lightning as L
    import torch
    torch.set_num_threads(threads)
    torch.set_flush_denormal(True)
    warnings.simplefilter("ignore")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    ds = _dataset(case)
    net, loss_of = _model(case, ds), _loss(case)
    x, y = _normalised(ds, ds.train), ds.train.y
    steps = len(y) // case.batch
    generator = torch.Generator().manual_seed(0)
    clock = {"start": 0.0}

    class Batches(torch.utils.data.IterableDataset):
        def __iter__(self):
            order = torch.randperm(len(y), generator=generator)
            for b in range(steps):
                idx = order[b * case.batch:(b + 1) * case.batch]
                yield x[idx], y[idx]

        def __len__(self):
            return steps

    class Module(lightning_module(net, loss_of)):
        def configure_optimizers(self):
            self.opt, self.lr, self.lrs = _equal_optimizer(case, self.parameters(), steps)
            return self.opt

        def on_train_batch_start(self, batch, i):
            self.lr.fill_(self.lrs[self.global_step])

        def on_train_epoch_start(self):
            turns.begin()
            clock["start"] = time.perf_counter()

        def on_train_epoch_end(self):
            seconds = time.perf_counter() - clock["start"]
            _validate(self.net, ds, loss_of)
            turns.end(seconds)

    with tempfile.TemporaryDirectory() as root, contextlib.redirect_stdout(sys.stderr):
        trainer = L.Trainer(max_epochs=case.epochs, default_root_dir=root, accelerator="cpu", devices=1,
                            precision="32-true", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                            enable_model_summary=False, num_sanity_val_steps=0)
        trainer.fit(Module(), torch.utils.data.DataLoader(Batches(), batch_size=None))


def child_scaletrain(case: Case, threads: int | None, turns: Turns, extra: list[str]) -> None:
    """`scaletrain train` itself (cli.main, in this process), with one callback added where the
    command adds a tuner's: it takes its turn before each epoch's clock starts and reports the
    epoch's own training time (the run's `epoch_train_time_s`) after the epoch's validation."""
    from scaletrain.cli.main import main as scaletrain_main
    from scaletrain.experiments import pruning

    class TakeTurns:
        def on_epoch_begin(self, trainer, epoch):
            turns.begin()

        def on_epoch_end(self, trainer, epoch, logs):
            turns.end(logs["epoch_train_time_s"])

    pruning.trial_callbacks_from_env = lambda: [TakeTurns()]
    named = ["--precision", "fp32", "--threads", str(threads)] if threads else []
    with tempfile.TemporaryDirectory() as root, contextlib.redirect_stdout(sys.stderr):
        code = scaletrain_main(["train", *case.cli(), "--run-dir", str(Path(root) / "run"), "--no-progress",
                                "--store", str(Path(root) / "runs.db"), *named, *extra])
    if code:
        raise SystemExit(code)


CHILDREN = {"scaletrain": child_scaletrain, "hand": child_hand, "tutorial": child_tutorial,
            "lightning": child_lightning}


# ------------------------------------------------------------------------------ the parent
@dataclass
class Side:
    """One side of a comparison: which child, with which thread count and extra scaletrain flags."""
    child: str
    threads: int | None
    extra: tuple[str, ...] = ()


def sides(args) -> dict[str, Side]:
    t = args.threads
    if args.ablate:
        return {"scaletrain": Side("scaletrain", t), "no record": Side("scaletrain", t, ("--no-record",)),
                "hand": Side("hand", t)}
    if args.no_flags:
        return {"scaletrain": Side("scaletrain", None), "tutorial": Side("tutorial", None)}
    if args.pair:
        return {"scaletrain": Side("scaletrain", t), "hand": Side("hand", t)}
    return {"scaletrain": Side("scaletrain", t), "hand": Side("hand", t), "tutorial": Side("tutorial", t),
            **({"lightning": Side("lightning", t)} if args.lightning else {})}


def one_round(case_name: str, arms: dict[str, Side], rotation: int) -> dict[str, list[float]]:
    """Fresh processes for every side, taking turns epoch by epoch (the first side rotating with
    each epoch and round), so a drift in the machine's speed falls on every side alike."""
    procs, logs = {}, {}
    for name, side in arms.items():
        cmd = [sys.executable, __file__, "--child", side.child, "--case", case_name]
        cmd += ["--threads", str(side.threads)] if side.threads else []
        cmd += [f"--extra={e}" for e in side.extra]
        logs[name] = tempfile.TemporaryFile("w+")    # a side's own output: shown if it fails
        procs[name] = subprocess.Popen(cmd, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                       stderr=logs[name], text=True)
    epochs: dict[str, list[float]] = {n: [] for n in arms}

    def failed(name: str, what: str) -> RuntimeError:
        procs[name].wait()
        logs[name].seek(0)
        return RuntimeError(f"side {name!r} {what} (exit {procs[name].returncode}):\n{logs[name].read()[-3000:]}")

    def expect(name: str, word: str | None) -> str:
        line = procs[name].stdout.readline()
        if not line or (word and line.strip() != word):
            raise failed(name, f"said {line!r}")
        return line

    for name in arms:
        expect(name, "ready")
    names = list(arms)
    for e in range(CASES[case_name].epochs):
        k = (rotation + e) % len(names)
        for name in names[k:] + names[:k]:
            time.sleep(0.3)    # the other side's OpenMP threads stop spinning
            procs[name].stdin.write("go\n")
            procs[name].stdin.flush()
            epochs[name].append(json.loads(expect(name, None))["epoch_s"])
            if e + 1 < CASES[case_name].epochs:
                expect(name, "ready")
            else:   # its end of run (the test split, the record) before the next side's last epoch
                procs[name].stdin.close()
                if procs[name].wait() != 0:
                    raise failed(name, "failed at its end")
    return epochs


def spread(values: list[float], fmt: str = ".3f") -> str:
    return f"{statistics.median(values):{fmt}} ({min(values):{fmt}}-{max(values):{fmt}})"


def load() -> float:
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def compare(args) -> None:
    import torch
    arms = sides(args)
    names = list(arms)
    epochs: dict[str, list[float]] = {n: [] for n in names}
    loads = []
    for r in range(args.rounds):
        loads.append(load())
        found = one_round(args.case, arms, r)
        for name, times in found.items():
            epochs[name].append(statistics.median(times[1:]))
        print(json.dumps({"round": r, **{n: [round(t, 4) for t in ts] for n, ts in found.items()}}), flush=True)
    loads.append(load())
    case = CASES[args.case]
    table = "no flags (each side's defaults)" if args.no_flags else f"equal settings (fp32, {args.threads} thread(s))"
    print(f"\n## {args.case}: {case.model} {case.options or ''} on {case.data}, batch {case.batch}, {case.epochs} "
          f"epochs; {table}; {args.rounds} rounds, sides taking turns epoch by epoch")
    print(f"# {cpu_name()}, torch {torch.__version__}, Python {platform.python_version()}, "
          f"{time.strftime('%Y-%m-%d')}, 1-min load {min(loads):.2f}-{max(loads):.2f}")
    for n in names:
        print(f"{n:15s} epoch {spread([e * 1e3 for e in epochs[n]], ',.1f')} ms")
    for n in names[1:]:
        ratios = [a / b for a, b in zip(epochs[names[0]], epochs[n], strict=True)]
        print(f"{names[0]} / {n:12s} {spread(ratios)}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--case", choices=sorted(CASES), default="cnn1d")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=1, help="equal settings: every side's thread count")
    p.add_argument("--no-flags", action="store_true", help="scaletrain with no flags against the tutorial loop")
    p.add_argument("--ablate", action="store_true", help="scaletrain with measuring pieces off, beside itself")
    p.add_argument("--lightning", action="store_true", help="add Lightning at equal settings")
    p.add_argument("--pair", action="store_true", help="equal settings, scaletrain and the hand loop only")
    p.add_argument("--breakdown", action="store_true", help="op-by-op profile of a step, both sides")
    p.add_argument("--child", choices=sorted(CHILDREN), help=argparse.SUPPRESS)
    p.add_argument("--extra", action="append", default=[], help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        CHILDREN[args.child](CASES[args.case], args.threads, Turns(), args.extra)
        return
    if args.breakdown:
        from benchmarks.step_breakdown import breakdown
        breakdown(args.case, args.threads)
        return
    compare(args)


if __name__ == "__main__":
    main()
