"""glibc's malloc told to keep the step's freed memory for the next step (issue 96).

glibc serves a block above its mmap threshold with a fresh mmap and returns it to the OS when it
is freed, and trims the heap's top past its trim threshold; both thresholds start at 128 KiB and
move with the process's history (a freed mmapped block raises them). A CPU training step allocates
and frees the same activation-sized blocks (a small GPT's are about a MiB) thousands of times,
and where the thresholds happen to sit low, every one is a new mapping whose pages fault in again,
zeroed. Measured on the 2-core EPYC (benchmarks/step_cost.py --case small-gpt --pair, 5 rounds
each, equal settings): scaletrain's epoch took 1.056x (1.001-1.074) a hand loop's as glibc left
it, and 0.986x (0.967-1.010) with both processes' thresholds fixed at 64 MiB and 1 GiB. So a
training process fixes them itself: blocks under 64 MiB come from the heap and stay there for
reuse, and the heap is trimmed only past 1 GiB free at its top. The environment's own
(MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_, GLIBC_TUNABLES) is the user's and kept.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

from scaletrain.training.defaults import Setting

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3     # glibc's mallopt parameters (malloc.h)
MMAP_THRESHOLD = 64 << 20
TRIM_THRESHOLD = 1 << 30
USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES")

_done: Setting | None = None


def keep_freed_memory() -> Setting:
    """Fixes glibc malloc's mmap and trim thresholds for this process (once); the setting as the
    run's start line states it."""
    global _done
    if _done is not None:
        return _done
    named = [name for name in USER_SETTINGS if os.environ.get(name)]
    if named:
        _done = Setting("malloc", "as the environment sets it", ", ".join(named))
        return _done
    libc = _glibc()
    if libc is None:
        _done = Setting("malloc", "as is", "auto: not glibc's")
        return _done
    ok = libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
    _done = (Setting("malloc", "freed blocks kept for reuse", "auto: glibc's mmap threshold 64 MiB and trim "
                                                              "threshold 1 GiB, MALLOC_MMAP_THRESHOLD_ sets your own")
             if ok else Setting("malloc", "as is", "auto: glibc refused the thresholds"))
    return _done


def _glibc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.gnu_get_libc_version  # noqa: B018 - glibc's own: musl and others have no mallopt thresholds
        return libc
    except (OSError, AttributeError):
        return None


def release_freed_memory() -> None:
    """What a process freed handed back to the OS (the probe's copies, before the run's own
    build): their garbage collected, then glibc's `malloc_trim`, which returns the heap's free
    top and the free pages inside it, so the run's own blocks are laid out afresh rather than in
    the gaps the copies left."""
    import gc
    gc.collect()
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)
