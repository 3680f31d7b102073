"""One parameter server: a shard of the parameters and its optimizer state, and the loop that
applies the workers' gradients (strategy.py describes the modes, protocol.py the messages).

A *meeting* is a point every worker reaches at the same step: a collective of the workers (the
epoch's metrics, evaluation) or a checkpoint. Before one a worker tells every server, so a sync
step does not wait for a worker that is waiting for the others. Meeting counts, not arrival
order, decide who is waiting: a gradient sent after meeting k proves meeting k is over (every
worker had entered it), even when it arrives before a slower worker's notice of meeting k.

With backup workers an epoch ends once all but B workers have finished their share: the others'
gradients of that epoch are dropped from then on, and their replies say the epoch is over, so a
slow worker stops where it is instead of making everyone wait at the epoch's end.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn

from scaletrain.checkpoint.safe_reader import SafeFileSystemReader, SafeLoadPlanner
from scaletrain.distributed.strategies.ps.protocol import (
    DONE,
    DROPPED,
    EPOCH_END,
    HEADER,
    IDLE,
    LOST,
    PULL,
    REQUEST_TAG,
    SAVE,
    SYNC_GRADIENT,
    Request,
    read_request,
    reply,
)


class Inbox:
    """Requests from any worker, into two buffers of header + shard size in turn: the next
    request's receive is posted (into the other buffer) while this one is handled. gloo hands a
    message over only once its receiver has said it is ready, one trip across the link; posted
    early, that trip happens while the server works, not while the worker waits."""

    def __init__(self, shard_size: int, survives_lost_workers: bool):
        self.survives_lost_workers = survives_lost_workers
        self._buffers = [torch.empty(HEADER + shard_size) for _ in range(2)]
        self._next = 0          # the buffer the next request arrives in
        self._posted = None

    def post(self) -> None:
        """Posts the receive of the next request (call it only while a worker may still send one:
        a receive left posted at the end would wait forever)."""
        if self._posted is None:
            self._posted = dist.irecv(self._buffers[self._next], tag=REQUEST_TAG)     # from any worker

    def take(self) -> tuple[Request, torch.Tensor]:
        """The next request and its gradient (a view into the buffer it came in, valid until the next
        take(); meaningful only where the request carries one). Where workers may die, a
        connection reset by a dead one is skipped: gloo goes on receiving from the others."""
        failures = 0
        while True:
            self.post()
            try:
                self._posted.wait()
                break
            except RuntimeError:
                self._posted = None
                failures += 1
                if not self.survives_lost_workers or failures >= 1000:
                    raise
        self._posted = None
        message = self._buffers[self._next]
        self._next = 1 - self._next
        return read_request(message), message[HEADER:]


class Server:
    def __init__(self, options, optim_config, names: list[str], shapes: list[tuple[int, ...]], workers: int):
        """`options`: the run's [distributed.ps] table (options.py)."""
        from scaletrain.optim import build_optimizer
        self.options, self.workers, self.names = options, workers, names
        self.params = [nn.Parameter(torch.zeros(shape)) for shape in shapes]
        self.size = sum(p.numel() for p in self.params)
        self.optimizer = build_optimizer(optim_config, None, torch.device("cpu"), params=self.params)
        self._buffer = torch.empty(self.size)
        self.version = 0
        self.applied = self.dropped = 0
        self.staleness: list[int] = []
        self.group = None     # the live workers and the servers, once a worker is lost (else the default)

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

    def _reply(self, worker: int, staleness: float, epoch_over: bool = False) -> None:
        try:
            dist.send(reply(self.version, staleness, epoch_over, self.params), dst=worker)
        except RuntimeError:
            if not self.options.survives_lost_workers:
                raise
            # That worker is dead (gloo: its connection closed). The others go on; the chief tells
            # us who is gone once the workers' roll call has settled it (LOST).

    # -- checkpoints: the servers write and read their shard beside the workers' state
    def state_dict(self) -> dict:
        """This shard in the trainer's checkpoint layout (training/state.py): weights under
        "model", optimizer state under "optimizer" as "<name>/<key>"; DCP reshards by name, so a
        resume may use another number of servers."""
        optimizer = {}
        for name, p in zip(self.names, self.params, strict=True):
            for key, value in self.optimizer.state.get(p, {}).items():
                if isinstance(value, torch.Tensor):
                    optimizer[f"{name}/{key}"] = value
        return {"model": dict(zip(self.names, self.params, strict=True)), "optimizer": optimizer}

    @torch.no_grad()
    def _create_optimizer_state(self) -> None:
        """A lazily built optimizer (AdamW) has no state to load into before its first step: take
        one with zero gradients and LR 0 (no change to any weight; the load then overwrites it)."""
        for p in self.params:
            p.grad = torch.zeros_like(p)
        for group in self.optimizer.param_groups:
            group["lr"].fill_(0.0)
        self.optimizer.step()

    def _checkpoint(self, kind: float) -> None:
        box = [None]
        dist.broadcast_object_list(box, src=0, group=self.group)     # the chief's path, on the group DCP uses
        if kind == SAVE:
            dcp.save(self.state_dict(), checkpoint_id=box[0], process_group=self.group)
        else:
            self._create_optimizer_state()
            dcp.load(self.state_dict(), storage_reader=SafeFileSystemReader(box[0]), planner=SafeLoadPlanner(),
                     process_group=self.group)
            self.version = 0          # the workers restart their count too

    # -- the loop
    def run(self) -> dict:   # noqa: C901 - the server's loop: a branch per message kind
        inbox = Inbox(self.size, self.options.survives_lost_workers)
        active = set(range(self.workers))
        meetings = dict.fromkeys(active, 0)     # meetings each worker has entered
        checkpoints: dict[int, float] = {}      # meeting number -> SAVE or LOAD
        over = 0                                # meetings known to be over (a gradient came after them)
        pending: dict[int, tuple[torch.Tensor, float, int]] = {}   # this sync step's gradients, by worker
        finished: dict[int, set[int]] = {}      # epoch -> workers that have ended it
        cut: set[int] = set()                   # epochs ended for everyone (backup workers)
        backups = self.options.backup_workers
        while active:
            r, gradient = inbox.take()
            worker, kind, version, lr, entered, epoch = r.worker, r.kind, r.version, r.lr, r.meetings, r.epoch
            leaving = {worker} if kind == DONE else {r.lost[0]} if kind == LOST else set()
            if active - leaving:
                inbox.post()                    # the next request, while this one is handled
            if kind == DONE:
                active.discard(worker)
            elif kind == PULL:                  # the current parameters, nothing applied
                self._reply(worker, 0.0)
            elif kind == LOST:                  # a worker died: stop counting on it
                gone, more = r.lost
                active.discard(gone)
                if pending.pop(gone, None) is not None:
                    self.dropped += 1
                for done in finished.values():
                    done.discard(gone)
                if more == 0:                   # the survivors regroup with the servers
                    servers = list(range(self.workers, dist.get_world_size()))
                    self.group = dist.new_group(sorted(active) + servers, use_local_synchronization=True)
                    # The workers then make their own group; a group of this server alone keeps its
                    # count of groups equal to theirs (torch names the next group by that count).
                    dist.new_group([dist.get_rank()], use_local_synchronization=True)
            elif r.carries_gradient:
                over = max(over, entered)
                if epoch in cut:                # the epoch ended without this worker: not applied
                    self.dropped += 1
                    self._reply(worker, DROPPED, epoch_over=True)
                else:
                    mode = "sync" if kind == SYNC_GRADIENT else self.options.ps_mode
                    self._receive(mode, worker, version, lr, epoch, gradient, pending)
            elif kind == EPOCH_END:
                done = finished.setdefault(epoch, set())
                done.add(worker)
                if epoch not in cut and len(done) >= min(self.workers - backups, len(active)):
                    cut.add(epoch)
                    for w in [w for w, (_, _, e) in pending.items() if e == epoch]:
                        del pending[w]
                        self.dropped += 1
                        self._reply(w, DROPPED, epoch_over=True)
                if done >= active:
                    del finished[epoch]
                    cut.discard(epoch)
            else:                                   # IDLE, SAVE or LOAD: the worker enters a meeting
                meetings[worker] = entered
                if kind != IDLE:
                    checkpoints[entered] = kind
            ready = [k for k in checkpoints if all(meetings[w] >= k for w in active)]
            for k in ready:                         # every worker is at this checkpoint: join it
                self._checkpoint(checkpoints.pop(k))
                over = max(over, k)
            waiting = {w for w in active if meetings[w] > over}
            # Sync: a step needs one gradient from each working worker, less the backups; a worker
            # that is done, or waiting for the others at a meeting, is not waited for.
            working = len(active - waiting)
            if pending and len(pending) >= min(self.workers - backups, max(working, 1)):
                # In worker order, so the sum is the same whatever order the messages came in.
                ranks = sorted(pending)
                average = torch.stack([pending[w][0] for w in ranks]).sum(0) / len(ranks)
                self._apply(average, pending[ranks[0]][1])
                for w in ranks:
                    self._reply(w, 0.0)
                pending.clear()
        return {"applied": self.applied, "dropped": self.dropped, "staleness": self.staleness}

    def _receive(self, mode: str, worker: int, version: int, lr: float, epoch: int, gradient: torch.Tensor,
                 pending: dict) -> None:
        if mode == "async":
            staleness = self.version - version
            if self.options.max_staleness is not None and staleness > self.options.max_staleness:
                self.dropped += 1
                self._reply(worker, DROPPED)
                return
            self.staleness.append(staleness)
            self._apply(gradient, lr / (1 + staleness) if self.options.stale_lr else lr)
            self._reply(worker, float(staleness))
        elif version < self.version:      # sync: computed on an older version, a late gradient
            self.dropped += 1
            self._reply(worker, DROPPED)
        else:
            pending[worker] = (gradient.clone(), lr, epoch)     # the buffer takes a later request
