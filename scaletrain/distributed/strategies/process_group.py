"""The part every multi-process strategy shares: joining the process group (NCCL on CUDA, gloo on
CPU), timeouts that notice a dead peer, and the small collectives the trainer needs."""

from __future__ import annotations

import datetime
import os
import socket
import time

import torch
import torch.distributed as dist

from scaletrain.distributed.devices import bind
from scaletrain.distributed.strategies.base import Strategy
from scaletrain.distributed.strategies.single import resolve_device
from scaletrain.errors import ConfigError


def destroy_process_group() -> None:
    """Leaves every process group, then lets the groups' worker threads finish without us.

    A gloo group's worker thread frees each finished collective itself, and freeing a tensor made
    in Python takes the GIL. The group's last reference is often dropped later, by Python (DDP's
    reducer holds one, freed with the traceback of the exception ending the run), and its
    destructor joins that thread while holding the GIL: if the thread was still freeing the last
    collective, both wait for ever (pytorch#56297). Seen on pruned `--nproc 2` trials, 3 runs of
    37: rank 1 left right after the verdict's broadcast, hung, ignored SIGTERM and was SIGKILLed
    30 s later. A moment asleep here (the GIL released) lets the thread finish first.
    """
    dist.destroy_process_group()
    time.sleep(0.05)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


POLL_S = 0.2   # how often a waiting process looks again: a signal is handled within this


def rendezvous(rank: int, world: int, attempt: int, wait_s: float, timeout: datetime.timedelta) -> dist.Store:
    """The job's store at MASTER_ADDR:MASTER_PORT (rank 0 serves it), once every rank has joined.

    torch's own env:// rendezvous waits inside C++ (a store connect, then gloo's connections to
    every peer): a process whose peer never comes ignores SIGTERM and Ctrl-C until its timeout,
    and then says nothing of who is missing. Here each wait is a Python loop of short tries, so a
    signal ends it within POLL_S, and after `wait_s` one line names the ranks that never joined."""
    addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    deadline = time.monotonic() + wait_s
    if rank == 0:
        store = dist.TCPStore(addr, port, world, is_master=True, timeout=timeout, wait_for_workers=False,
                              multi_tenant=True)
    else:
        while not _accepts(addr, port):
            if time.monotonic() > deadline:
                raise ConfigError(f"rank {rank} waited {wait_s:g} s for rank 0 {_where(0, f'{addr}:{port}')} to open "
                                  "the job's rendezvous; start that process (or raise --rendezvous-timeout-s)")
            time.sleep(POLL_S)
        store = dist.TCPStore(addr, port, world, is_master=False, timeout=timeout)
    prefix = f"scaletrain/rendezvous/{attempt}/"
    store.set(f"{prefix}{rank}", "joined")
    keys = [f"{prefix}{r}" for r in range(world)]
    while not store.check(keys):
        if time.monotonic() > deadline:
            missing = [r for r, key in enumerate(keys) if not store.check([key])]
            named = ", ".join(f"{r} {_where(r)}".strip() for r in missing)
            raise ConfigError(f"rank {rank} waited {wait_s:g} s at {addr}:{port} for rank(s) {named} to join the job; "
                              "start every process of the job (or raise --rendezvous-timeout-s)")
        time.sleep(POLL_S)
    return store


def _accepts(addr: str, port: int) -> bool:
    try:
        with socket.create_connection((addr, port), timeout=POLL_S):
            return True
    except OSError:
        return False


def _where(rank: int, fallback: str = "") -> str:
    """A rank as its cluster spec names it (TF_CONFIG's task and address), where one does."""
    from scaletrain.distributed.cluster import cluster_from_env
    try:
        spec = cluster_from_env()
    except ConfigError:
        spec = None
    if spec is None or rank >= spec.world_size:
        return f"({fallback})" if fallback else ""
    return f"({spec.source}'s task at {spec.addresses[rank]})"


class ProcessGroupStrategy(Strategy):
    """Base of ddp, zero1, zero2 and fsdp: one process per device, joined in one process group."""
    # Capturing collectives in a CUDA graph needs a static communication layout and is not
    # verified here; the step runs eagerly (or compiled) under every multi-process strategy.
    supports_cuda_graphs = False

    def __init__(self, config, env, layout=None):
        super().__init__(config, env, layout)
        self.owns_group = False
        self.set_env: tuple[str, ...] = ()   # variables this strategy put in os.environ: removed at teardown

    def setup(self, device_request: str) -> torch.device:
        if device_request == "auto":
            device_request = "cuda" if torch.cuda.is_available() else "cpu"
        base = resolve_device(device_request)
        if base.type == "cuda" and not self.config.devices and self.env.local_rank >= torch.cuda.device_count():
            raise ConfigError(f"local rank {self.env.local_rank} has no GPU: this host has "
                              f"{torch.cuda.device_count()}; start at most that many processes per host")
        self.device = bind(base, self.config.devices, self.env.local_rank, self.env.local_world_size)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        backend = self.config.backend if self.config.backend != "auto" else (
            "nccl" if self.device.type == "cuda" else "gloo")
        if not dist.is_initialized():
            if "MASTER_ADDR" not in os.environ:  # a one-process DDP run outside any launcher
                added = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "RANK": "0", "WORLD_SIZE": "1"}
                self.set_env = tuple(k for k in added if k not in os.environ)
                os.environ.update(added)
            # A generous first timeout covers compilation and data loading before the first
            # collective; after_first_step() shortens it so a dead peer is noticed quickly.
            timeout = datetime.timedelta(seconds=self.config.init_timeout_s)
            device_id = self.device if self.device.type == "cuda" else None
            if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
                # Plain `torchrun` shares its rendezvous store with the workers and keeps it across
                # restarts; keys of a dead attempt would be read by the next one (pytorch#135712).
                # Our own launcher turns the sharing off; here every attempt gets its own prefix.
                store = dist.PrefixStore(f"scaletrain/attempt_{self.env.restart_count}", dist.TCPStore(
                    os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), self.env.world_size,
                    is_master=False, timeout=timeout))
                dist.init_process_group(backend, store=store, rank=self.env.rank, world_size=self.env.world_size,
                                        timeout=timeout, device_id=device_id)
            else:
                store = rendezvous(self.env.rank, self.env.world_size, self.env.restart_count,
                                   self.config.rendezvous_timeout_s, timeout)
                dist.init_process_group(backend, store=store, rank=self.env.rank, world_size=self.env.world_size,
                                        timeout=timeout, device_id=device_id)
            self.owns_group = True
        return self.device

    def after_first_step(self) -> None:
        from torch.distributed.distributed_c10d import _set_pg_timeout
        _set_pg_timeout(datetime.timedelta(seconds=self.config.step_timeout_s), None)

    def teardown(self, clean: bool = True) -> None:
        if self.owns_group and dist.is_initialized():
            # Drain what is still in flight first: FSDP2 on gloo does not wait for its last
            # reduce-scatter (its completion event is a CUDA event, a no-op on CPU), and destroying
            # the group under it occasionally aborted a rank at exit ("terminate called without
            # an active exception"). Gloo runs a group's work in order, so one barrier suffices.
            # Not after a failure: a dead or hung peer would never arrive.
            if clean:
                dist.barrier()
            destroy_process_group()
            self.owns_group = False
        # A one-process group made in the caller's process (the Python API, a notebook) leaves its
        # environment as it found it: a later `torchrun` or subprocess would read WORLD_SIZE=1 and a
        # stale MASTER_PORT (seen: the multi-host and SLURM tests after an in-process fsdp test).
        for name in self.set_env:
            os.environ.pop(name, None)
        self.set_env = ()

    def all_reduce_sum_(self, tensor: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor

    def all_reduce_max_(self, tensor: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        return tensor

    def broadcast_object(self, obj):
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def barrier(self) -> None:
        dist.barrier()
