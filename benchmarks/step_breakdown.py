"""Where a step's time goes, scaletrain's beside the hand loop's (`step_cost.py --breakdown`).

Each side runs in a fresh process; its second epoch is profiled with torch.profiler (CPU
activities, the main thread's top-level operations). Per step, in microseconds and in share of
the step's wall time:

- each operation family's own time (forward, backward and optimizer kernels as the dispatcher
  sees them: aten::convolution, autograd::engine::evaluate_function..., Optimizer.step...);
- **host, outside operations**: the step's wall time less its top-level operations' time, which is
  Python: the loop, callbacks, counters, the LR write, the clock.

Then scaletrain's extra per step, family by family, against the hand loop's.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _top_level(events) -> list:
    """The events no other CPU event of the same thread encloses (their times add up without
    double counting)."""
    out = []
    by_thread = defaultdict(list)
    for e in events:
        if e.device_type.name == "CPU":
            by_thread[e.thread].append(e)
    for evs in by_thread.values():
        evs.sort(key=lambda e: (e.time_range.start, -e.time_range.end))
        end = -1
        for e in evs:
            if e.time_range.start >= end:
                out.append(e)
                end = e.time_range.end
    return out


def _family(name: str) -> str:
    if name.startswith("autograd::engine") or "Backward" in name:
        return "backward"
    if name.startswith("Optimizer") or "_fused_adam" in name:
        return "optimizer step"
    if "zero_grad" in name:
        return "zero_grad"
    return name


def profile_epoch(run_epoch, steps: int) -> dict:
    """Profiles one call of `run_epoch()`; returns µs per step by family, the wall time and the
    host time outside operations."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        run_epoch()
        wall = time.perf_counter() - start
    main = None
    families: dict[str, float] = defaultdict(float)
    tops = _top_level(prof.events())
    counts = defaultdict(int)
    for e in tops:
        counts[e.thread] += 1
    main = max(counts, key=counts.get)      # the thread that ran the loop
    for e in tops:
        if e.thread == main:
            families[_family(e.name)] += (e.time_range.end - e.time_range.start) / steps
    ops = sum(families.values())
    return {"wall_us": wall * 1e6 / steps, "ops_us": ops, "host_us": wall * 1e6 / steps - ops,
            "families": dict(families), "other_threads_events": sum(v for k, v in counts.items() if k != main)}


def child_breakdown(case_name: str, side: str, threads: int) -> dict:
    from benchmarks import step_cost
    case = step_cost.CASES[case_name]
    if side == "hand":
        return _hand(case, threads)
    return _scaletrain(case, threads)


def _hand(case, threads: int) -> dict:
    import torch

    from benchmarks.step_cost import _dataset, _loss, _model
    from scaletrain.config import OptimConfig
    from scaletrain.optim.optimizers import _param_groups
    from scaletrain.optim.schedules import build_schedule
    torch.set_num_threads(threads)
    torch.set_flush_denormal(True)
    ds = _dataset(case)
    model, loss_of = _model(case, ds), _loss(case)
    x, y = ds.train.x, ds.train.y
    if ds.mean is not None:
        x = (x.float() - ds.mean) / ds.std
    steps = len(y) // case.batch
    lr = torch.tensor(case.lr)
    groups = _param_groups(list(model.parameters()), case.weight_decay)
    for g in groups:
        g["lr"] = lr
    opt = torch.optim.AdamW(groups, lr=lr, fused=True)
    lrs = build_schedule(OptimConfig(lr=case.lr, lr_schedule="onecycle"), steps, case.epochs).table(
        torch.device("cpu")).tolist()
    generator = torch.Generator().manual_seed(0)
    step = [0]

    def epoch():
        order = torch.randperm(len(y), generator=generator)
        for b in range(steps):
            idx = order[b * case.batch:(b + 1) * case.batch]
            lr.fill_(lrs[step[0]])
            loss = loss_of(model(x[idx]), y[idx])
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            step[0] += 1
    epoch()
    return profile_epoch(epoch, steps)


def _scaletrain(case, threads: int) -> dict:
    """The run as `scaletrain train` makes it (run_training: its record, monitor thread, metrics
    log and callbacks), its second epoch profiled by a callback."""
    import tempfile

    from torch.profiler import ProfilerActivity, profile

    from scaletrain.config import DataConfig, ModelConfig, OptimConfig, PrecisionConfig, TrainConfig
    from scaletrain.runner import run_training

    found: dict = {}

    class ProfileSecondEpoch:
        """Profiles the second epoch's training: from its start to the validation that follows it
        (the profiler stops there, so validation's operations are not counted); its wall time is
        the run's own clock of that epoch (`epoch_train_time_s`)."""
        prof = None     # the warm-up validates once before any epoch begins

        def on_epoch_begin(self, trainer, epoch):
            self.prof = None
            if epoch == 1:
                self.prof = profile(activities=[ProfilerActivity.CPU])
                self.prof.__enter__()

        def on_validation_begin(self, trainer):
            if self.prof is not None:
                self.prof.__exit__(None, None, None)
                self.events, self.prof = self.prof.events(), None

        def on_epoch_end(self, trainer, epoch, logs):
            if epoch != 1:
                return
            steps = trainer.steps_per_epoch
            tops = _top_level(self.events)
            counts = defaultdict(int)
            for e in tops:
                counts[e.thread] += 1
            main = max(counts, key=counts.get)
            families: dict[str, float] = defaultdict(float)
            for e in tops:
                if e.thread == main:
                    families[_family(e.name)] += (e.time_range.end - e.time_range.start) / steps
            ops, wall = sum(families.values()), logs["epoch_train_time_s"] * 1e6 / steps
            found.update(wall_us=wall, ops_us=ops, host_us=wall - ops, families=dict(families),
                         other_threads_events=sum(v for k, v in counts.items() if k != main))

    with tempfile.TemporaryDirectory() as root:
        cfg = TrainConfig(model=ModelConfig(name=case.model, options=dict(case.options)),
                          data=DataConfig(name=case.data, **case.data_options), batch_size=case.batch,
                          epochs=case.epochs, threads=threads, progress=False,
                          optim=OptimConfig(optimizer="adamw", lr=case.lr, weight_decay=case.weight_decay,
                                            lr_schedule="onecycle"),
                          precision=PrecisionConfig(policy="fp32"), run_dir=str(Path(root) / "run"))
        cfg.tracking.store = str(Path(root) / "runs.db")
        run_training(cfg, callbacks=[ProfileSecondEpoch()])
    return found


def breakdown(name: str, threads: int) -> None:
    results = {}
    for side in ("hand", "scaletrain"):
        out = subprocess.run([sys.executable, "-c", "import json,sys; sys.path.insert(0, '.'); "
                              "from benchmarks.step_breakdown import child_breakdown; "
                              f"print(json.dumps(child_breakdown({name!r}, {side!r}, {threads})))"],
                             check=True, cwd=ROOT, capture_output=True, text=True).stdout
        results[side] = json.loads(out.strip().splitlines()[-1])
    h, s = results["hand"], results["scaletrain"]
    print(f"## per step, µs (share of the step): {name}, fp32, {threads} thread(s)")
    print(f"{'':34s} {'hand loop':>18s} {'scaletrain':>18s} {'extra':>9s}")
    fams = sorted(set(h["families"]) | set(s["families"]), key=lambda f: -max(h["families"].get(f, 0),
                                                                                s["families"].get(f, 0)))
    rows = [("wall", h["wall_us"], s["wall_us"]), ("host, outside operations", h["host_us"], s["host_us"])]
    rows += [(f, h["families"].get(f, 0.0), s["families"].get(f, 0.0)) for f in fams]
    for label, a, b in rows:
        if max(a, b) < 2 and label not in ("wall",):
            continue
        print(f"{label[:34]:34s} {a:9.0f} ({a / h['wall_us']:5.1%}) {b:9.0f} ({b / s['wall_us']:5.1%}) {b - a:+9.0f}")
