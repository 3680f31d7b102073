"""Periodic checkpoints and resume for the Trainer, through torch.distributed.checkpoint.

The checkpointer moves the trainer's state dict (`Trainer.state_dict`, training/state.py) to and
from storage and nothing else: when to save, where, verifying and choosing what to resume from.
Saving is collective: every rank enters `save` at the same global step (the step count is the
same everywhere), writes its part, and the chief then commits and prunes. Loading picks the newest
complete checkpoint ('auto') or a named one, loads in place, and hands the trainer the loop
position to continue from.

By default a save runs in the background (DCP's `async_save`): the state is staged to host memory
(a copy, so training may change it at once), written by a writer thread, and committed by the
chief only when every rank's part is written; training stalls only for the copy. One save is in
flight at a time (its copy is the memory this costs); the next save, and the end of training,
wait for it. A crash mid-write leaves a folder without COMMITTED, exactly as a synchronous save
would. Ranks write over a gloo group of their own, so the writer thread's collectives never
interleave with the training's. A strategy whose checkpoint involves processes that do not train
(`CheckpointJoining`: parameter servers) saves synchronously.
"""

from __future__ import annotations

import shutil
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

import torch

from scaletrain.checkpoint.store import CheckpointStore
from scaletrain.errors import ConfigError, Terminated, UserError


def _quiet_single_process() -> None:
    """DCP warns on every call without a process group; one process is a case we mean. The filter
    is process-wide: a background save warns on DCP's writer thread, which a `catch_warnings`
    block (not thread-safe) would not cover."""
    warnings.filterwarnings("ignore", message=".*assuming the intent is to (save|load) in a single process.*")


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


def _is_stop(exc: BaseException) -> bool:
    """A signal or an exit, which a save passes on as it is; anything else failed the write (DCP's
    CheckpointException is a BaseException too)."""
    return isinstance(exc, (KeyboardInterrupt, SystemExit, Terminated))


class PendingSave:
    """A background save: done once this rank's part is written and, on the chief, committed."""

    def __init__(self, path: Path):
        self.path = path
        self.finished = threading.Event()
        self.failure: BaseException | None = None


class Checkpointer:
    def __init__(self, store: CheckpointStore, every: int = 0, resume: str | None = None, background: bool = True):
        self.store = store
        self.every = every
        self.resume = resume
        self.background = background
        self.last_saved_position: tuple[int, int] | None = None   # (epoch, step in epoch)
        self.saves = 0
        self._pending: PendingSave | None = None
        self._writer_group = None       # the background writes' own gloo group (several processes)

    def due(self, global_step: int, steps_just_run: int) -> bool:
        """True when a multiple of `every` was crossed by the last execution of steps."""
        if self.every <= 0:
            return False
        return global_step // self.every > (global_step - steps_just_run) // self.every

    def save(self, trainer) -> Path:
        # DCP is imported here, not with the module: 0.5 s that only a run that saves or resumes pays.
        import torch.distributed.checkpoint as dcp
        self.wait()         # the previous background save: one in flight at a time
        strategy = trainer.strategy
        position = trainer.position()
        path = self.store.path_for(position["global_step"])
        if strategy.is_chief and self.saves == 0:
            self.store.claim()
        if strategy.is_chief and path.exists():
            # A half-written leftover of a crash at this step, or the same step saved again (the
            # final state after a save at the epoch's last step): un-commit first, then replace.
            (path / "COMMITTED").unlink(missing_ok=True)
            shutil.rmtree(path)
        strategy.barrier()
        state, group = trainer.state_dict(), None
        joining = isinstance(strategy, CheckpointJoining)
        if joining:   # processes that do not train write their part too
            strategy.join_checkpoint(path, loading=False)
            state, group = strategy.state_to_save(state), strategy.checkpoint_group
        if self.background and not joining:
            self._start_background_save(state, path, position, strategy)
        else:
            _quiet_single_process()
            try:
                # Returns once every rank's part and the metadata are written.
                dcp.save(state, checkpoint_id=str(path), process_group=group)
                if strategy.is_chief:
                    self.store.commit(path, position)
                    self.store.prune()
            except BaseException as exc:
                if _is_stop(exc):
                    raise
                raise self.store.failed_save(path, exc) from None
        self.last_saved_position = (position["epoch"], position["epoch_step"])
        self.saves += 1
        return path

    def _start_background_save(self, state: dict, path: Path, position: dict, strategy) -> None:
        import torch.distributed as dist
        import torch.distributed.checkpoint as dcp
        several = dist.is_available() and dist.is_initialized()
        if several and self._writer_group is None:
            # Collective: every rank is here, at the same step.
            self._writer_group = dist.new_group(backend="gloo")
        _quiet_single_process()
        pending = PendingSave(path)
        # Stages (copies) the state before it returns; the writing runs on DCP's writer thread.
        future = dcp.async_save(state, checkpoint_id=str(path), process_group=self._writer_group,
                                no_dist=not several)
        chief = strategy.is_chief

        def finish(done) -> None:          # on the writer thread, once this rank's part is written
            try:
                done.result()
                if chief:                   # the coordinator's save returns after every rank's part
                    self.store.commit(path, position)
                    self.store.prune()
            except BaseException as exc:    # raised in the training thread, by wait()
                pending.failure = exc
            finally:
                pending.finished.set()

        self._pending = pending
        future.add_done_callback(finish)

    def wait(self) -> None:
        """Returns once the background save in flight (if any) is written and committed; raises
        what it raised."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        pending.finished.wait()
        if pending.failure is not None:
            if not _is_stop(pending.failure):
                raise self.store.failed_save(pending.path, pending.failure) from None
            raise pending.failure

    def find(self) -> Path | None:
        """The checkpoint to resume from (verified against its manifest), or None to start fresh."""
        if self.resume is None:
            return None
        if self.resume == "auto":
            problem = self.store.owner_problem()
            if problem:
                raise UserError(problem)
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
        from scaletrain.checkpoint.safe_reader import load_checkpoint
        path = self._agreed_path(trainer.strategy)
        if path is None:
            return Position()
        meta = CheckpointStore.read_meta(path)
        position = trainer.position()
        for key in ("global_batch", "steps_per_epoch"):
            if meta[key] != position[key]:
                raise ConfigError(f"checkpoint {path} was taken with {key} {meta[key]}, this run has {position[key]}; "
                                  "resume with the same global batch and data")
        # Only the run's own checkpoint: its configuration (less what a resume may change) is this
        # run's. Checked whether or not the folder names an owner (a foreign checkpoint copied in).
        saved_identity = meta.get("config_identity")
        if saved_identity is not None and saved_identity != position["config_identity"]:
            taken_by = f" by run {meta['run_id']}" if meta.get("run_id") else ""
            raise ConfigError(f"checkpoint {path} was taken{taken_by} with another configuration than this run's "
                              "(its digest differs): a run resumes only its own checkpoints; pass the run's own "
                              "--run-dir, or start afresh (--overwrite, or without --resume)")
        # And one found in its folder (`auto`) was taken by this run (its id, where both are known):
        # another run's of the same configuration, copied in without owner.json, is not adopted. A
        # checkpoint named by its path is the user's choice to continue from.
        taker = meta.get("run_id")
        if self.resume == "auto" and taker and self.store.owner and taker != self.store.owner:
            raise ConfigError(f"checkpoint {path} was taken by run {taker}, not by this run ({self.store.owner}): a "
                              "run resumes only its own checkpoints; pass that run's own --run-dir to continue it, "
                              f"or name the checkpoint (--resume {path}) to continue from it here")
        # Checkpoints from before model parallelism have one replica per process.
        saved_world, saved_replicas = meta["world_size"], meta.get("replicas", meta["world_size"])
        if position["replica_seeded_data"] and saved_replicas != position["replicas"]:
            raise ConfigError(f"checkpoint {path} was taken with {saved_replicas} replicas reading your own data set, "
                              f"this run has {position['replicas']}: its samples are read in replica batches, each "
                              "under a seed of its own, so their random transforms would differ; resume with "
                              f"{saved_replicas} replicas (the same --nproc)")
        state = trainer.load_template(saved_world, saved_replicas)
        check_metadata(path)    # DCP would hide this error in another
        group = None
        if isinstance(trainer.strategy, CheckpointJoining):
            trainer.strategy.join_checkpoint(path, loading=True)
            group = trainer.strategy.checkpoint_group
        _quiet_single_process()
        load_checkpoint(state, path, process_group=group)
        values = trainer.load_state_dict(state, saved_world, saved_replicas)
        self.last_saved_position = (values["epoch"], values["epoch_step"])
        return Position(values["epoch"], values["epoch_step"], str(path))


def load_model_weights(path: Path, model: torch.nn.Module) -> None:
    """Fills `model`'s weights in place from a committed checkpoint and nothing else (no optimizer,
    RNG or loop position): DCP reshards whatever layout saved it onto this one. The checkpoint is
    verified against its manifest first. Raises UserError for an unsafe or damaged checkpoint."""
    from scaletrain.checkpoint.safe_reader import load_checkpoint
    problem = CheckpointStore.problem(path)
    if problem:
        raise UserError(f"checkpoint {path} is damaged ({problem})")
    check_metadata(path)
    _quiet_single_process()
    load_checkpoint({"model": model.state_dict()}, path)


def check_metadata(path: Path) -> None:
    """The checkpoint's metadata read safely and every item checked to lie inside its file, before
    any rank reads tensors: one line naming what is wrong."""
    from scaletrain.checkpoint.safe_reader import SafeFileSystemReader, UnreadableCheckpoint, UnsafeCheckpoint
    try:
        SafeFileSystemReader(str(path)).read_metadata()
    except UnsafeCheckpoint as exc:
        raise UserError(f"checkpoint {path} was refused: {exc}; it was not written by scaletrain's DCP "
                        "checkpointer, so nothing in it was run") from None
    except UnreadableCheckpoint as exc:
        raise UserError(f"checkpoint {path} is damaged: {exc}; it was altered after it was written (its manifest "
                        "too), so it is not resumed: use an older checkpoint (--resume PATH) or start afresh") from None

