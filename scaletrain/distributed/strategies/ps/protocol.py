"""The messages between parameter-server workers and servers: one vocabulary both sides speak.

Every message is one float tensor (c10d point-to-point sends tensors): a header, then a payload of
the receiving server's shard size (gradients, or nothing for a notice), so a server receives any
message into one buffer.

    request  [kind, parameter version, lr, meetings, epoch] + payload
             meetings: how many meetings the worker has entered (server.py); a LOST notice puts
             (the lost worker's rank, how many more follow) in the version and lr slots
    reply    [version, epoch over, 0, staleness (or DROPPED), 0] + the server's parameters
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

HEADER = 5

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

    @property
    def lost(self) -> tuple[int, int]:
        """A LOST notice's (lost worker's rank, notices still to follow)."""
        return int(self.version), int(self.lr)


def request(kind: float, payload: torch.Tensor | int, *, version: float = 0, lr: float = 0.0, meetings: int = 0,
            epoch: int = 0) -> torch.Tensor:
    """A request: the header and `payload` (a tensor, or that many zeros for a notice)."""
    header = torch.tensor([kind, float(version), float(lr), float(meetings), float(epoch)])
    if isinstance(payload, int):
        return torch.cat([header, torch.zeros(payload)])
    return torch.cat([header, payload])


def read_request(message: torch.Tensor) -> Request:
    h = message[:HEADER].tolist()
    return Request(h[0], int(h[1]), h[2], int(h[3]), int(h[4]))


@dataclass(frozen=True, slots=True)
class Reply:
    version: int
    epoch_over: bool
    staleness: float          # DROPPED: the gradient was not applied

    @property
    def dropped(self) -> bool:
        return self.staleness == DROPPED


def reply(version: int, staleness: float, epoch_over: bool, params: list[torch.Tensor]) -> torch.Tensor:
    header = torch.tensor([float(version), float(epoch_over), 0.0, staleness, 0.0])
    return torch.cat([header] + [p.detach().reshape(-1) for p in params])


def read_reply(message: torch.Tensor) -> Reply:
    h = message[:HEADER].tolist()
    return Reply(int(h[0]), bool(h[1]), h[3])
