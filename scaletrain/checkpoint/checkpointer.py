"""Periodic checkpoints and resume for the Trainer, through torch.distributed.checkpoint.

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

import torch
import torch.distributed.checkpoint as dcp

from scaletrain.checkpoint.safe_reader import SafeFileSystemReader, SafeLoadPlanner, UnsafeCheckpoint
from scaletrain.checkpoint.state import apply_rng, host_state, restore_host_state, tensor_state
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


@torch.no_grad()
def merge_epoch_counters(live: dict[str, torch.Tensor], saved: list[dict[str, torch.Tensor]],
                         saved_world: int, world: int) -> None:
    """Resuming mid-epoch on a different number of ranks: the epoch's loss and accuracy so far
    must still count every saved rank once. Rank 0 takes the sums (losses rescaled, since the
    trainer averages per-step losses over the ranks it has), every other rank starts from zero."""
    for name, tensor in live.items():
        tensor.zero_()
        if saved:
            total = sum(part[name] for part in saved)
            tensor.copy_(total * world / saved_world if tensor.is_floating_point() else total)


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
        strategy = trainer.strategy
        step = trainer.global_step
        path = self.store.path_for(step)
        if strategy.is_chief and path.exists():
            # A half-written leftover of a crash at this step, or the same step saved again (the
            # final state after a save at the epoch's last step): un-commit first, then replace.
            (path / "COMMITTED").unlink(missing_ok=True)
            shutil.rmtree(path)
        strategy.barrier()
        state = {**tensor_state(trainer, strategy.rank), "host": host_state(trainer)}
        with _single_process_quiet():
            dcp.save(state, checkpoint_id=str(path))  # returns once every rank's part and the metadata are written
        if strategy.is_chief:
            self.store.commit(path, {"global_step": step, "epoch": trainer.epoch, "epoch_step": trainer.epoch_step,
                                     "world_size": strategy.world_size, "global_batch": trainer.batch.global_batch,
                                     "steps_per_epoch": trainer.steps_per_epoch})
            self.store.prune()
        self.last_saved_step = step
        self.last_saved_position = (trainer.epoch, trainer.epoch_step)
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
        path = self._agreed_path(trainer.strategy)
        if path is None:
            return Position()
        meta = CheckpointStore.read_meta(path)
        expected = {"global_batch": trainer.batch.global_batch, "steps_per_epoch": trainer.steps_per_epoch}
        for key, value in expected.items():
            if meta[key] != value:
                raise ConfigError(f"checkpoint {path} was taken with {key} {meta[key]}, this run has {value}; "
                                  "resume with the same global batch and data")
        rank, world = trainer.strategy.rank, trainer.strategy.world_size
        saved_world = meta["world_size"]
        state = tensor_state(trainer, rank)
        # Model and optimizer tensors reshard by name (DCP). Per-rank parts: this rank's RNG where
        # the saved job had this rank; its epoch counters as they were when the world size is
        # unchanged, else merged (see merge_epoch_counters).
        own = state.pop(f"rank{rank}")
        if rank < saved_world:
            state[f"rank{rank}"] = {"rng": own["rng"]}
        if saved_world == world:
            state.setdefault(f"rank{rank}", {})["epoch_counters"] = own["epoch_counters"]
        elif rank == 0:
            for k in range(saved_world):
                state.setdefault(f"rank{k}", {})["epoch_counters"] = {
                    name: torch.zeros_like(t) for name, t in own["epoch_counters"].items()}
        state["host"] = {"json": ""}
        try:
            SafeFileSystemReader(str(path)).read_metadata()   # DCP would hide this error in another
        except UnsafeCheckpoint as exc:
            raise UserError(f"checkpoint {path} was refused: {exc}; it was not written by scaletrain's DCP "
                            "checkpointer, so nothing in it was run") from None
        with _single_process_quiet():
            dcp.load(state, storage_reader=SafeFileSystemReader(str(path)), planner=SafeLoadPlanner())
        values = restore_host_state(trainer, state["host"]["json"])
        if "rng" in state.get(f"rank{rank}", {}):
            apply_rng(state[f"rank{rank}"]["rng"])
        if saved_world != world:
            saved = [state[f"rank{k}"]["epoch_counters"] for k in range(saved_world)] if rank == 0 else []
            merge_epoch_counters(own["epoch_counters"], saved, saved_world, world)
        self.last_saved_step = values["global_step"]
        self.last_saved_position = (values["epoch"], values["epoch_step"])
        trainer.resumed_epoch_time_s = values.get("epoch_time_s", 0.0)
        return Position(values["epoch"], values["epoch_step"], str(path))
