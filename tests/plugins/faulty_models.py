"""Model builders for the multi-process tests, loaded by the real CLI as `faulty_models:NAME`
(tests put this folder on PYTHONPATH). Each is the library's MLP with a forward pre-hook (so its
state dict is exactly the plain MLP's); the fault fires inside a real training step of a real
worker process."""

import os
import time

from torch import nn

from scaletrain.models.mlp import MLP


def _Wrapped(model: nn.Module, on_forward) -> nn.Module:
    calls = [0]

    def hook(module, args):
        if module.training:
            calls[0] += 1
            on_forward(calls[0])

    model.register_forward_pre_hook(hook)
    return model


def slow_mlp(shape, classes, delay_s=0.01, **options):
    """An MLP whose every training forward sleeps, so a run lasts long enough to be killed mid-way."""
    return _Wrapped(MLP(shape, classes, **options), lambda call: time.sleep(delay_s))


def slow_worker(shape, classes, model="mlp", rank=1, delay_s=0.01, **options):
    """The registered model `model` whose training forwards sleep `delay_s` on rank `rank` alone: a
    slow worker on purpose (parameter servers' staleness and backup workers; the benchmarks of
    stragglers put this folder on PYTHONPATH too)."""
    from scaletrain.models.registry import build_model

    def slow(call):
        if _rank() == rank:
            time.sleep(delay_s)
    return _Wrapped(build_model(model, shape, classes, **options), slow)


def stepping_mlp(shape, classes, marks="", **options):
    """Writes marks/stepped-PID as its third training forward starts: the warm-up's was the first,
    so the run's first step has ended (a test's sign that the run has trained, and keeps its folder)."""
    def mark(call):
        if call == 3:
            open(os.path.join(marks, f"stepped-{os.getpid()}"), "w").close()
    return _Wrapped(MLP(shape, classes, **options), mark)


def _rank() -> int:
    return int(os.environ.get("RANK", 0))


def raising_mlp(shape, classes, rank=1, at_call=5, **options):
    """Raises in the training forward number `at_call` of rank `rank`."""
    def fault(call):
        if _rank() == rank and call == at_call:
            raise RuntimeError(f"injected failure on rank {rank} at forward {call}")
    return _Wrapped(MLP(shape, classes, **options), fault)


def hanging_mlp(shape, classes, rank=1, at_call=5, marker="", **options):
    """Hangs (sleeps for an hour) in training forward number `at_call` of rank `rank`: a dead peer
    that never closes its sockets, which only a collective timeout can detect. With `marker`, the
    file it creates as it starts to hang (a test's sign that the peers now wait on it)."""
    def fault(call):
        if _rank() == rank and call == at_call:
            if marker:
                open(marker, "w").close()
            time.sleep(3600)
    return _Wrapped(MLP(shape, classes, **options), fault)


def oom_mlp(shape, classes, above=100, rank=None, **options):
    """Raises torch.OutOfMemoryError in any forward of more than `above` samples (on every rank, or
    only on `rank`): the batch-size finder's out-of-memory path, on a CPU."""
    import torch

    model = MLP(shape, classes, **options)

    def hook(module, args):
        if args[0].shape[0] > above and (rank is None or _rank() == rank):
            raise torch.OutOfMemoryError(f"injected: batch {args[0].shape[0]} > {above}")

    model.register_forward_pre_hook(hook)
    return model


def sweep_fault_mlp(shape, classes, oom_above=100, kill_above=200, **options):
    """Training forwards of more than `kill_above` samples kill the process outright (SIGKILL, as
    the kernel's out-of-memory killer would: nothing gets recorded); more than `oom_above` raise
    torch.OutOfMemoryError (the run records its own failure)."""
    import signal

    import torch

    model = MLP(shape, classes, **options)

    def hook(module, args):
        if module.training and args[0].shape[0] > kill_above:
            os.kill(os.getpid(), signal.SIGKILL)
        if module.training and args[0].shape[0] > oom_above:
            raise torch.OutOfMemoryError(f"injected: batch {args[0].shape[0]} > {oom_above}")

    model.register_forward_pre_hook(hook)
    return model


def raising_gpt(shape, classes, rank=1, at_call=3, **options):
    """A gpt whose last block raises in its training forward number `at_call` on rank `rank`: under
    a two-stage pipeline, a failure inside the second stage (the hook sits on the block, since a
    pipeline never calls the model's own forward)."""
    from scaletrain.models.gpt import GPT

    model = GPT(shape, classes, **options)

    def fault(call):
        if _rank() == rank and call == at_call:
            raise RuntimeError(f"injected failure in the last block on rank {rank} at forward {call}")
    _Wrapped(model.blocks[-1], fault)
    return model


def single_thread_differs_mlp(shape, classes, **options):
    """An MLP that learns differently on purpose when torch runs on one thread (its output doubled):
    the autotuner's loss check must refuse the `threads = 1` candidate."""
    import torch

    model = MLP(shape, classes, **options)
    model.register_forward_hook(lambda module, args, out: out * 2 if torch.get_num_threads() == 1 else out)
    return model


def runtime_oom_mlp(shape, classes, above=40, **options):
    """Raises torch.OutOfMemoryError in a real (not fake-tensor) forward of more than `above`
    samples: a candidate the planner lets through that runs out of memory when it trains."""
    import torch
    from torch._subclasses.fake_tensor import is_fake

    model = MLP(shape, classes, **options)

    def hook(module, args):
        if args[0].shape[0] > above and not is_fake(args[0]):
            raise torch.OutOfMemoryError(f"injected: {args[0].shape[0]} samples > {above}")
    model.register_forward_pre_hook(hook)
    return model


def single_thread_hangs_mlp(shape, classes, **options):
    """An MLP whose real training forward sleeps for a minute when torch runs on one thread: the
    autotuner's `threads = 1` candidate outlives any short --budget-s (the planner's fake-tensor
    forwards in the autotune process itself pass)."""
    import torch
    from torch._subclasses.fake_tensor import is_fake

    model = MLP(shape, classes, **options)

    def hook(module, args):
        x = args[0]
        if module.training and torch.get_num_threads() == 1 and not is_fake(x) and x.device.type != "meta":
            time.sleep(60)

    model.register_forward_pre_hook(hook)
    return model


def single_thread_slows_mlp(shape, classes, sleep_s=0.5, after_calls=0, **options):
    """An MLP whose real training forwards on one thread sleep `sleep_s` each after the first
    `after_calls` of them: the autotuner's `threads = 1` candidate warms up at full speed, then
    trains far slower than the baseline from its first measured step."""
    import torch
    from torch._subclasses.fake_tensor import is_fake

    model = MLP(shape, classes, **options)
    calls = {"n": 0}

    def hook(module, args):
        x = args[0]
        if module.training and torch.get_num_threads() == 1 and not is_fake(x) and x.device.type != "meta":
            calls["n"] += 1
            if calls["n"] > after_calls:
                time.sleep(sleep_s)

    model.register_forward_pre_hook(hook)
    return model


def picky_mlp(shape, classes, max_batch=128, **options):
    """An MLP whose training forward refuses batches above `max_batch` (a user's model with a
    limit of its own): it raises while the planner traces such a candidate on fake tensors."""
    model = MLP(shape, classes, **options)

    def hook(module, args):
        if module.training and args[0].shape[0] > max_batch:
            raise ValueError(f"batches above {max_batch} are not supported")

    model.register_forward_pre_hook(hook)
    return model



def loaded_mlp(shape, classes, counter="", delay_s=0.02, slow_process=0, **options):
    """An MLP on a machine whose load comes and goes: every second process that trains it (counted
    in the file `counter`) is slowed down, each training forward sleeping `delay_s`. Runs measured
    one after another then rank by when they ran, not by what they are. With `slow_process` N,
    only the N-th process is slow (a crawl that strikes one run)."""
    import fcntl

    import torch
    state = {"slow": None}

    def hook(module, args):
        if not module.training or state["slow"] is not None:
            if state["slow"]:
                time.sleep(delay_s)
            return
        x = args[0]
        if x.device.type == "meta" or type(x).__name__ == "FakeTensor" or not isinstance(x, torch.Tensor):
            return     # a planner's trace, not a training
        with open(counter, "a+") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            fh.seek(0)
            count = len(fh.read()) + 1
            fh.write("x")
        state["slow"] = count == int(slow_process) if slow_process else count % 2 == 1
        if state["slow"]:
            time.sleep(delay_s)

    model = MLP(shape, classes, **options)
    model.register_forward_pre_hook(hook)
    return model


def placement_mlp(shape, classes, out="", **options):
    """An MLP that writes, at its first training forward, where its process runs: rank, the cores
    it may use and its thread count (`out`.<rank>, JSON)."""
    import json

    import torch

    def record(call):
        if call == 1:
            with open(f"{out}.{_rank()}", "w") as fh:
                json.dump({"cores": sorted(os.sched_getaffinity(0)), "threads": torch.get_num_threads()}, fh)

    return _Wrapped(MLP(shape, classes, **options), record)
