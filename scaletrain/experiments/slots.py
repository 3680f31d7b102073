"""Device slots and a pool of training processes, one per slot: the machinery under sweep,
tune and multi ("one trial per GPU", seed 002).

On a GPU box a slot is one GPU (CUDA_VISIBLE_DEVICES); on a CPU box it is an equal share of the
cores (the process is pinned to them and its thread pools sized to them), so parallel trials do
not fight over the same cores. Each job is its own process: a crash or an out-of-memory ends only
that job. Jobs die with the pool's process (PR_SET_PDEATHSIG), so a killed `tune` leaves no
orphan trainings behind.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from scaletrain.distributed.env import scaletrain_command
from scaletrain.errors import UserError

_PR_SET_PDEATHSIG = 1


@dataclass(slots=True)
class Slot:
    index: int
    label: str
    env: dict[str, str]
    cpus: list[int] | None = None


def device_slots(parallel: int, device: str = "auto") -> list[Slot]:
    """`parallel` slots: GPUs round-robin where CUDA is used, else equal shares of the CPU cores."""
    if parallel < 1:
        raise UserError(f"--parallel must be at least 1 (got {parallel})")
    use_cuda = device != "cpu"
    gpus = 0
    if use_cuda:
        import torch
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if device.startswith("cuda") and gpus == 0:
            raise UserError(f"--device {device}: no CUDA device is visible; use --device cpu")
    if gpus:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        ids = visible.split(",") if visible else [str(i) for i in range(gpus)]
        return [Slot(i, f"cuda {ids[i % gpus]}", {"CUDA_VISIBLE_DEVICES": ids[i % gpus]}) for i in range(parallel)]
    cores = sorted(os.sched_getaffinity(0))
    share = max(1, len(cores) // parallel)
    slots = []
    for i in range(parallel):
        mine = [cores[(i * share + k) % len(cores)] for k in range(share)]
        threads = str(len(mine))
        slots.append(Slot(i, f"cpu {','.join(map(str, mine))}", {"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads,
                                                                  "CUDA_VISIBLE_DEVICES": ""}, mine))
    return slots


def machine_slot() -> Slot:
    """One slot holding the whole machine, for a job that spreads its own processes over it: a
    `train --nproc` launch shares the cores (and the GPUs) out among its workers itself."""
    return Slot(0, "this machine", {})


@dataclass(slots=True)
class Job:
    name: str
    argv: list[str]
    log: Path
    env: dict[str, str] = field(default_factory=dict)
    payload: object = None   # the caller's own record of what this job is


@dataclass(slots=True)
class Finished:
    job: Job
    slot: Slot
    returncode: int
    seconds: float

    def last_lines(self, n: int = 3) -> str:
        try:
            lines = [line for line in self.job.log.read_text(errors="replace").splitlines() if line.strip()]
        except OSError:
            return ""
        return " | ".join(lines[-n:])


def scaletrain_argv(*args: str) -> list[str]:
    """The command line of a scaletrain subcommand run as a child process (this interpreter's
    `-m scaletrain`, or SCALETRAIN_CHILD_COMMAND: distributed/env.py)."""
    return [*scaletrain_command(), *args]


def _child_setup(cpus: list[int] | None) -> Callable[[], None]:
    def setup() -> None:
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        except OSError:
            pass  # not Linux: orphans are possible if the parent is killed
        if cpus:
            os.sched_setaffinity(0, cpus)
    return setup


class SlotPool:
    """Runs jobs as processes, at most one per slot at a time."""

    def __init__(self, slots: list[Slot]):
        self.slots = slots
        self.free = list(slots)
        self.running: dict[subprocess.Popen, tuple[Job, Slot, float]] = {}

    @property
    def has_free_slot(self) -> bool:
        return bool(self.free)

    def start(self, job: Job) -> Slot:
        slot = self.free.pop(0)
        job.log.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **slot.env, **job.env}
        with job.log.open("w") as log:
            process = subprocess.Popen(job.argv, stdout=log, stderr=subprocess.STDOUT, env=env,
                                       preexec_fn=_child_setup(slot.cpus))
        self.running[process] = (job, slot, time.perf_counter())
        return slot

    def wait_any(self, poll_s: float = 0.2, idle: Callable[[], None] | None = None,
                 until: float | None = None) -> Finished | None:
        """Blocks until one running job ends; calls `idle` between polls (heartbeats). With `until`
        (a time.perf_counter() reading), returns None once it passes with every job still running."""
        if not self.running:
            raise RuntimeError("no job is running")
        while True:
            if until is not None and time.perf_counter() >= until:
                return None
            for process, (job, slot, t0) in list(self.running.items()):
                code = process.poll()
                if code is not None:
                    del self.running[process]
                    self.free.append(slot)
                    self.free.sort(key=lambda s: s.index)
                    return Finished(job, slot, code, time.perf_counter() - t0)
            if idle is not None:
                idle()
            time.sleep(poll_s)

    def run_all(self, jobs: list[Job], on_start: Callable[[Job, Slot], None] | None = None,
                on_done: Callable[[Finished], None] | None = None) -> list[Finished]:
        """Runs every job, in order, as slots free up."""
        queue, done = list(jobs), []
        try:
            while queue or self.running:
                while queue and self.has_free_slot:
                    job = queue.pop(0)
                    slot = self.start(job)
                    if on_start:
                        on_start(job, slot)
                if self.running:
                    finished = self.wait_any()
                    done.append(finished)
                    if on_done:
                        on_done(finished)
        finally:
            self.terminate()
        return done

    def terminate(self) -> None:
        """Stops every running job and frees its slot, so the pool can start the next one (a
        candidate stopped at its cap is followed by another)."""
        for process in list(self.running):
            process.terminate()
        for process in list(self.running):
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self.free.extend(slot for _, slot, _ in self.running.values())
        self.free.sort(key=lambda s: s.index)
        self.running.clear()
