"""Denormal (subnormal) floats flushed to zero on every CPU thread that computes.

A float32 below 1.2e-38 is subnormal, and x86 cores handle arithmetic on one in microcode: up to
about 100x slower per operation. A model that converges can fill its gradients with them. On a
2-core Intel Xeon a 3.2 M-parameter sequence transformer (fp32, AdamW) slowed from 0.86 s to 7.7 s a
step once it converged, 14.6 % of its feed-forward gradients subnormal; flushing them made the
epoch 26 s instead of 246 s (issue 95). TensorFlow, XLA and JAX flush them on their CPU threads by
default; PyTorch does not (pytorch#67797). scaletrain does, unless `--no-flush-denormal`.

`torch.set_flush_denormal` sets the calling thread's MXCSR only (flush-to-zero and
denormals-are-zero): a parallel op's other OpenMP threads kept computing on subnormals (half of a
product of subnormals was flushed on 2 threads, measured here). A thread inherits the MXCSR of the
thread that creates it, so the threads OpenMP starts later get it from this one; those it already
started are set here, each from inside an OpenMP parallel region of every libgomp loaded (torch's,
and another a library brought: scikit-learn's wheels carry one).
Loader worker processes are left as they start.
"""

from __future__ import annotations

import ctypes
import os

import torch

from scaletrain.training.defaults import Setting


def flush_denormals(on: bool) -> Setting:
    """Flushes (or keeps, `on` False) subnormal floats on this thread and on every thread of torch's
    OpenMP pool; the setting as the run's start line states it."""
    if not torch.set_flush_denormal(on):
        return Setting("denormals", "kept", "this CPU cannot flush them (no SSE3)")
    reached = _on_every_openmp_thread(on)
    where = "this thread and torch's OpenMP threads" if reached else "this thread (no OpenMP pool to set)"
    if on:
        return Setting("denormals", "flushed", f"FTZ/DAZ on {where}; --no-flush-denormal keeps them")
    return Setting("denormals", "kept", None)


def _libgomps() -> list[ctypes.CDLL]:
    """Every libgomp in this process's memory map: torch's own, and any other a library brought
    (scikit-learn's wheels carry one), each with a thread pool of its own."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "libgomp" in line and line.split()[-1].startswith("/")}
    except OSError:
        return []
    found = []
    for path in sorted(paths):
        try:
            found.append(ctypes.CDLL(path))     # the same loaded library: dlopen counts a reference
        except OSError:
            continue
    return [lib for lib in found if hasattr(lib, "GOMP_parallel")]


_REGION = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


def _on_every_openmp_thread(on: bool) -> bool:
    """Runs `torch.set_flush_denormal(on)` once on every thread of an OpenMP team as large as any
    torch uses here, in every libgomp loaded (each reuses its pool's threads for later teams);
    False without one."""
    libraries = _libgomps() if "OpenMP" in torch.__config__.parallel_info() else []
    raised: list[BaseException] = []

    def set_mode(_data) -> None:
        # The calling thread is one of the team, and a stop signal's Python handler may run there:
        # raised inside a ctypes callback it would be printed as a traceback and swallowed, so it is
        # kept and raised once the region is over.
        try:
            torch.set_flush_denormal(on)
        except BaseException as exc:   # noqa: BLE001 - raised again below, on the caller's stack
            raised.append(exc)
    region = _REGION(set_mode)
    team = max(torch.get_num_threads(), len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1)
    for gomp in libraries:
        gomp.GOMP_parallel(region, None, ctypes.c_uint(team), ctypes.c_uint(0))
    if raised:
        raise raised[0]
    return bool(libraries)
