"""The parallel layout: one frozen value that owns how the job's processes are laid out.

    world = workers + servers,   workers = replicas x stages x tensor   (a row-major dp x pp x tp mesh)

A strategy states what it asks of the processes (`Strategy.degrees`: pipeline stages, the
tensor-parallel degree, parameter servers), and `Layout.build` turns that into the layout of a
job of `world` processes and checks every rule about process counts, once, here: the launcher
(before any worker starts), the strategies, the trainer, the loaders, the counters and the
checkpoints all read the same value instead of recomputing it. (torchtitan's `ParallelDims`
is the model: one value holds the degrees and validates the combination.)
"""

from __future__ import annotations

from dataclasses import dataclass

from scaletrain.data.sharding import eval_range
from scaletrain.errors import ConfigError


@dataclass(frozen=True, slots=True)
class Degrees:
    """What a strategy asks of the processes; the rest of them are data-parallel replicas."""
    stages: int = 1               # pipeline stages one replica spans
    tensor: int = 1               # processes each stage's blocks are split over
    servers: int = 0              # processes that serve parameters (the last ranks) and do not train
    chief_evaluates: bool = False  # the chief evaluates whole splits (a worker may die: no range goes missing)


@dataclass(frozen=True, slots=True)
class Layout:
    strategy: str
    world: int                    # processes in the job
    rank: int                     # this process
    stages: int = 1
    tensor: int = 1
    servers: int = 0
    chief_evaluates: bool = False

    @classmethod
    def build(cls, strategy_cls, config, world: int, rank: int = 0) -> Layout:
        """The layout of `world` processes under the strategy class `strategy_cls` and its
        DistributedConfig `config`; raises ConfigError (one line, with the fix) for a count the
        strategy cannot use."""
        d = strategy_cls.degrees(config)
        layout = cls(strategy_cls.name, world, rank, d.stages, d.tensor, d.servers, d.chief_evaluates)
        if d.servers and world <= d.servers:
            raise ConfigError(f"--strategy {layout.strategy} with {d.servers} server(s) needs more processes than "
                              f"servers: {world} process(es) leave no worker; start {d.servers + 1} or more (--nproc)")
        if layout.workers % layout.span:
            raise ConfigError(f"{layout.workers} processes do not divide into replicas of {d.stages} stage(s) x "
                              f"{d.tensor} tensor-parallel process(es); start a multiple of {layout.span}")
        if world == 1 and len(config.devices) > 1:
            raise ConfigError(f"--devices {','.join(map(str, config.devices))} names {len(config.devices)} devices for "
                              f"one process; start one process per device (--nproc {len(config.devices)})")
        if config.grad_compression not in strategy_cls.grad_compressions:
            raise ConfigError(f"--grad-compression {config.grad_compression} does not apply to --strategy "
                              f"{layout.strategy} (it takes {', '.join(strategy_cls.grad_compressions)}); use "
                              "--strategy ddp, or leave --grad-compression none")
        problem = strategy_cls.layout_problem(layout, config)
        if problem:
            raise ConfigError(problem)
        return layout

    # -- counts
    @property
    def workers(self) -> int:
        """Processes that train (all but the servers)."""
        return self.world - self.servers

    @property
    def span(self) -> int:
        """Processes one model replica spans (stages x tensor-parallel degree)."""
        return self.stages * self.tensor

    @property
    def replicas(self) -> int:
        """Data-parallel replicas: batches, evaluation ranges and LR scaling divide over these."""
        return self.workers // self.span

    # -- where this process sits
    @property
    def serves(self) -> bool:
        """Whether this process serves (a parameter server) instead of training."""
        return self.rank >= self.workers

    @property
    def is_chief(self) -> bool:
        return self.rank == 0

    @property
    def replica_rank(self) -> int:
        return self.rank // self.span if not self.serves else 0

    @property
    def stage_rank(self) -> int:
        return (self.rank // self.tensor) % self.stages

    @property
    def tensor_rank(self) -> int:
        return self.rank % self.tensor

    @property
    def records(self) -> bool:
        """Whether this process's counters and evaluation outputs count: one process per replica
        (its last stage, tensor-parallel rank 0), so sums over all processes count every sample once."""
        return not self.serves and self.stage_rank == self.stages - 1 and self.tensor_rank == 0

    def evaluation_range(self, samples: int) -> tuple[int, int]:
        """The [start, end) of an evaluation split this process evaluates (the sums are then
        all-reduced): each replica one contiguous range, or the chief the whole split."""
        if self.chief_evaluates:
            return (0, samples) if self.is_chief else (samples, samples)
        return eval_range(samples, self.replica_rank, self.replicas)

    def role(self, rank: int) -> str:
        """How errors name process `rank`."""
        return f"parameter server (rank {rank})" if rank >= self.workers else f"worker rank {rank}"
