"""How many CPU threads a run computes with, when it is not told: the cores other processes leave it.

torch's default is one intra-op thread per core, and OpenMP's threads wait for each other at the
end of every parallel region. On a core another process keeps busy, the thread sharing it is
descheduled for whole time slices and every region waits for it: the default recipe on the 2-core
CPU with one core busy ran 801 img/s on 2 threads against 2,161 on 1 (issue 64; BENCHMARKS.md,
"Threads under load"). So a run that names no thread count (--threads, or OMP_NUM_THREADS in its
environment, which torch reads) takes `cores - busy cores of other processes`, rounded, at least
one: measured over the process's start (torch's import gives a second or more of window) and
again over each epoch (`AdaptiveThreads`), so a load that comes or goes mid-run is followed at the
next epoch's start. A process pinned to one core (--devices on a CPU host) keeps its one thread.

Busy time is read from /proc/stat for the cores this process may run on, less this process's own
CPU time and its live children's (loader workers); where /proc/stat is missing (not Linux), torch's
default stands. Changing the thread count changes how some reductions are split, so float32
results can differ in the last bits between two runs that chose differently; `--threads N` pins it.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from scaletrain.errors import ConfigError
from scaletrain.training.defaults import Setting

MIN_WINDOW_S = 0.2   # a shorter window reads /proc/stat's 10 ms ticks too coarsely; wait this long


@dataclass(frozen=True, slots=True)
class CpuSample:
    wall: float      # time.monotonic()
    busy: float      # busy seconds of the cores this process may use, since boot
    own: float       # CPU seconds of this process and its children (live and ended)


def usable_cores() -> list[int]:
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))


def _busy_seconds(cores: list[int], stat: str = "/proc/stat") -> float | None:
    try:
        with open(stat) as fh:
            lines = fh.read().splitlines()
    except OSError:
        return None
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    wanted, busy = {f"cpu{c}" for c in cores}, 0
    for line in lines:
        name, *fields = line.split()
        if name in wanted:
            # user nice system idle iowait irq softirq steal (guest time is inside user already)
            values = [int(v) for v in fields[:8]]
            busy += sum(values) - values[3] - values[4]
    return busy / tick


def _own_seconds() -> float:
    import psutil
    me = psutil.Process()
    t = me.cpu_times()
    own = t.user + t.system + t.children_user + t.children_system
    for child in me.children(recursive=True):
        try:
            c = child.cpu_times()
            own += c.user + c.system
        except psutil.Error:   # ended between the listing and the read
            pass
    return own


def sample_cpu(cores: list[int] | None = None) -> CpuSample | None:
    busy = _busy_seconds(cores if cores is not None else usable_cores())
    return None if busy is None else CpuSample(time.monotonic(), busy, _own_seconds())


def others_busy(before: CpuSample, after: CpuSample) -> float:
    """Cores' worth of other processes' work between two samples (0 when idle)."""
    wall = max(after.wall - before.wall, 1e-9)
    return max(0.0, ((after.busy - before.busy) - (after.own - before.own)) / wall)


def threads_for(cores: int, busy_elsewhere: float) -> int:
    """The cores left over, rounded half up, at least one."""
    return max(1, min(cores, int(cores - busy_elsewhere + 0.5)))


# The process's first sample: taken by the CLI before it imports torch (`mark_start`), so the
# choice costs no waiting: importing torch gives a window of a second or more.
_START: CpuSample | None = None


def mark_start() -> None:
    global _START
    _START = sample_cpu()


def wait_policy() -> Setting:
    """OpenMP's wait policy, which the start line states beside the thread count. scaletrain leaves
    it as the environment has it: libgomp's default spins a while at a barrier before sleeping, and
    PASSIVE (sleep at once) cost the default recipe a third of its quiet speed on the 2-core CPU
    (0.66x, BENCHMARKS.md "Threads under load"), where choosing the thread count from the load
    already keeps a loaded core out of the barriers."""
    given = os.environ.get("OMP_WAIT_POLICY", "").strip()
    return Setting("OpenMP wait", given.lower() if given else "spin, then sleep",
                   "OMP_WAIT_POLICY" if given else None)


@dataclass(frozen=True, slots=True)
class ThreadChoice:
    setting: Setting
    adaptive: bool = False     # chosen from the load: follow it epoch by epoch (AdaptiveThreads)
    note: str | None = None    # a count named above the cores: said at the run's start


def check_omp_num_threads(environ=os.environ) -> None:
    """OMP_NUM_THREADS, checked as torchrun's variables are, before torch (libgomp) reads it: a
    value that is not a whole number >= 1 is one line, not libgomp's "Invalid value" and a run
    recorded as following it."""
    text = environ.get("OMP_NUM_THREADS", "").strip()
    if text and not (text.isdigit() and int(text) >= 1):
        raise ConfigError(f"OMP_NUM_THREADS={text!r} is not a whole number of threads >= 1 (it sets every OpenMP "
                          "library's threads: torch's, NumPy's); set it to a count, or unset it for scaletrain to "
                          "choose from the load")


def _above_cores(count: int, source: str) -> str | None:
    cores = len(usable_cores())
    if count <= cores:
        return None
    return (f"{source} asks for {count} threads on {cores} usable core(s): threads beyond the cores only wait on "
            "one another, which makes each step slower")


def choose_threads(given: int | None, pinned: bool = False) -> ThreadChoice:
    """The intra-op thread count for a run: `given` (--threads), OMP_NUM_THREADS, one for a process
    pinned to a core, else the cores other processes leave, measured since `mark_start` (or over
    MIN_WINDOW_S now). Applies it (torch.set_num_threads)."""
    import torch
    if given is not None:
        torch.set_num_threads(given)
        return ThreadChoice(Setting("threads", given, None), note=_above_cores(given, f"--threads {given}"))
    if pinned:
        return ThreadChoice(Setting("threads", torch.get_num_threads(), "--devices pins this process to one core"))
    env = os.environ.get("OMP_NUM_THREADS", "").strip()
    if env:
        running = torch.get_num_threads()
        capped = f", capped at {running} by torch" if int(env) != running else ""
        return ThreadChoice(Setting("threads", running, f"OMP_NUM_THREADS={env}{capped}"),
                            note=_above_cores(int(env), f"OMP_NUM_THREADS={env}"))
    cores = usable_cores()
    before = _START if _START is not None and time.monotonic() - _START.wall >= MIN_WINDOW_S else None
    if before is None:
        before = sample_cpu(cores)
        time.sleep(MIN_WINDOW_S)
    after = sample_cpu(cores)
    if before is None or after is None:
        return ThreadChoice(Setting("threads", torch.get_num_threads(),
                                    "torch's default: no /proc/stat here to read the load from"))
    busy = others_busy(before, after)
    threads = threads_for(len(cores), busy)
    torch.set_num_threads(threads)
    return ThreadChoice(Setting("threads", threads, f"auto: {len(cores)} core(s), {busy:.1f} busy with other work, "
                                                    "followed each epoch; --threads N sets it"), adaptive=True)


class AdaptiveThreads:
    """Callback: at each epoch's end, the thread count for the next one from the load measured over
    this one (the run's own work, loader workers included, is not load). Added where the count was
    chosen automatically; the epoch's logs record the count it ran with."""

    def __init__(self, threads: int):
        self.threads = threads
        self.cores = usable_cores()
        self._begin: CpuSample | None = None

    def on_epoch_begin(self, trainer, epoch: int) -> None:
        self._begin = sample_cpu(self.cores)

    def on_epoch_end(self, trainer, epoch: int, logs: dict) -> None:
        logs["threads"] = self.threads
        end = sample_cpu(self.cores)
        if self._begin is None or end is None or end.wall - self._begin.wall < MIN_WINDOW_S:
            return
        wanted = threads_for(len(self.cores), others_busy(self._begin, end))
        if wanted != self.threads:
            import torch
            torch.set_num_threads(wanted)
            self.threads = wanted
