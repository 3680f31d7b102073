"""The trainer's state, as one nested state dict (what `Trainer.state_dict()` returns and a
checkpoint holds; the checkpointer only moves it to and from storage).

Tensors are the live training tensors themselves, so a loader (DCP) fills them *in place*: the
optimizer keeps its shared LR tensor and a captured CUDA graph keeps valid addresses. Replicated
tensors (weights and optimizer state under DDP) are written once by DCP's de-duplication;
per-rank state (RNG, this rank's epoch counters) sits under a per-rank key. Plain values (loop
position, clocks, history, callbacks) are one JSON string.

Holds: model weights and buffers, optimizer state and LR, the device counters (per-step losses
of the current epoch, applied steps: the LR schedule's position), the loss scaler, the loop
position (epoch, step in epoch, global step: the data order follows from these and the seed),
clocks, the epoch history, the callbacks' state, and every rank's RNG states.
"""

from __future__ import annotations

import json

import torch
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

from scaletrain.accelerators import xla
from scaletrain.accelerators.xla import is_xla

RUN_COUNTERS = ("applied_steps", "skipped", "slot")  # the same on every rank


def _optimizer_tensors(trainer) -> dict[str, torch.Tensor]:
    names = {id(p): name for name, p in trainer.model.named_parameters()}
    out = {}
    for p, state in trainer.optimizer.state.items():
        for key, value in state.items():
            if isinstance(value, torch.Tensor):
                out[f"{names[id(p)]}/{key}"] = plain(value)
    out["lr"] = trainer.optimizer.param_groups[0]["lr"]
    return out


def _rng_tensors(device: torch.device) -> dict[str, torch.Tensor]:
    out = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["cuda"] = torch.cuda.get_rng_state()
    if is_xla(device):   # the XLA device's own generator (dropout there): its 64-bit seed, in two halves
        seed = xla.rng_state()
        out["xla"] = torch.tensor([seed >> 32, seed & 0xFFFFFFFF], dtype=torch.int64)
    return out


def _apply_rng(rng: dict[str, torch.Tensor]) -> None:
    torch.set_rng_state(rng["cpu"])
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state(rng["cuda"])
    if "xla" in rng:
        high, low = (int(v) for v in rng["xla"])
        xla.set_rng_state(high << 32 | low)


def on_host(state: dict) -> dict:
    """`state` with every tensor copied to the host (an XLA device's state, for checkpoints)."""
    return tree_map(lambda v: v.cpu() if isinstance(v, torch.Tensor) else v, state)


@torch.no_grad()
def copy_into(live: dict, filled: dict) -> dict:
    """Copies the tensors of `filled` (host copies of `live`'s, as `on_host` made them) into
    `live`'s, in place; returns `live` with `filled`'s plain values."""
    live_leaves, spec = tree_flatten(live)
    filled_leaves, filled_spec = tree_flatten(filled)
    assert spec == filled_spec, "a checkpoint template changed shape while it was filled"
    out = []
    for mine, loaded in zip(live_leaves, filled_leaves, strict=True):
        if isinstance(mine, torch.Tensor):
            mine.copy_(loaded)
            out.append(mine)
        else:
            out.append(loaded)
    return tree_unflatten(out, spec)


def _host_json(trainer) -> str:
    callbacks = {type(cb).__name__: cb.state_dict() for cb in trainer.callbacks if hasattr(cb, "state_dict")}
    return json.dumps({
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
    })


def plain(tensor):
    """The plain tensor a parameter holds, sharing its memory: a wrapper subclass of one inner
    tensor of its own shape and dtype (torchao's float8 weight, which casts itself as FSDP gathers
    it) is its inner tensor, under a DTensor too. Saved and loaded in place as plain tensors, a
    checkpoint holds what a run of another precision can read, and DCP fills the weights rather
    than a wrapper it cannot write into (a resumed fsdp fp8 run read NaN)."""
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass
    if not isinstance(tensor, torch.Tensor):
        return tensor
    local = getattr(tensor, "_local_tensor", None)
    if local is not None:     # a DTensor: its shard, unwrapped, under the same mesh and placements
        inner = plain(local)
        if inner is local:
            return tensor
        from torch.distributed.tensor import DTensor
        return DTensor.from_local(inner, tensor.device_mesh, tensor.placements, run_check=False,
                                  shape=tensor.shape, stride=tensor.stride())
    if type(tensor) is torch.Tensor or type(tensor) is torch.nn.Parameter or not is_traceable_wrapper_subclass(tensor):
        return tensor
    names, _ = tensor.__tensor_flatten__()
    inner = [getattr(tensor, name) for name in names]
    same = [t for t in inner if t.shape == tensor.shape and t.dtype == tensor.dtype]
    return same[0] if len(same) == 1 else tensor


def trainer_state(trainer) -> dict:
    rank = trainer.strategy.rank
    counters = trainer.counters.tensors()
    return {
        "model": {name: plain(t) for name, t in trainer.model.state_dict().items()},
        "optimizer": _optimizer_tensors(trainer),
        "counters": {k: v for k, v in counters.items() if k in RUN_COUNTERS},
        "scaler": trainer.scaler.state_tensors() if trainer.scaler is not None else {},
        # Per rank: each rank's RNG, and the loss and metric sums of its own shard so far.
        f"rank{rank}": {"rng": _rng_tensors(trainer.device),
                        "epoch_counters": {k: v for k, v in counters.items() if k not in RUN_COUNTERS}},
        "host": {"json": _host_json(trainer)},
    }


def _same_layout(trainer, saved_world: int, saved_replicas: int) -> bool:
    return (saved_world, saved_replicas) == (trainer.layout.world, trainer.layout.replicas)


def load_template(trainer, saved_world: int, saved_replicas: int) -> dict:
    """The state dict to fill from a checkpoint taken on `saved_world` ranks holding
    `saved_replicas` replicas: model and optimizer tensors reshard by name (a pipeline stage
    holds some of them); per-rank parts are this rank's RNG where the saved job had this rank,
    and its epoch counters where the layout is unchanged (else rank 0 takes every saved rank's,
    see `load_trainer_state`)."""
    state = trainer_state(trainer)
    rank = trainer.strategy.rank
    own = state.pop(f"rank{rank}")
    if rank < saved_world:
        state[f"rank{rank}"] = {"rng": own["rng"]}
    if _same_layout(trainer, saved_world, saved_replicas):
        state.setdefault(f"rank{rank}", {})["epoch_counters"] = own["epoch_counters"]
    elif rank == 0:
        for k in range(saved_world):
            state.setdefault(f"rank{k}", {})["epoch_counters"] = {
                name: torch.zeros_like(t) for name, t in own["epoch_counters"].items()}
    state["host"] = {"json": ""}
    return state


def load_trainer_state(trainer, state: dict, saved_world: int, saved_replicas: int) -> dict:
    """Applies a filled `load_template` (tensors were loaded in place) and returns the plain
    values (loop position, clocks)."""
    values = json.loads(state["host"]["json"])
    trainer.counters.restored()   # its tensors were filled in place
    trainer.history = values["history"]
    trainer.clock.total = values["train_time_s"]
    trainer.eval_time_s = values["eval_time_s"]
    trainer.checkpoint_time_s = values.get("checkpoint_time_s", 0.0)
    trainer.global_step = values["global_step"]
    trainer.stop_training = values["stop_training"]
    trainer.resumed_epoch_time_s = values.get("epoch_time_s", 0.0)
    for cb in trainer.callbacks:
        saved = values["callbacks"].get(type(cb).__name__)
        if saved is not None and hasattr(cb, "load_state_dict"):
            cb.load_state_dict(saved)
    rank = trainer.strategy.rank
    if "rng" in state.get(f"rank{rank}", {}):
        _apply_rng(state[f"rank{rank}"]["rng"])
    if not _same_layout(trainer, saved_world, saved_replicas):
        live = {k: v for k, v in trainer.counters.tensors().items() if k not in RUN_COUNTERS}
        saved = [state[f"rank{k}"]["epoch_counters"] for k in range(saved_world)] if rank == 0 else []
        merge_epoch_counters(live, saved, saved_replicas, trainer.layout.replicas)
    return values


@torch.no_grad()
def merge_epoch_counters(live: dict[str, torch.Tensor], saved: list[dict[str, torch.Tensor]],
                         saved_replicas: int, replicas: int) -> None:
    """Resuming mid-epoch on another layout (ranks, replicas, stages): the epoch's loss and metric
    so far must still count every saved replica once. Rank 0 takes the sums over the saved ranks
    (those that did not record hold zeros), losses rescaled since the trainer averages per-step
    losses over the replicas it has; every other rank starts from zero."""
    for name, tensor in live.items():
        tensor.zero_()
        if saved:
            total = sum(part[name] for part in saved)
            tensor.copy_(total * replicas / saved_replicas if name == "step_losses" else total)
