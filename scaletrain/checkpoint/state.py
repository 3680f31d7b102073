"""What a checkpoint holds, as one nested state dict for torch.distributed.checkpoint (DCP).

Tensors are the live training tensors themselves, so DCP loads *in place*: the optimizer keeps its
shared LR tensor and a captured CUDA graph keeps valid addresses. Replicated tensors (weights and
optimizer state under DDP) are written once by DCP's de-duplication; per-rank state (RNG) sits
under a per-rank key. Plain values (epoch, step, history) are stored by DCP as pickled bytes.

Holds: model weights and buffers, optimizer state and LR, the device counters (per-step losses
of the current epoch, applied steps: the LR schedule's position), the loss scaler, the loop
position (epoch, step in epoch, global step: the data order follows from these and the seed),
clocks, the epoch history, the callbacks' state, and every rank's RNG states.
"""

from __future__ import annotations

import json

import torch


def _optimizer_tensors(trainer) -> dict[str, torch.Tensor]:
    names = {id(p): name for name, p in trainer.model.named_parameters()}
    out = {}
    for p, state in trainer.optimizer.state.items():
        for key, value in state.items():
            if isinstance(value, torch.Tensor):
                out[f"{names[id(p)]}/{key}"] = value
    out["lr"] = trainer.optimizer.param_groups[0]["lr"]
    return out


def _rng_tensors() -> dict[str, torch.Tensor]:
    out = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["cuda"] = torch.cuda.get_rng_state()
    return out


RUN_COUNTERS = ("applied_steps", "skipped", "slot")  # the same on every rank


def tensor_state(trainer, rank: int) -> dict:
    counters = trainer.counters.tensors()
    return {
        "model": trainer.model.state_dict(),
        "optimizer": _optimizer_tensors(trainer),
        "counters": {k: v for k, v in counters.items() if k in RUN_COUNTERS},
        "scaler": trainer.scaler.state_tensors() if trainer.scaler is not None else {},
        # Per rank: each rank's RNG, and the loss and correct counts of its own shard so far.
        f"rank{rank}": {"rng": _rng_tensors(),
                        "epoch_counters": {k: v for k, v in counters.items() if k not in RUN_COUNTERS}},
    }


def host_state(trainer) -> dict:
    """The plain-value part, as a JSON string (DCP stores it as bytes; JSON keeps it readable)."""
    callbacks = {type(cb).__name__: cb.state_dict() for cb in trainer.callbacks if hasattr(cb, "state_dict")}
    return {"json": json.dumps({
        "epoch": trainer.epoch,
        "epoch_step": trainer.epoch_step,
        "global_step": trainer.global_step,
        "epoch_time_s": trainer.clock.interval,   # training time of the epoch so far (mid-epoch saves)
        "train_time_s": trainer.clock.total,
        "eval_time_s": trainer.eval_time_s,
        "checkpoint_time_s": trainer.checkpoint_time_s,
        "history": trainer.history,
        "stop_training": trainer.stop_training,
        "callbacks": callbacks,
    })}


def restore_host_state(trainer, text: str) -> dict:
    values = json.loads(text)
    trainer.history = values["history"]
    trainer.clock.total = values["train_time_s"]
    trainer.eval_time_s = values["eval_time_s"]
    trainer.checkpoint_time_s = values.get("checkpoint_time_s", 0.0)
    trainer.global_step = values["global_step"]
    trainer.stop_training = values["stop_training"]
    for cb in trainer.callbacks:
        state = values["callbacks"].get(type(cb).__name__)
        if state is not None and hasattr(cb, "load_state_dict"):
            cb.load_state_dict(state)
    return values


def apply_rng(rng: dict[str, torch.Tensor]) -> None:
    torch.set_rng_state(rng["cpu"])
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state(rng["cuda"])
