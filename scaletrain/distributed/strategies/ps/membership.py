"""Who is still there: how parameter-server workers notice a dead worker without waiting on it.

A gloo collective with a dead member does not fail promptly on every rank (a rank whose ring
neighbours are alive can wait for ever), so the workers never find out *in* a collective. Before
each collective of theirs, in the modes that go on without a worker (async, backups), they take a
roll call through the job's c10d store: every live worker signs in, and the chief waits until each
member has either signed in or gone silent. Each worker beats a heartbeat into the store from a
background thread; a member whose heartbeat has not moved for `silent_s` seconds is dead. The
chief publishes who signed in and every survivor takes that list, so the collective that follows
runs only over members known to be alive. The chief's death is not survivable (it holds the run,
and in a cluster the store).
"""

from __future__ import annotations

import datetime
import json
import os
import threading
import time

import torch.distributed as dist


def store_client(timeout_s: float) -> dist.Store:
    """A client of the job's TCPStore (the rendezvous at MASTER_ADDR:MASTER_PORT)."""
    return dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                         timeout=datetime.timedelta(seconds=timeout_s))


class Heartbeat:
    """Counts up under `<prefix>/beat/<rank>` every `every_s` seconds, from a daemon thread with
    its own store connection, until `stop()` or the process dies."""

    def __init__(self, prefix: str, rank: int, timeout_s: float, every_s: float = 0.5):
        self._key, self._every = f"{prefix}/beat/{rank}", every_s
        self._store = store_client(timeout_s)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="scaletrain-heartbeat", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        beat = 0
        while not self._stop.is_set():
            beat += 1
            try:
                self._store.set(self._key, str(beat))
            except RuntimeError:   # the store's host (the chief) is gone: the job is over anyway
                return
            self._stop.wait(self._every)

    def stop(self) -> None:
        self._stop.set()


def roll_call(store: dist.Store, prefix: str, round_: int, rank: int, members: list[int], chief: int,
              silent_s: float) -> list[int]:
    """The members present at roll call `round_` (the same list on every survivor): each signs
    in; the chief decides once every member has signed in or its heartbeat has been still for
    `silent_s` seconds."""
    here = f"{prefix}/roll/{round_}"
    store.set(f"{here}/{rank}", "1")
    if rank != chief:
        return json.loads(store.get(f"{here}/members"))      # blocks until the chief publishes
    beats: dict[int, tuple[bytes | None, float]] = {}
    while True:
        signed = [m for m in members if store.check([f"{here}/{m}"])]
        missing = [m for m in members if m not in signed]
        if not missing:
            break
        now = time.monotonic()
        for m in missing:
            beat = store.get(f"{prefix}/beat/{m}") if store.check([f"{prefix}/beat/{m}"]) else None
            if m not in beats or beats[m][0] != beat:
                beats[m] = (beat, now)
        if all(now - beats[m][1] > silent_s for m in missing):
            break
        time.sleep(0.005)
    store.set(f"{here}/members", json.dumps(signed))
    return signed
