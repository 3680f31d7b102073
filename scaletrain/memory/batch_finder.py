"""The batch-size finder: the largest per-device batch that runs real training steps without
running out of memory, found by doubling and then narrowing the bracket (memory/bracket.py:
along the measured peaks' chord under --memory-limit, by bisection where a trial has no peak).

Every trial runs `steps` real optimizer steps of the trainer's own step (same precision, strategy,
compilation, activation checkpointing) on real samples; the model, optimizer, counters and RNG
are snapshotted once and restored after every trial, so the trainer is left exactly as it was.
Out of memory means torch.OutOfMemoryError on a GPU; on a CPU, where nothing runs out of memory,
the measured peak (live tensor bytes) against --memory-limit stands in. Under a data-parallel
strategy the failure flag is all-reduced (max) so every rank takes the same branch of the search.
"""

from __future__ import annotations

import gc
import time
from dataclasses import asdict, dataclass, field

import torch

from scaletrain.errors import ConfigError
from scaletrain.inputs import first_rows, map_inputs, tensors
from scaletrain.memory.bracket import largest_fitting
from scaletrain.memory.tracker import LiveBytes
from scaletrain.training.snapshot import TrainingSnapshot
from scaletrain.training.step import TrainStep


@dataclass(slots=True)
class Trial:
    batch_size: int                 # per device
    fits: bool
    peak_bytes: int | None          # per device (the largest over ranks)
    samples_per_s: float | None     # over all devices
    reason: str = ""


@dataclass(slots=True)
class BatchSizeResult:
    max_batch_size: int             # per device: the largest that ran
    recommended_batch_size: int     # per device, after the safety margin (a multiple of 8 where >= 8)
    devices: int                    # processes that train
    replicas: int                   # data-parallel replicas: each takes a batch (== devices without model parallelism)
    margin: float
    memory_limit: int | None
    trials: list[Trial] = field(default_factory=list)
    global_batch_size: int | None = None     # held fixed with --global-batch
    grad_accum_steps: int | None = None
    limited_by: str | None = None   # the largest batch tried still fit: what capped the search

    def to_dict(self) -> dict:
        return asdict(self)


def recommended(max_batch: int, margin: float) -> int:
    """max_batch less the margin, rounded down to a multiple of 8 (tensor cores) where that is >= 8."""
    value = max(1, int(max_batch * (1 - margin)))
    return value // 8 * 8 if value >= 8 else value


def accumulation_for(global_batch: int, devices: int, max_per_device: int) -> tuple[int, int]:
    """(micro-batch, accumulation steps) with micro x steps x devices == global_batch and the
    micro-batch as large as fits."""
    if global_batch % devices:
        raise ConfigError(f"--global-batch {global_batch} does not divide over {devices} devices; "
                          f"use a multiple of {devices}")
    per_device = global_batch // devices
    micro = max(d for d in range(1, min(per_device, max_per_device) + 1) if per_device % d == 0)
    return micro, per_device // micro


class BatchSizeFinder:
    def __init__(self, trainer, dataset, *, steps: int = 3, margin: float = 0.1, memory_limit: int | None = None,
                 seed: int = 0, on_trial=None):
        if steps < 2:
            raise ConfigError(f"--trial-steps must be at least 2 (one warm-up, one timed; got {steps})")
        if not 0 <= margin < 1:
            raise ConfigError(f"--margin must be in [0, 1) (got {margin})")
        if memory_limit is None and trainer.device.type != "cuda":
            raise ConfigError("on a CPU nothing runs out of memory: give a budget with --memory-limit (e.g. 2GB)")
        self.trainer, self.dataset = trainer, dataset
        self.steps, self.margin, self.memory_limit = steps, margin, memory_limit
        self.generator = torch.Generator().manual_seed(seed)
        self.trials: dict[int, Trial] = {}
        self.on_trial = on_trial or (lambda trial: None)   # called as each trial ends (progress)
        trainer.adopt(dataset)   # the data's task and input statistics

    # ---------------------------------------------------------------- search
    def run(self, start: int = 1, max_batch: int = 65536, global_batch: int | None = None) -> BatchSizeResult:
        if start < 1 or max_batch < start:
            raise ConfigError(f"need 1 <= --first-batch-size ({start}) <= --max-batch-size ({max_batch})")
        t = self.trainer
        # A global batch larger than the training set is never a useful answer (every step would
        # repeat samples); the search is per device, and every data-parallel replica takes a batch.
        replicas = t.layout.replicas
        samples = len(self.dataset.train)
        cap = samples // replicas
        over = f" over {replicas} replicas" if replicas > 1 else ""
        if start > cap:
            raise ConfigError(f"--first-batch-size {start} per device is larger than the {samples} training "
                              f"samples{over}; use at most {max(cap, 1)}")
        limit_name = f"--max-batch-size {max_batch}"
        if max_batch > cap:
            max_batch, limit_name = cap, f"the training set's {samples} samples{over}"
        snapshot = TrainingSnapshot(t.model, t.optimizer, {**t.counters.tensors(),
                                                          **(t.scaler.state_tensors() if t.scaler else {})})
        try:
            good, bad = 0, None
            size = start
            while size <= max_batch:          # doubling
                if not self._trial(size, snapshot).fits:
                    bad = size
                    break
                good, size = size, size * 2
            if bad is None and good < max_batch:
                bad = max_batch + 1 if self._trial(max_batch, snapshot).fits else max_batch
                good = max_batch if bad > max_batch else good
            if bad is not None:
                good = largest_fitting(good, bad, self.memory_limit, lambda n: self._known_trial(n, snapshot))
        finally:
            self._restore(snapshot)
        if good == 0:
            raise ConfigError(f"even a batch of {start} per device does not fit"
                              + (f" in --memory-limit {self.memory_limit} bytes" if self.memory_limit else ""))
        result = BatchSizeResult(max_batch_size=good, recommended_batch_size=recommended(good, self.margin),
                                 devices=t.layout.workers, replicas=replicas, margin=self.margin,
                                 memory_limit=self.memory_limit,
                                 trials=[self.trials[k] for k in sorted(self.trials)],
                                 limited_by=limit_name if good == max_batch else None)
        if global_batch is not None:
            micro, accum = accumulation_for(global_batch, replicas, result.recommended_batch_size)
            result.global_batch_size, result.grad_accum_steps = global_batch, accum
            result.recommended_batch_size = micro
        return result

    # ----------------------------------------------------------------- trial
    def _batch(self, size: int):
        """`size` samples drawn from the in-memory examples, on the device as the loaders deliver
        them: normalised, then given to the task's `model_inputs` (a model's own loss takes the
        targets among its named inputs)."""
        train, device = self.dataset.examples, self.trainer.device
        idx = torch.randint(len(train), (size,), generator=self.generator)
        x = map_inputs(lambda t: t[idx].to(device), train.x)
        y = train.y[idx].to(device)
        return self.trainer.task.model_inputs(self.trainer.normalizer(x), y), y

    def _probe(self, x, y) -> str:
        """One forward/backward with gradient communication off (DDP's no_sync): a rank that runs
        out of memory here fails alone, before any collective could leave its peers waiting in a
        mismatched one. (FSDP gathers parameters inside the forward, so its probe is the step.)"""
        t = self.trainer
        step = t.build_step(t.schedule(1, 1), grad_accum_steps=1)
        try:
            with t.strategy.no_sync():
                loss, output = step.forward_loss(x, y)
                step.backward(loss)
            return ""
        except torch.OutOfMemoryError as exc:
            return f"out of memory: {str(exc).splitlines()[0][:120]}"
        finally:
            loss = output = None  # noqa: F841 (drops the step's graph before the gradients go)
            t.model.zero_grad(set_to_none=True)

    def _restore(self, snapshot: TrainingSnapshot) -> None:
        """The trainer as it was before a trial: its tensors put back, the counters told so."""
        snapshot.restore()
        self.trainer.counters.restored()
        self._release()

    def _known_trial(self, size: int, snapshot: TrainingSnapshot) -> tuple[bool, int | None]:
        """(fits, peak bytes) of a batch, from its trial if it already ran."""
        trial = self.trials.get(size) or self._trial(size, snapshot)
        return trial.fits, trial.peak_bytes

    def _trial(self, size: int, snapshot: TrainingSnapshot) -> Trial:
        trial = self._run_trial(size, snapshot)
        self.trials[size] = trial
        self.on_trial(trial)
        return trial

    def _input_bytes(self, size: int) -> int:
        """Bytes of one trial batch as the step sees it (normalised inputs and labels)."""
        train, normalizer = self.dataset.examples, self.trainer.normalizer
        sample = normalizer(first_rows(train.x))   # one sample as the step receives it (its dtype)
        per_sample = sum(t.numel() * t.element_size() for t in tensors(sample))
        return size * (per_sample + train.y[0].numel() * train.y.element_size())

    def _run_trial(self, size: int, snapshot: TrainingSnapshot) -> Trial:
        t = self.trainer
        if self.memory_limit is not None and t.device.type != "cuda" and self._input_bytes(size) > self.memory_limit:
            # The batch alone exceeds the budget: refused before allocating it (every rank alike).
            return Trial(size, False, self._input_bytes(size), None,
                         f"the batch alone needs {self._input_bytes(size)} bytes > --memory-limit {self.memory_limit}")
        failed, reason, peak, rate = 0.0, "", 0, None
        if not t.strategy.forward_communicates:
            x, y = self._batch(size)
            reason = self._probe(x, y)
            flag = torch.tensor([1.0 if reason else 0.0], dtype=torch.float64, device=t.device)
            t.strategy.all_reduce_max_(flag)
            if flag.item():
                self._restore(snapshot)
                return Trial(size, False, None, None, reason or "out of memory on another rank")
        try:
            peak, rate = self.measure(size, self.steps)
            if self.memory_limit is not None and peak > self.memory_limit:
                failed, reason = 1.0, f"peak {peak} bytes > --memory-limit {self.memory_limit}"
        except torch.OutOfMemoryError as exc:
            failed, reason = 1.0, f"out of memory: {str(exc).splitlines()[0][:120]}"
        finally:
            self._restore(snapshot)
        # Every rank takes the same branch: the worst rank decides.
        flags = torch.tensor([failed, float(peak)], dtype=torch.float64, device=t.device)
        t.strategy.all_reduce_max_(flags)
        fits = flags[0].item() == 0
        return Trial(size, fits, int(flags[1].item()) or None, rate if fits else None,
                     "" if fits else (reason or "out of memory on another rank"))

    def measure(self, size: int, steps: int) -> tuple[int, float]:
        """(peak bytes, samples/s over all devices) of `steps` real training steps at a per-device
        batch of `size`, the first untimed. Changes the trainer's state: restore a snapshot after."""
        t = self.trainer
        x, y = self._batch(size)
        # The trainer's own step, with no accumulation: a trial's batch is one micro-batch.
        step = t.build_step(t.schedule(steps, 1), grad_accum_steps=1)
        t.counters.resize(steps)
        t.counters.set_applied(0)  # the schedule table's index
        peak, elapsed = self._measure(step, x, y, steps)
        return peak, size * t.layout.replicas * (steps - 1) / max(elapsed, 1e-9)

    def _measure(self, step: TrainStep, x, y, steps: int) -> tuple[int, float]:
        t = self.trainer
        if t.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(t.device)
            step(x, y)
            torch.cuda.synchronize(t.device)
            start = time.perf_counter()
            for _ in range(steps - 1):
                step(x, y)
            torch.cuda.synchronize(t.device)
            return int(torch.cuda.max_memory_allocated(t.device)), time.perf_counter() - start
        # CPU: resident state, the batch itself, and everything the steps allocate, counted tensor
        # by tensor (the batch is held for the whole step: leaving it out once let a 3x64x64 MLP
        # search grow past 6 GB of resident memory under a 300 MB budget).
        held = _state_tensors(t) + tensors(x) + [y]   # named inputs may share the labels' storage
        resident = _unique_bytes(held)
        tracker = LiveBytes(held)
        with tracker:
            step(x, y)
            start = time.perf_counter()
            for _ in range(steps - 1):
                step(x, y)
            elapsed = time.perf_counter() - start
        return resident + tracker.peak, elapsed

    def _release(self) -> None:
        gc.collect()
        if self.trainer.device.type == "cuda":
            torch.cuda.empty_cache()


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def _state_tensors(trainer) -> list[torch.Tensor]:
    tensors = [_local(p.detach()) for p in trainer.model.parameters()] + list(trainer.model.buffers())
    for state in trainer.optimizer.state.values():
        tensors += [_local(v) for v in state.values() if isinstance(v, torch.Tensor)]
    return tensors


def _unique_bytes(held: list[torch.Tensor]) -> int:
    """Bytes of the storages under `held`, each counted once."""
    seen, total = set(), 0
    for t in held:
        storage = t.untyped_storage()
        if storage._cdata not in seen:
            seen.add(storage._cdata)
            total += storage.nbytes()
    return total


def find_batch_size(trainer, dataset, *, start: int = 1, max_batch: int = 65536, steps: int = 3,
                    margin: float = 0.1, memory_limit: int | None = None,
                    global_batch: int | None = None, on_trial=None) -> BatchSizeResult:
    """The Python API of `scaletrain find-batch-size`: searches with `trainer`'s own step and
    leaves the trainer exactly as it found it. `on_trial(trial)` is called as each trial ends."""
    finder = BatchSizeFinder(trainer, dataset, steps=steps, margin=margin, memory_limit=memory_limit,
                             on_trial=on_trial)
    return finder.run(start=start, max_batch=max_batch, global_batch=global_batch)
