"""The messages between parameter-server workers and servers: one vocabulary both sides speak.

c10d point-to-point sends float tensors. Every request travels on REQUEST_TAG as one message: a
gradient is its header followed by the gradient of the receiving server's shard; a notice (a
meeting, an epoch's end, a pull) is its header alone. A server receives any request into one
buffer of header + shard size: gloo's tcp transport takes a message shorter than the posted
receive (it refuses only a longer one, gloo/transport/tcp/pair.cc), and the header's kind says
whether a gradient follows it. History (BENCHMARKS.md): until 2026-11-26 every notice was padded
with a shard of zeros, so each epoch's 4-5 notices per worker cost as much link time as 4-5
pushes (6.6 s an epoch at 8 workers over 1 Gbit/s); then, for one day, a gradient was a header
and a payload sent apart, and each push's second hand-over cost a small model ~1 ms a step.

    request  [kind, parameter version, lr, meetings, epoch, sender's rank] (+ the gradient)   (REQUEST_TAG)
             meetings: how many meetings the worker has entered (server.py); a LOST notice puts
             (the lost worker's rank, how many more follow) in the version and lr slots
    reply    [version, epoch over, 0, staleness (or DROPPED), 0, 0] + the server's parameters (tag 0)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

HEADER = 6
# Its own tag keeps a request from being matched to another receive (the replies and the initial
# parameters travel on tag 0).
REQUEST_TAG = 1

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

CARRY_GRADIENT = (GRADIENT, SYNC_GRADIENT)   # the kinds whose header a gradient follows


@dataclass(frozen=True, slots=True)
class Request:
    kind: float
    version: int
    lr: float
    meetings: int
    epoch: int
    worker: int

    @property
    def carries_gradient(self) -> bool:
        """Whether a gradient follows the header in the request's message."""
        return self.kind in CARRY_GRADIENT

    @property
    def lost(self) -> tuple[int, int]:
        """A LOST notice's (lost worker's rank, notices still to follow)."""
        return int(self.version), int(self.lr)


def request(kind: float, worker: int, *, version: float = 0, lr: float = 0.0, meetings: int = 0,
            epoch: int = 0, gradient: list[torch.Tensor] | None = None) -> torch.Tensor:
    """A request's message from worker rank `worker`: its header, then `gradient`'s tensors flat
    (GRADIENT and SYNC_GRADIENT only)."""
    header = torch.tensor([kind, float(version), float(lr), float(meetings), float(epoch), float(worker)])
    if (gradient is not None) != (kind in CARRY_GRADIENT):
        raise ValueError(f"request kind {kind}: a gradient goes with GRADIENT and SYNC_GRADIENT only")
    return header if gradient is None else torch.cat([header] + [g.detach().reshape(-1) for g in gradient])


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
