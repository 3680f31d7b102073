"""SIGTERM and Ctrl-C end a command at any moment, even one blocked inside C++.

Python runs a signal's handler only when the main thread next executes Python code. A process
blocked in a collective whose peer hangs (gloo waits up to `--step-timeout-s`, `--init-timeout-s`
before the first step) or in a store connect would ignore both until then, and its launcher or
scheduler would have to SIGKILL it, leaving its run "running". So, while a run trains, a watcher
thread learns of each signal at the C level (`signal.set_wakeup_fd`); where the handler has not run
within STUCK_S (the main thread is stuck in C++), it records the run as interrupted through the
run's last words, prints the command's one line and ends the process with 128 + the signal.
The main thread may come back from C++ while those words are being written (the collective ends
as its peer exits): its way out waits for them (`disarm`), so the process never ends half-way
through writing the run's status (a killed launcher's run read "running" under load).

A run's ending (`finishing`) is not cut short by a second stop either: one that arrives while
the run records how it ended is raised once that record is written. A killed launcher's workers
get SIGTERM up to once for each of its threads (the kernel sends the parent-death signal each time
a dying thread hands its children to the next), and a second one, 50 ms after the first, landed
in the chief's write of run.json and left the run "running" (3 whole-suite runs in 5).
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import os
import signal
import sys
import threading
import time
from collections.abc import Callable

from scaletrain.errors import Terminated

STUCK_S = 3.0          # a handler that has not run by then never will, until the C++ call returns
RECEIVED: list[int] = []   # the stop signals whose Python handler ran, in order
_TAKEN = [0]               # how many of them reached the command's own `except` (taken), or came before it
_deferred: list[int] | None = None   # inside `finishing`: the stops that arrived there


def end_daemonic_children() -> None:
    """What Python's own exit does for multiprocessing (its atexit hook ends daemonic children),
    for a process about to leave through os._exit, which skips it: a DataLoader's worker processes
    end with their process. A worker hung in a user's read never checks on its parent (it looks
    only while waiting for work), so a rank that left without this kept two orphans asleep in
    the read forever (a killed launcher's job, stopped while its first steps ran)."""
    import multiprocessing

    children = [child for child in multiprocessing.active_children() if child.daemon]
    if children:
        # A DataLoader watches its workers through SIGCHLD, and its handler raises "worker killed by
        # signal" at the next line of Python: ended on purpose here, they are no failure. (Only the
        # main thread may set a handler; the stop watch ends the process before that thread runs
        # Python again.)
        with contextlib.suppress(ValueError):
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for child in children:
        child.kill()
    for child in children:
        child.join(timeout=1.0)


def on_stop_signal(signum, frame) -> None:
    """SIGINT and SIGTERM: remembered, then raised as KeyboardInterrupt/Terminated (inside
    `finishing`, once it ends)."""
    RECEIVED.append(signum)
    if _deferred is not None:
        _deferred.append(signum)
        return
    _raise_stop(signum)


def _raise_stop(signum: int) -> None:
    raise KeyboardInterrupt() if signum == signal.SIGINT else Terminated()


# A stop raised by the handler can still be swallowed: it is raised at whatever Python line runs
# next, and C code that clears the Python error it meets loses it (1 start in 30 here: a SIGTERM
# landing while `import torch` ran torch._C's initialisation trained the run to the end, exit 0).
# So a stop is remembered until the command takes it (`taken`), and a run checks at its moments
# (StopGuard: each step, each epoch, before its end is recorded) whether one is still owed.


def begin_command() -> None:
    """A command starts: stops that came before it are not its own."""
    _TAKEN[0] = len(RECEIVED)


def taken() -> None:
    """The command's own `except` caught the stop: nothing is owed."""
    _TAKEN[0] = len(RECEIVED)


def owed() -> int | None:
    """The stop signal that arrived and was never taken (swallowed on its way), or None."""
    return RECEIVED[-1] if len(RECEIVED) > _TAKEN[0] and _deferred is None else None


def raise_if_owed() -> None:
    """Raises a stop that arrived and was swallowed, as it should have been raised then."""
    if len(RECEIVED) > _TAKEN[0] and _deferred is None:
        _raise_stop(RECEIVED[-1])


class StopGuard:
    """A callback that raises a swallowed stop at the run's next step or epoch (a list's length
    read a step: no cost), so a run never trains on past a signal it was sent."""

    def on_train_begin(self, trainer) -> None:
        raise_if_owed()

    def on_epoch_begin(self, trainer, epoch: int) -> None:
        raise_if_owed()

    def on_train_batch_begin(self, trainer, step: int) -> None:
        raise_if_owed()

    def on_train_end(self, trainer, logs) -> None:
        raise_if_owed()


# Modules whose first import runs C++ initialisation that calls back into Python: a stop raised by
# the handler there is thrown through C++ that cannot pass it on, and the process aborts (SIGABRT,
# "terminate called after throwing an instance of 'pybind11::error_already_set'": a SIGINT landing
# in torch._C._c10d_init as `import torch` ran, 1 cold start in 30 beside the suite).
HELD_IMPORTS = {"torch"}


class _HeldLoader(importlib.abc.Loader):
    """The module's own loader, its execution inside `finishing`: a stop that arrives is raised
    once the module has loaded."""

    def __init__(self, loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        with finishing():
            self.loader.exec_module(module)


class _HoldStopsWhileLoading(importlib.abc.MetaPathFinder):
    """Finds the modules of HELD_IMPORTS as the path finder does, with a `_HeldLoader`."""

    def find_spec(self, name, path, target=None):
        if name not in HELD_IMPORTS:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        if spec is not None and spec.loader is not None:
            spec.loader = _HeldLoader(spec.loader)
        return spec


def hold_stops_while_loading() -> None:
    """Installs the finder (once; main() does, with its handlers): HELD_IMPORTS load whole."""
    if not any(isinstance(finder, _HoldStopsWhileLoading) for finder in sys.meta_path):
        sys.meta_path.insert(0, _HoldStopsWhileLoading())


@contextlib.contextmanager
def finishing():
    """A stop signal that arrives inside is raised as the block ends, not in the middle of it: the
    block records how a run ended, and a record cut short leaves it "running". A stop that
    arrived before the block is the caller's (it is what the block records). Signals reach the
    main thread only: elsewhere (a run in a thread of a user's program) the block changes nothing."""
    global _deferred
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    outer, _deferred = _deferred, []
    try:
        yield
    finally:
        arrived, _deferred = _deferred, outer
    if arrived and outer is None:
        _raise_stop(arrived[0])
    elif arrived:
        outer.extend(arrived)


class StopWatch:
    """Armed for the life of a run in a CLI process (where `on_stop_signal` is the handler)."""

    def __init__(self, last_words: Callable[[], None]):
        self.last_words = last_words
        self.read_fd, self.write_fd = os.pipe()
        os.set_blocking(self.write_fd, False)
        self.previous_fd = signal.set_wakeup_fd(self.write_fd, warn_on_full_buffer=False)
        self.armed = True
        self._speaking = threading.Lock()   # held while the last words are written
        threading.Thread(target=self._watch, name="scaletrain-stop-watch", daemon=True).start()

    @classmethod
    def arm(cls, last_words: Callable[[], None]) -> StopWatch | None:
        """A watcher, where this is the main thread of a process whose stop handler is ours."""
        if threading.current_thread() is not threading.main_thread() \
                or signal.getsignal(signal.SIGTERM) is not on_stop_signal:
            return None
        return cls(last_words)

    def disarm(self) -> None:
        # Waits for last words in flight: the watcher ends the process once they are written.
        with self._speaking:
            if self.armed:
                self.armed = False
                signal.set_wakeup_fd(self.previous_fd)
                os.close(self.write_fd)   # the watcher's read ends

    def _watch(self) -> None:
        while True:
            try:
                data = os.read(self.read_fd, 1)
            except OSError:
                return
            if not data:
                os.close(self.read_fd)
                return
            signum = data[0]
            if signum not in (signal.SIGTERM, signal.SIGINT):
                continue
            handled = len(RECEIVED)
            deadline = time.monotonic() + STUCK_S
            while time.monotonic() < deadline and len(RECEIVED) == handled and self.armed:
                time.sleep(0.05)
            with self._speaking:
                if len(RECEIVED) > handled or not self.armed:
                    continue          # the main thread took it: its own clean-up runs
                try:
                    self.last_words()
                except BaseException:   # the process ends regardless; its record is best effort
                    pass
                word = "interrupted" if signum == signal.SIGINT else "terminated"
                print(f"scaletrain: {word}", file=sys.stderr, flush=True)
                end_daemonic_children()
                os._exit(128 + signum)   # still holding the lock: the main thread's way out waits
