"""The messages between parameter-server workers and servers: one vocabulary both sides speak.

c10d point-to-point sends float tensors. A request is a small header on HEADER_TAG, and a
gradient's payload (the receiving server's shard) follows as a second message on PAYLOAD_TAG:
a server receives the next header from any worker into one small buffer, then the payload from
that worker. A notice (a meeting, an epoch's end, a pull) is its header alone. (Until 2026-11-26
every request carried a shard-sized payload, zeros for a notice, so that one buffer could take any
message: each epoch's 4-5 notices per worker then cost as much link time as 4-5 steps' pushes, 6.6 s
an epoch at 8 workers over 1 Gbit/s, BENCHMARKS.md.)

    request  [kind, parameter version, lr, meetings, epoch, sender's rank]   (HEADER_TAG)
             meetings: how many meetings the worker has entered (server.py); a LOST notice puts
             (the lost worker's rank, how many more follow) in the version and lr slots
    payload  the gradient of the server's shard, for GRADIENT and SYNC_GRADIENT   (PAYLOAD_TAG)
    reply    [version, epoch over, 0, staleness (or DROPPED), 0, 0] + the server's parameters (tag 0)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

HEADER = 6
# Separate tags keep a payload from being matched to the server's posted receive for the next header.
HEADER_TAG = 1
PAYLOAD_TAG = 2

# Request kinds (floats: they travel in the header of a float tensor).
GRADIENT = 1.0        # apply this gradient (the run's mode: sync or async)
DONE = 2.0            # this worker has finished training
IDLE = 3.0            # this worker enters a meeting (a collective of the workers)
SAVE = 4.0            # ... a meeting that is a checkpoint save
LOAD = 5.0            # ... a meeting that is a checkpoint load
SYNC_GRADIENT = 6.0   # a gradient of an async run's sync warm-up (--sync-warmup-epochs)
EPOCH_END = 7.0       # this worker has finished its share of the epoch (backup workers)
PULL = 8.0            # send me your current parameters, apply nothing
LOST = 9.0            # from the chief: a worker died

DROPPED = -1.0        # the staleness slot of a reply whose gradient was not applied


@dataclass(frozen=True, slots=True)
class Request:
    kind: float
    version: int
    lr: float
    meetings: int
    epoch: int
    worker: int

    @property
    def carries_payload(self) -> bool:
        """Whether the request's payload (a gradient) follows it."""
        return self.kind in (GRADIENT, SYNC_GRADIENT)

    @property
    def lost(self) -> tuple[int, int]:
        """A LOST notice's (lost worker's rank, notices still to follow)."""
        return int(self.version), int(self.lr)


def request(kind: float, worker: int, *, version: float = 0, lr: float = 0.0, meetings: int = 0,
            epoch: int = 0) -> torch.Tensor:
    """A request's header, from worker rank `worker`."""
    return torch.tensor([kind, float(version), float(lr), float(meetings), float(epoch), float(worker)])


def read_request(header: torch.Tensor) -> Request:
    h = header[:HEADER].tolist()
    return Request(h[0], int(h[1]), h[2], int(h[3]), int(h[4]), int(h[5]))


@dataclass(frozen=True, slots=True)
class Reply:
    version: int
    epoch_over: bool
    staleness: float          # DROPPED: the gradient was not applied

    @property
    def dropped(self) -> bool:
        return self.staleness == DROPPED


def reply(version: int, staleness: float, epoch_over: bool, params: list[torch.Tensor]) -> torch.Tensor:
    header = torch.tensor([float(version), float(epoch_over), 0.0, staleness, 0.0, 0.0])
    return torch.cat([header] + [p.detach().reshape(-1) for p in params])


def read_reply(message: torch.Tensor) -> Reply:
    h = message[:HEADER].tolist()
    return Reply(int(h[0]), bool(h[1]), h[3])
