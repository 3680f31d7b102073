"""Who is still there: the roll call the parameter-server workers take when a collective among
them fails (a worker died), through the job's own c10d store.

Every live worker signs in under the round's prefix; the chief waits up to `wait_s` for all the
current members, then publishes who signed in, and every survivor takes that list. The chief's
death is not survivable (it holds the run and, in a cluster, the store).
"""

from __future__ import annotations

import json
import time

import torch.distributed as dist


def default_store() -> dist.Store:
    from torch.distributed.distributed_c10d import _get_default_store
    return _get_default_store()


def roll_call(store: dist.Store, round_: int, rank: int, members: list[int], chief: int, wait_s: float) -> list[int]:
    """The members present at roll call number `round_` (the same list on every survivor)."""
    prefix = f"scaletrain/ps/rollcall/{round_}"
    store.set(f"{prefix}/{rank}", "1")
    if rank != chief:
        return json.loads(store.get(f"{prefix}/members"))   # blocks until the chief publishes
    deadline = time.monotonic() + wait_s
    while True:
        present = [m for m in members if store.check([f"{prefix}/{m}"])]
        if len(present) == len(members) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    store.set(f"{prefix}/members", json.dumps(present))
    return present
