"""The order in which `make test` hands the suite to its two pytest-xdist workers, and where its
time went.

`make test` runs the tests (tests/) and every command of the docs (doctests/) in one session, on
two workers, under `--dist loadscope --no-loadscope-reorder`: a scope (a test file, or one doc
workspace: a test class in doctests/) runs whole on one worker, and the scopes are handed out in
collection order. This hook puts the longest scopes first, so that the two workers end together:
run as two sessions, each left one worker idle for its last minutes.

The lengths are measured, not kept by hand: every session sums each scope's test phases and
prints the longest at its end; `make test` (SCALETRAIN_SCOPE_SECONDS names the file) writes them
into pytest's cache folder (.pytest_cache/scope_seconds.json, never committed), which the next
session in this checkout orders by. A fresh clone (CI's) starts from tests/scope_seconds.json, a
committed copy of one machine's figures, refreshed by hand when the order drifts far. A scope in
neither (a new file) starts after those that are, in collection order; a stale figure costs
balance, never a result.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path

import pytest

from tests.processes import starting_processes

SEED = Path(__file__).parent / "tests" / "scope_seconds.json"           # committed: a fresh clone's order
MEASURED = Path(__file__).parent / ".pytest_cache" / "scope_seconds.json"  # this checkout's last make test
SHOWN = 15     # the longest scopes the end of a session lists


def _measured() -> dict[str, float]:
    for path in (MEASURED, SEED):
        try:
            return {str(k): float(v) for k, v in json.loads(path.read_text()).items()}
        except (OSError, ValueError, AttributeError):
            continue
    return {}


SCOPE_SECONDS = _measured()
_took: dict[str, float] = defaultdict(float)


def scope(item: pytest.Item) -> str:
    """The scope `--dist loadscope` keeps on one worker: the test's class, else its file."""
    return item.nodeid.rsplit("::", 1)[0]


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: -SCOPE_SECONDS.get(scope(item), 0))   # stable: a scope keeps its order


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    # On the controller (xdist hands it every worker's reports) or a session without workers.
    _took[report.nodeid.rsplit("::", 1)[0]] += report.duration


def pytest_terminal_summary(terminalreporter, config) -> None:
    if hasattr(config, "workerinput") or not _took:
        return
    longest = sorted(_took.items(), key=lambda kv: -kv[1])
    total = sum(_took.values())
    terminalreporter.write_sep("-", f"where the time went: {total / 60:.1f} min of test phases over "
                                    f"{len(_took)} scopes, the longest {min(SHOWN, len(longest))}")
    for name, seconds in longest[:SHOWN]:
        terminalreporter.write_line(f"{seconds:8.1f} s  {name}")
    record = os.environ.get("SCALETRAIN_SCOPE_SECONDS")
    if record:   # the scopes this session ran replace their figures; the others keep theirs
        merged = {**_measured(), **{name: round(seconds, 1) for name, seconds in _took.items()}}
        Path(record).parent.mkdir(parents=True, exist_ok=True)
        Path(record).write_text(json.dumps(dict(sorted(merged.items(), key=lambda kv: -kv[1])), indent=1) + "\n")


# -- each worker's share of the cores ---------------------------------------------------------------

_GIVEN_THREADS = os.environ.get("OMP_NUM_THREADS")   # the caller's, before any conftest defaults it


def pytest_configure(config) -> None:
    """On the controller, before pytest-xdist starts its workers: each computes on its share of the
    cores (one each for `make check`'s and `make test`'s two on two cores), in the environment the
    workers start with, so OpenMP, torch and numpy's OpenBLAS read it as they load. torch's default,
    a thread per core in every worker, left each worker's threads spinning on the other's cores:
    `make check`'s tests took 75-101 s against 44-56 s on one thread each (2026-12-03, the Xeon with
    AVX-512, runs side by side). tests/conftest.py keeps the count for every in-process run; a test
    of the choice itself sets its own."""
    workers = getattr(config.option, "numprocesses", None)
    if _GIVEN_THREADS is None and not hasattr(config, "workerinput") and isinstance(workers, int) and workers > 1:
        # (set, not defaulted: tests/conftest.py, an initial conftest, has defaulted it here already)
        os.environ["OMP_NUM_THREADS"] = str(max(1, len(os.sched_getaffinity(0)) // workers))


# -- the `processes` tier, by construction ---------------------------------------------------------

@pytest.fixture
def processes() -> None:
    """Taken by every test that starts a process (the real CLI, torchrun, a server, a benchmark):
    the declaration is the whole of it. It marks the test `processes` (`make check` leaves those
    out); a test without it that starts one fails at the attempt (tests/processes.py)."""


def _declares_processes(item: pytest.Item) -> bool:
    """The `processes` fixture, or (for one parameter of a test) `pytest.param(..., marks=pytest.mark.processes)`."""
    return "processes" in getattr(item, "fixturenames", ()) or item.get_closest_marker("processes") is not None


def pytest_itemcollected(item: pytest.Item) -> None:
    """The tier follows from the declaration, marked as each test is collected (before `-m` selects)."""
    if _declares_processes(item):
        item.add_marker(pytest.mark.processes)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem):
    # Setup to teardown: a module's fixture that starts a server runs inside its first test's setup.
    with starting_processes(_declares_processes(item)):
        yield
