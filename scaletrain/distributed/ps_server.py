"""One parameter server: a shard of the parameters and its optimizer state, and the loop that
applies the workers' gradients (strategies/parameter_server.py describes the protocol)."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

HEADER = 4
GRADIENT, DONE, IDLE = 1.0, 2.0, 3.0   # IDLE: a worker waits at a collective of the workers (evaluation)
DROPPED = -1.0     # the staleness slot of a reply whose gradient was not applied


class Server:
    def __init__(self, config, optim_config, shapes: list[tuple[int, ...]], workers: int):
        from scaletrain.optim import build_optimizer
        self.config, self.workers = config, workers
        self.params = [nn.Parameter(torch.zeros(shape)) for shape in shapes]
        self.size = sum(p.numel() for p in self.params)
        self.optimizer = build_optimizer(optim_config, None, torch.device("cpu"), params=self.params)
        self._buffer = torch.empty(self.size)
        self.version = 0
        self.applied = self.dropped = 0
        self.staleness: list[int] = []

    def flat_params(self) -> torch.Tensor:
        return self._buffer

    @torch.no_grad()
    def load_initial(self) -> None:
        self._scatter(self._buffer, into_grads=False)

    @torch.no_grad()
    def _scatter(self, flat: torch.Tensor, into_grads: bool) -> None:
        offset = 0
        for p in self.params:
            piece = flat[offset:offset + p.numel()].view_as(p)
            if into_grads:
                p.grad = piece.clone()
            else:
                p.copy_(piece)
            offset += p.numel()

    def _apply(self, gradient: torch.Tensor, lr: float) -> None:
        self._scatter(gradient, into_grads=True)
        for group in self.optimizer.param_groups:
            group["lr"].fill_(lr)
        self.optimizer.step()
        self.version += 1
        self.applied += 1

    def _reply(self, worker: int, staleness: float) -> None:
        header = torch.tensor([float(self.version), 0.0, 0.0, staleness])
        dist.send(torch.cat([header] + [p.detach().reshape(-1) for p in self.params]), dst=worker)

    def run(self) -> dict:
        message = torch.empty(HEADER + self.size)
        active, idle = set(range(self.workers)), set()
        pending: dict[int, tuple[torch.Tensor, float]] = {}    # sync: this step's gradients, by worker
        mode, backups = self.config.ps_mode, self.config.backup_workers
        while active:
            worker = dist.recv(message)
            kind, version, lr = float(message[0]), int(message[1]), float(message[2])
            if kind == DONE:
                active.discard(worker)
            elif kind == IDLE:
                idle.add(worker)
                if idle >= active:   # everyone has met: after the collective they all push again
                    idle.clear()
            else:
                idle.discard(worker)
                self._receive(worker, version, lr, message, pending)
            # Sync: a step needs one gradient from each working worker, less the backups; a worker
            # that is done, or waiting for the others at a collective of the workers, is not waited for.
            working = len(active - idle)
            if mode == "sync" and pending and len(pending) >= min(self.workers - backups, max(working, 1)):
                # In worker order, so the sum is the same whatever order the messages came in.
                ranks = sorted(pending)
                average = torch.stack([pending[w][0] for w in ranks]).sum(0) / len(ranks)
                self._apply(average, pending[ranks[0]][1])
                for w in ranks:
                    self._reply(w, 0.0)
                pending.clear()
        return {"applied": self.applied, "dropped": self.dropped, "staleness": self.staleness}

    def _receive(self, worker: int, version: int, lr: float, message: torch.Tensor, pending: dict) -> None:
        if self.config.ps_mode == "async":
            staleness = self.version - version
            if self.config.max_staleness is not None and staleness > self.config.max_staleness:
                self.dropped += 1
                self._reply(worker, DROPPED)
                return
            self.staleness.append(staleness)
            self._apply(message[HEADER:], lr / (1 + staleness) if self.config.stale_lr else lr)
            self._reply(worker, float(staleness))
        elif version < self.version:      # sync: computed on an older version, a late gradient
            self.dropped += 1
            self._reply(worker, DROPPED)
        else:
            pending[worker] = (message[HEADER:].clone(), lr)
