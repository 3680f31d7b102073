"""Parameter-server training (seed 002), on c10d point-to-point messages over gloo.
TensorFlow's ParameterServerStrategy, SyncReplicasOptimizer and DropStaleGradientOptimizer are the
references; docs/distributed.md describes the modes, checkpoints and faults.

Processes 0 .. W-1 are workers (0 is the chief: it logs, evaluates and writes the run); processes
W .. W+K-1 are parameter servers. The servers hold the parameters and the optimizer state, each
a shard of whole tensors balanced by size. Every step a worker computes its gradient, sends each
server its shard (with the step's LR and the parameter version it computed on) and receives that
server's current parameters back.

    sync          a server applies the average of one gradient per worker, then answers them all
                  (the same update as DDP with the same global batch)
    sync + B      a server applies the average of the first W - B gradients of a step; a gradient
                  computed on an older version arrives late and is dropped (and counted), and its
                  worker gets the new parameters at once: nobody waits for the slowest B workers
    async         a server applies each gradient as it arrives and answers its sender; staleness
                  = updates applied since the sender's parameters; --max-staleness drops older
                  ones, --stale-lr divides the LR by 1 + staleness
    backups       (either mode) an epoch ends once all but B workers have finished their share

Every epoch ends with a pull of the servers' parameters. Checkpoints go through the run's DCP
checkpointer with the servers joining. In async and backup modes a dead worker is dropped after
a roll call (membership.py) and the others go on.

The push is an explicit part of the strategy's step (`optimizer_step`): the worker's optimizer
only carries the LR the training step's schedule writes; the servers hold the real optimizer.

Why c10d point-to-point and not torch.distributed.rpc: it is the same process group, launcher
(torchrun) and backends as every other strategy, gloo's receive-from-any-source is exactly the
server's loop, and TensorPipe, rpc's only agent, is in maintenance mode (pytorch/tensorpipe#468).
The cost per step is two messages per (worker, server) pair of the shard's size, the push and
the reply (BENCHMARKS.md); a notice is a header of a few floats (protocol.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

from scaletrain.distributed.layout import Degrees
from scaletrain.distributed.partition import partition_by_size
from scaletrain.distributed.strategies.base import register_strategy
from scaletrain.distributed.strategies.process_group import ProcessGroupStrategy, destroy_process_group
from scaletrain.distributed.strategies.ps.membership import Heartbeat, roll_call, store_client
from scaletrain.distributed.strategies.ps.protocol import (
    DONE,
    EPOCH_END,
    GRADIENT,
    HEADER,
    IDLE,
    LOAD,
    LOST,
    PULL,
    REQUEST_TAG,
    SAVE,
    SYNC_GRADIENT,
    read_reply,
    request,
)
from scaletrain.distributed.strategies.ps.server import Server
from scaletrain.distributed.strategies.step_contract import StepContract
from scaletrain.errors import ConfigError, UserError
from scaletrain.optim import build_optimizer


def balance(sizes: list[int], servers: int) -> list[list[int]]:
    """Tensor indices per server: largest first onto the least loaded server (whole tensors)."""
    if servers > len(sizes):
        raise ConfigError(f"--num-ps {servers} is more than the model's {len(sizes)} parameter tensors (a server "
                          f"holds whole tensors); use --num-ps {len(sizes)} or fewer")
    owners = partition_by_size(sizes, servers)
    return [[i for i, owner in enumerate(owners) if owner == k] for k in range(servers)]


@dataclass(slots=True)
class ExchangeStats:
    """What a worker saw of the servers: for the run's metrics."""
    pushes: int = 0
    dropped: int = 0
    staleness: list[int] = field(default_factory=list)
    seconds: float = 0.0


STALENESS_BUCKETS = 16   # the staleness histogram's last bucket holds this many updates late or more


class ServedOptimizer(torch.optim.Optimizer):
    """A worker's optimizer: it holds no state (the servers hold it) and is never stepped; its LR
    tensor is the one the training step's schedule writes, which each push carries."""

    def __init__(self, param_groups: list[dict]):
        super().__init__(param_groups, {})

    def step(self, closure=None):
        raise RuntimeError("a parameter-server worker's update is its push (ParameterServerStrategy.optimizer_step)")


@register_strategy("ps")
class ParameterServerStrategy(ProcessGroupStrategy):
    traffic = "parameter-server"
    memory_plan = None

    def __init__(self, config, env, layout=None):
        super().__init__(config, env, layout)
        self.workers = self.layout.workers
        self.options = config.ps
        self.workers_group = None
        self.params: list[nn.Parameter] = []
        self.names: list[str] = []
        self.shards: list[list[int]] = []
        self.version = 0
        self.meetings = 0       # meetings entered (server.py): collectives of the workers, checkpoints
        self.live = False       # off during the untimed warm-up: no update may reach the servers
        self.gradient_kind = GRADIENT
        self.epoch = 0
        self.cut = False        # the servers ended this epoch before this worker finished its share
        # Who is left: async and backup modes go on without a worker that died.
        self.members = list(range(self.workers))
        self.lost: list[int] = []
        self.everyone_group = None      # the live workers and the servers, once one is lost (else the default)
        self.roll_calls = 0
        self.heartbeat: Heartbeat | None = None
        self.store = None
        self.stats = ExchangeStats()

    # -- the layout: the last num_ps processes serve. Where a worker may die, the chief evaluates
    # whole splits (every worker holds the servers' parameters after the epoch's pull, so the result
    # is the same): no range can go missing with a dead worker. Sync mode splits them as DDP does.
    @classmethod
    def degrees(cls, config) -> Degrees:
        return Degrees(servers=config.ps.num_ps, chief_evaluates=config.ps.survives_lost_workers)

    @classmethod
    def layout_problem(cls, layout, config) -> str | None:
        if config.ps.backup_workers >= layout.workers:
            return (f"--backup-workers {config.ps.backup_workers} leaves no gradient to apply with {layout.workers} "
                    f"worker(s); use at most {layout.workers - 1}")
        return None

    @classmethod
    def model_problem(cls, model, layout, config, block_classes=()) -> str | None:
        tensors = sum(1 for p in model.parameters() if p.requires_grad)
        if layout.servers > tensors:
            return (f"--num-ps {layout.servers} is more than the model's {tensors} parameter tensors (a server "
                    f"holds whole tensors); use --num-ps {tensors} or fewer")
        return None

    @property
    def checkpoint_group(self):
        return self.everyone_group

    def describe(self) -> str:
        backups = f", {self.options.backup_workers} backup" if self.options.backup_workers else ""
        return f"{self.workers} worker(s) + {self.options.num_ps} parameter server(s), {self.options.ps_mode}{backups}"

    def epoch_metrics(self) -> dict[str, float | list[int]]:
        """Over all workers, this epoch: pushes, gradients dropped (late or too stale), the mean
        and largest staleness of the applied ones and their distribution (`ps_staleness_counts[s]`:
        gradients applied s updates late; the last entry counts STALENESS_BUCKETS or more), and
        seconds spent exchanging."""
        s = self.stats
        counts = torch.tensor([s.pushes, s.dropped, s.seconds], dtype=torch.float64)
        histogram = torch.bincount(torch.tensor(s.staleness, dtype=torch.long).clamp(max=STALENESS_BUCKETS),
                                   minlength=STALENESS_BUCKETS + 1).to(torch.float64)
        staleness_sum = torch.tensor([float(sum(s.staleness))], dtype=torch.float64)
        totals = torch.cat([counts, staleness_sum, histogram])
        self.all_reduce_sum_(totals)
        largest = self.all_reduce_max_(torch.tensor([max(s.staleness, default=0)], dtype=torch.float64))
        self.stats = ExchangeStats()
        pushes, dropped, seconds, stale_sum = totals[:4].tolist()
        histogram = [int(n) for n in totals[4:].tolist()]
        applied = sum(histogram)
        return {"ps_pushes": int(pushes), "ps_dropped": int(dropped),
                "ps_staleness_mean": stale_sum / applied if applied else 0.0, "ps_staleness_max": int(largest),
                "ps_staleness_counts": histogram, "ps_exchange_s": seconds / len(self.members),
                "ps_workers": len(self.members), "ps_workers_lost": len(self.lost)}

    def begin_epoch(self, epoch: int) -> None:
        warming_up = epoch < self.options.sync_warmup_epochs
        self.gradient_kind = SYNC_GRADIENT if warming_up else GRADIENT
        self.epoch = epoch

    @property
    def cuts_epochs(self) -> bool:
        return self.options.survives_lost_workers

    def epoch_cut(self) -> bool:
        return self.cut

    def end_epoch(self) -> None:
        """Tells the servers this worker's epoch is over (once all but the backups have said so,
        they end it for the rest); then, once every worker is done pushing, takes the servers'
        parameters: the epoch's evaluation, the saved model and the next epoch start from the
        servers' state, not from a worker's last (in async mode, older) pull."""
        self.cut = False
        if not self.live:
            return
        if self.options.backup_workers:
            self._tell_servers(EPOCH_END)
        self.barrier()
        self._pull()

    def _pull(self) -> None:
        for k in range(len(self.shards)):
            dist.send(request(PULL, self.rank), dst=self.server_rank(k), tag=REQUEST_TAG)
        replies = []
        for k, shard in enumerate(self.shards):
            reply = torch.empty(HEADER + sum(self.params[i].numel() for i in shard))
            dist.recv(reply, src=self.server_rank(k))
            replies.append(reply)
        self._copy_parameters(replies)
        self.version = read_reply(replies[0]).version

    def setup(self, device_request: str) -> torch.device:
        device = super().setup(device_request if not self.layout.serves else "cpu")
        if self.device.type != "cpu":
            raise ConfigError("--strategy ps runs on the CPU with gloo for now; pass --device cpu")
        # Every process creates every group, in the same order. A server then makes a group of its
        # own: a process holds the groups it is a member of, and torch names a group created later
        # by its ranks and that count (the survivors' groups after a lost worker must match).
        self.workers_group = dist.new_group(list(range(self.workers)))
        if self.layout.serves:
            dist.new_group([self.rank], use_local_synchronization=True)
        elif self.options.survives_lost_workers:
            self._start_heartbeat()
        return device

    def server_rank(self, k: int) -> int:
        return self.workers + k

    # -- the workers' side
    def wrap(self, model: nn.Module, compile_fn, block_classes=(), policy=None):
        named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
        self.names, self.params = [name for name, _ in named], [p for _, p in named]
        self.shards = balance([p.numel() for p in self.params], self.options.num_ps)
        # The servers learn the layout and the chief's initial values (every worker's are equal).
        layout = [self.names, [tuple(p.shape) for p in self.params], self.shards]
        dist.broadcast_object_list(layout, src=0)
        if self.is_chief:
            for k, shard in enumerate(self.shards):
                dist.send(torch.cat([self.params[i].detach().reshape(-1) for i in shard]), dst=self.server_rank(k))
        return compile_fn(model), compile_fn(model)

    def make_optimizer(self, optim_config, model, device, capturable=False):
        return ServedOptimizer(build_optimizer(optim_config, model, device).param_groups)

    def optimizer_step(self, step: StepContract) -> None:
        """The update is an exchange with the servers: push this worker's gradient with the step's
        LR, take their parameters back (the step's counters and LR lookup run as for any update)."""
        step.update(None, apply=lambda: self.exchange(float(step.optimizer.param_groups[0]["lr"])))

    def after_first_step(self) -> None:
        super().after_first_step()
        self.live = True

    def exchange(self, lr: float) -> None:
        """One push of this worker's gradient to every server and one pull of its parameters."""
        if not self.live:
            return
        started = time.perf_counter()
        sends, replies = [], []
        for k, shard in enumerate(self.shards):
            message = request(self.gradient_kind, self.rank, version=self.version, lr=lr, meetings=self.meetings,
                              epoch=self.epoch, gradient=[self.params[i].grad for i in shard])
            sends.append(dist.isend(message, dst=self.server_rank(k), tag=REQUEST_TAG))
        for k, shard in enumerate(self.shards):
            reply = torch.empty(HEADER + sum(self.params[i].numel() for i in shard))
            dist.recv(reply, src=self.server_rank(k))
            replies.append(reply)
        for work in sends:
            work.wait()
        self._adopt(replies)
        self.stats.seconds += time.perf_counter() - started

    @torch.no_grad()
    def _copy_parameters(self, replies: list[torch.Tensor]) -> None:
        for reply, shard in zip(replies, self.shards, strict=True):
            offset = HEADER
            for i in shard:
                p = self.params[i]
                p.copy_(reply[offset:offset + p.numel()].view_as(p))
                offset += p.numel()

    def _adopt(self, replies: list[torch.Tensor]) -> None:
        self.stats.pushes += 1
        self._copy_parameters(replies)
        first = read_reply(replies[0])
        self.version = first.version
        self.cut = self.cut or any(read_reply(reply).epoch_over for reply in replies)
        if first.dropped:
            self.stats.dropped += 1
        else:
            self.stats.staleness.append(int(first.staleness))

    def _tell_servers(self, kind: float, about: tuple[float, float] = (0.0, 0.0)) -> None:
        if kind not in (DONE, EPOCH_END, LOST):
            self.meetings += 1
        for k in range(len(self.shards)):
            header = request(kind, self.rank, version=about[0], lr=about[1], meetings=self.meetings, epoch=self.epoch)
            dist.send(header, dst=self.server_rank(k), tag=REQUEST_TAG)

    def teardown(self, clean: bool = True) -> None:
        if self.heartbeat is not None:
            self.heartbeat.stop()
        if clean and not self.layout.serves and self.shards:
            self._tell_servers(DONE)
        if self.everyone_group is not None and self.owns_group and dist.is_initialized():
            if clean:     # the default group holds a dead worker: drain over the live processes only
                dist.barrier(group=self.everyone_group)
            destroy_process_group()
            self.owns_group = False
        super().teardown(clean)

    # -- collectives among the workers (the servers take no part in evaluation or the run's plan).
    # Before each, a worker tells the servers it is idle: the others may be waiting for it there,
    # so a sync step must not wait for their gradients (with backups, it would wait forever).
    def _meet(self) -> None:
        if self.live:
            self._tell_servers(IDLE)

    def _among_workers(self, collective):
        """Runs `collective(group)` over the live workers; where workers may be lost, after a roll
        call that drops any dead one first (membership.py)."""
        self._meet()
        if self.options.survives_lost_workers and self.live:
            self._roll_call()
        return collective(self.workers_group)

    def _start_heartbeat(self) -> None:
        prefix = f"scaletrain/ps/{self.env.restart_count}"
        self.store = store_client(self.config.init_timeout_s)
        self.heartbeat = Heartbeat(prefix, self.rank, self.config.init_timeout_s)
        self._prefix = prefix

    def _roll_call(self) -> None:
        """Drops the workers that have died since the last roll call (the servers too)."""
        self.roll_calls += 1
        present = roll_call(self.store, self._prefix, self.roll_calls, self.rank, self.members, chief=0,
                            silent_s=self.options.ps_roll_call_s)
        if self.rank not in present:
            raise UserError(f"worker rank {self.rank} went silent for more than --ps-roll-call-s "
                            f"{self.options.ps_roll_call_s:g} s and was dropped from the job; the others go on")
        lost = [w for w in self.members if w not in present]
        if not lost:
            return
        self.members, self.lost = present, self.lost + lost
        servers = [self.server_rank(k) for k in range(self.options.num_ps)]
        if self.is_chief:
            for i, w in enumerate(lost):     # the servers stop counting on it, then regroup with us
                self._tell_servers(LOST, about=(float(w), float(len(lost) - 1 - i)))
            print(f"scaletrain: worker rank(s) {', '.join(map(str, lost))} lost; training goes on with "
                  f"{len(present)} worker(s)", flush=True)
        # In this order on the servers too (server.py): torch names a group by its ranks and by
        # how many groups the process already holds, so every member must hold as many.
        self.everyone_group = dist.new_group(present + servers, use_local_synchronization=True)
        self.workers_group = dist.new_group(present, use_local_synchronization=True)

    def all_reduce_sum_(self, tensor: torch.Tensor) -> torch.Tensor:
        self._among_workers(lambda g: dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=g))
        return tensor

    def all_reduce_max_(self, tensor: torch.Tensor) -> torch.Tensor:
        self._among_workers(lambda g: dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=g))
        return tensor

    def broadcast_object(self, obj):
        box = [obj]
        self._among_workers(lambda g: dist.broadcast_object_list(box, src=0, group=g))
        return box[0]

    def barrier(self) -> None:
        self._among_workers(lambda g: dist.barrier(group=g))

    # -- checkpoints: the servers write and read the parameters and the optimizer state
    def join_checkpoint(self, path, loading: bool) -> None:
        """Brings the servers into the DCP save or load the workers are about to enter (a meeting:
        no gradient is in flight), and tells them where."""
        self._tell_servers(LOAD if loading else SAVE)
        dist.broadcast_object_list([str(path)], src=0, group=self.everyone_group)

    def state_to_save(self, state: dict) -> dict:
        """The servers write the parameters (the workers' copies may be older, in async mode);
        the workers write the rest: buffers, LR, counters, RNG, the loop's position."""
        held = set(self.names)
        state["model"] = {k: v for k, v in state["model"].items() if k not in held}
        return state

    # -- the servers' side
    def serve(self, optim_config) -> dict:
        """A parameter server's whole life: receive the layout and initial values, then apply
        gradients until every worker is done. Returns its counts."""
        layout = [None, None, None]
        dist.broadcast_object_list(layout, src=0)
        names, shapes, shards = layout
        mine = shards[self.rank - self.workers]
        server = Server(self.options, optim_config, [names[i] for i in mine], [shapes[i] for i in mine], self.workers)
        dist.recv(server.flat_params(), src=0)
        server.load_initial()
        counts = server.run()
        self.everyone_group = server.group
        return counts
