"""Periodic checkpoints and resume for the Trainer, through torch.distributed.checkpoint.

The checkpointer moves the trainer's state dict (`Trainer.state_dict`, training/state.py) to and
from storage and nothing else: when to save, where, verifying and choosing what to resume from.
Saving is collective: every rank enters `save` at the same global step (the step count is the
same everywhere), writes its part, and the chief then commits and prunes. Loading picks the newest
complete checkpoint ('auto') or a named one, loads in place, and hands the trainer the loop
position to continue from.
"""

from __future__ import annotations

import contextlib
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

import torch

from scaletrain.checkpoint.store import CheckpointStore
from scaletrain.errors import ConfigError, UserError


@contextlib.contextmanager
def _single_process_quiet():
    """DCP warns on every call without a process group; one process is a case we mean."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*assuming the intent is to (save|load) in a single process.*")
        yield


@dataclass(slots=True)
class Position:
    epoch: int = 0
    epoch_step: int = 0
    resumed_from: str | None = None


@runtime_checkable
class CheckpointJoining(Protocol):
    """A strategy capability (distributed/capabilities.py), asked for here: a strategy whose
    checkpoint involves processes that do not train (parameter servers)."""

    @property
    def checkpoint_group(self):
        """The process group DCP saves and loads over (None: the default group)."""

    def join_checkpoint(self, path, loading: bool) -> None:
        """Right before the checkpointer's DCP save or load of `path`, on every training process."""

    def state_to_save(self, state: dict) -> dict:
        """What this process writes of the trainer's state (training/state.py)."""


class Checkpointer:
    def __init__(self, store: CheckpointStore, every: int = 0, resume: str | None = None):
        self.store = store
        self.every = every
        self.resume = resume
        self.last_saved_step: int | None = None
        self.last_saved_position: tuple[int, int] | None = None   # (epoch, step in epoch)
        self.saves = 0

    def due(self, global_step: int, steps_just_run: int) -> bool:
        """True when a multiple of `every` was crossed by the last execution of steps."""
        if self.every <= 0:
            return False
        return global_step // self.every > (global_step - steps_just_run) // self.every

    def save(self, trainer) -> Path:
        # DCP is imported here, not with the module: 0.5 s that only a run that saves or resumes pays.
        import torch.distributed.checkpoint as dcp
        strategy = trainer.strategy
        position = trainer.position()
        path = self.store.path_for(position["global_step"])
        if strategy.is_chief and path.exists():
            # A half-written leftover of a crash at this step, or the same step saved again (the
            # final state after a save at the epoch's last step): un-commit first, then replace.
            (path / "COMMITTED").unlink(missing_ok=True)
            shutil.rmtree(path)
        strategy.barrier()
        state, group = trainer.state_dict(), None
        if isinstance(strategy, CheckpointJoining):   # processes that do not train write their part too
            strategy.join_checkpoint(path, loading=False)
            state, group = strategy.state_to_save(state), strategy.checkpoint_group
        with _single_process_quiet():
            # Returns once every rank's part and the metadata are written.
            dcp.save(state, checkpoint_id=str(path), process_group=group)
        if strategy.is_chief:
            self.store.commit(path, position)
            self.store.prune()
        self.last_saved_step = position["global_step"]
        self.last_saved_position = (position["epoch"], position["epoch_step"])
        self.saves += 1
        return path

    def find(self) -> Path | None:
        """The checkpoint to resume from (verified against its manifest), or None to start fresh."""
        if self.resume is None:
            return None
        if self.resume == "auto":
            return self.store.latest_verified()
        path = Path(self.resume)
        if not CheckpointStore.is_complete(path):
            raise ConfigError(f"--resume {path}: not a complete checkpoint (no COMMITTED file); "
                              "pass 'auto' to take the newest complete one")
        problem = CheckpointStore.problem(path)
        if problem:
            raise UserError(f"--resume {path}: the checkpoint is damaged ({problem}); pass 'auto' to take the "
                            "newest intact one")
        return path

    def _agreed_path(self, strategy) -> Path | None:
        """The chief verifies and chooses; every rank loads what it chose (or fails with its error)."""
        if strategy.world_size == 1:
            return self.find()
        if strategy.is_chief:
            try:
                path = self.find()
            except UserError as exc:
                strategy.broadcast_object({"error": str(exc)})
                raise
            strategy.broadcast_object({"path": str(path) if path else None})
            return path
        message = strategy.broadcast_object(None)
        if "error" in message:
            raise UserError(message["error"])
        return Path(message["path"]) if message["path"] else None

    def restore(self, trainer) -> Position:
        import torch.distributed.checkpoint as dcp
        from scaletrain.checkpoint.safe_reader import SafeFileSystemReader, SafeLoadPlanner, UnsafeCheckpoint
        path = self._agreed_path(trainer.strategy)
        if path is None:
            return Position()
        meta = CheckpointStore.read_meta(path)
        position = trainer.position()
        for key in ("global_batch", "steps_per_epoch"):
            if meta[key] != position[key]:
                raise ConfigError(f"checkpoint {path} was taken with {key} {meta[key]}, this run has {position[key]}; "
                                  "resume with the same global batch and data")
        # Checkpoints from before model parallelism have one replica per process.
        saved_world, saved_replicas = meta["world_size"], meta.get("replicas", meta["world_size"])
        state = trainer.load_template(saved_world, saved_replicas)
        try:
            SafeFileSystemReader(str(path)).read_metadata()   # DCP would hide this error in another
        except UnsafeCheckpoint as exc:
            raise UserError(f"checkpoint {path} was refused: {exc}; it was not written by scaletrain's DCP "
                            "checkpointer, so nothing in it was run") from None
        group = None
        if isinstance(trainer.strategy, CheckpointJoining):
            trainer.strategy.join_checkpoint(path, loading=True)
            group = trainer.strategy.checkpoint_group
        with _single_process_quiet():
            dcp.load(state, storage_reader=SafeFileSystemReader(str(path)), planner=SafeLoadPlanner(),
                     process_group=group)
        values = trainer.load_state_dict(state, saved_world, saved_replicas)
        self.last_saved_step = values["global_step"]
        self.last_saved_position = (values["epoch"], values["epoch_step"])
        return Position(values["epoch"], values["epoch_step"], str(path))


def load_model_weights(path: Path, model: torch.nn.Module) -> None:
    """Fills `model`'s weights in place from a committed checkpoint and nothing else (no optimizer,
    RNG or loop position): DCP reshards whatever layout saved it onto this one. The checkpoint is
    verified against its manifest first. Raises UserError for an unsafe or damaged checkpoint."""
    import torch.distributed.checkpoint as dcp
    from scaletrain.checkpoint.safe_reader import SafeFileSystemReader, SafeLoadPlanner, UnsafeCheckpoint
    problem = CheckpointStore.problem(path)
    if problem:
        raise UserError(f"checkpoint {path} is damaged ({problem})")
    try:
        SafeFileSystemReader(str(path)).read_metadata()
    except UnsafeCheckpoint as exc:
        raise UserError(f"checkpoint {path} was refused: {exc}") from None
    with _single_process_quiet():
        dcp.load({"model": model.state_dict()}, storage_reader=SafeFileSystemReader(str(path)),
                 planner=SafeLoadPlanner())

