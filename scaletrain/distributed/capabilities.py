"""What only some strategies can do, as small protocols asked for at the one call site that needs
them (Lightning Fabric's `_BackwardSyncControl` and `_Sharded` are the model). The core `Strategy`
(strategies/base.py) holds what every strategy does; a strategy that can do more implements one
of these, and the caller asks with `isinstance` (or takes the no-op default below).

    capability         implemented by   asked for by
    Serving            ps               runner.py: a process the layout marks `serves` serves instead of training
    EpochControl       ps               training/trainer.py: each epoch's begin and end, early cuts, own figures
    CheckpointJoining  ps               checkpoint/checkpointer.py: who writes what, over which group
    CostBalancing      pipeline         training/parallelize.py: the layers' measured costs, before wrap
    BlockSharding      fsdp, zero2      prediction/scaling.py: the step's collectives for the model's blocks
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from scaletrain.checkpoint.checkpointer import CheckpointJoining
from scaletrain.models.layer_costs import LayerCost


@runtime_checkable
class Serving(Protocol):
    def serve(self, optim_config) -> dict:
        """The whole life of a process that serves rather than trains (`Layout.serves`)."""


def own_optimizer_problem(strategy: type, strategy_name: str, model_name: str) -> str | None:
    """Why a model that brings its own optimizer (a LightningModule's configure_optimizers) cannot
    train under `strategy`, or None: parameter servers build the optimizer from the config. The
    command line asks before any worker starts, the Trainer when it is given the model."""
    if issubclass(strategy, Serving):
        return (f"--strategy {strategy_name}: its servers build the optimizer from the config, not from "
                f"{model_name}'s configure_optimizers; use ddp, zero1 or fsdp")
    return None


@runtime_checkable
class EpochControl(Protocol):
    """A strategy whose epochs have their own beginning and end (a parameter server's sync warm-up,
    backup workers that end an epoch before the slowest finished) and figures of their own."""

    # Whether an epoch may end for a replica before it has run all its steps: the trainer then
    # agrees on the epoch's step count and averages each step's loss over the replicas that ran it.
    cuts_epochs: bool

    def begin_epoch(self, epoch: int) -> None:
        """Before each epoch's steps, on every training process."""

    def epoch_cut(self) -> bool:
        """Whether this process's epoch was just ended early; host state only."""

    def end_epoch(self) -> None:
        """When this process's epoch's steps end (run out or cut), before its metrics are gathered."""

    def epoch_metrics(self) -> dict:
        """The strategy's own figures for the epoch just trained (a collective: every rank calls it)."""


@runtime_checkable
class CostBalancing(Protocol):
    """A strategy that cuts the model by what its layers cost (a pipeline's stages): before `wrap`
    it is handed each layer's FLOPs and memory for the micro-batch it will run."""

    def costed_micro_batch(self, per_replica_batch: int) -> int | None:
        """The micro-batch the layer costs should be measured at; None: no costs needed (one
        stage, or cut where the user said)."""

    def balance_by(self, costs: list[LayerCost]) -> None:
        """Takes the costs of the model's pipeline layers, in order."""


class NoEpochControl:
    """The default: every replica runs every step of every epoch."""
    cuts_epochs = False

    def begin_epoch(self, epoch: int) -> None:
        pass

    def epoch_cut(self) -> bool:
        return False

    def end_epoch(self) -> None:
        pass

    def epoch_metrics(self) -> dict:
        return {}


def epoch_control(strategy) -> EpochControl:
    return strategy if isinstance(strategy, EpochControl) else NoEpochControl()


@runtime_checkable
class BlockSharding(Protocol):
    """A strategy that shards the model unit by unit, a unit per repeated block (fsdp, zero2): what
    crosses the links each step, and what can hide, depends on the blocks the model has. Asked of
    the strategy class (`issubclass`), before any process exists."""

    @classmethod
    def step_collectives(cls, blocks: int) -> tuple:
        """The step's collectives (as `Strategy.collectives`) for a model of `blocks` repeated
        blocks (models/blocks.py; 0: none, the whole model one unit)."""


# Defined by the checkpointer that asks for it (checkpoint/ sits below distributed/).
__all__ = ["BlockSharding", "CheckpointJoining", "CostBalancing", "EpochControl", "NoEpochControl", "Serving",
           "epoch_control"]
