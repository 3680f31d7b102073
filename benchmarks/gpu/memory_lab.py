"""Part e: seed 004's memory lab. For 3 models × (plain, activation checkpointing, fsdp on one rank):
the memory planner's predicted peak against the peak the trainer's own step reaches
(`torch.cuda.max_memory_allocated`; on a CPU, the live tensor bytes the batch finder counts). Then
the batch finder's answer under a memory cap against a real out-of-memory bisection under the same
cap (`torch.cuda.set_per_process_memory_fraction`: the allocator raises OutOfMemoryError past it).
"""

from __future__ import annotations

import torch

from benchmarks.gpu.kit import Part, Skip, case

TITLE = "memory lab"
LIMIT_S = 38.0
STEPS = 3
CAP_GIB = 8   # the cap both batch searches run under, on a GPU


def setup(part: Part) -> dict:
    if part.rehearse:
        return {"models": (("wrn-10-1", [3, 12, 12]), ("vit", [3, 16, 16]), ("resnet", [3, 16, 16])),
                "batch": 16, "finder_model": ("wrn-10-1", [3, 12, 12]), "cap": 256 * 2**20, "max_batch": 1024}
    return {"models": (("wrn-16-4", [3, 32, 32]), ("vit-small", [3, 32, 32]), ("resnet-18", [3, 64, 64])),
            "batch": 256, "finder_model": ("wrn-16-4", [3, 32, 32]), "cap": CAP_GIB * 2**30, "max_batch": 1 << 14}


def _trainer(model_name: str, shape, precision: str, strategy: str = "single", checkpointing: bool = False,
             num_samples: int = 4096):
    from scaletrain.config import DataConfig, ModelConfig, TrainConfig
    from scaletrain.data import load_dataset
    from scaletrain.models import build_model
    from scaletrain.training import Trainer

    data = DataConfig(name="synthetic", shape=list(shape), num_samples=num_samples, placement="device")
    dataset = load_dataset(data, seed=0)
    cfg = TrainConfig(model=ModelConfig(name=model_name), data=data, epochs=1, batch_size=8, progress=False,
                      save_model=False)
    cfg.tracking.record = False
    cfg.precision.policy = precision
    cfg.memory.activation_checkpointing = checkpointing
    cfg.distributed.strategy = strategy
    torch.manual_seed(0)
    return Trainer(build_model(model_name, tuple(shape), dataset.num_classes), cfg), dataset, cfg


def _close(trainer) -> None:
    import torch.distributed as dist
    trainer.close()
    if dist.is_initialized():
        dist.destroy_process_group()


def predicted_and_measured(part: Part, model_name: str, shape, batch: int, variant: str) -> dict:
    from scaletrain.memory.batch_finder import BatchSizeFinder
    from scaletrain.memory.planner import Planner, PlanRequest

    precision = "bf16-mixed" if part.cuda else "fp32"
    strategy = "fsdp" if variant == "fsdp" else "single"
    trainer, dataset, cfg = _trainer(model_name, shape, precision, strategy, variant == "checkpointing")
    try:
        finder = BatchSizeFinder(trainer, dataset, steps=STEPS, margin=0.0,
                                 memory_limit=None if part.cuda else 1 << 40)
        measured, _ = finder.measure(batch, STEPS)
    finally:
        _close(trainer)
    planner = Planner(PlanRequest(model=model_name, input_shape=tuple(shape), num_classes=dataset.num_classes,
                                  batch_size=batch, precision=precision, activation_checkpointing=variant == "checkpointing",
                                  distributed=cfg.distributed))
    plan = planner.plan("fsdp" if variant == "fsdp" else "ddp", 1, batch)
    # One device: no DDP buckets; a CPU has no cuBLAS workspace.
    predicted = plan.total_bytes - (0 if part.cuda else plan.workspace_bytes)
    return {"precision": precision, "batch": batch, "measured_mib": measured / 2**20, "predicted_mib": predicted / 2**20,
            "predicted_over_measured": round(predicted / measured, 3)}


def finder_against_oom(part: Part, s: dict) -> dict:
    from scaletrain.memory.batch_finder import BatchSizeFinder

    if not part.cuda:
        raise Skip("no CUDA: nothing runs out of memory on a CPU")
    model_name, shape = s["finder_model"]
    precision = "bf16-mixed"
    # As many samples as the largest batch tried: the finder caps its answer at the training set.
    trainer, dataset, _ = _trainer(model_name, shape, precision, num_samples=s["max_batch"])
    total = torch.cuda.get_device_properties(trainer.device).total_memory
    try:
        found = BatchSizeFinder(trainer, dataset, steps=STEPS, margin=0.0, memory_limit=s["cap"]).run(
            start=8, max_batch=s["max_batch"]).max_batch_size
        # The real thing: the allocator itself refuses past the cap; bisect on OutOfMemoryError.
        index = torch.cuda.current_device()   # the call wants an index; the trainer's device may name none
        torch.cuda.set_per_process_memory_fraction(s["cap"] / total, index)
        probe = BatchSizeFinder(trainer, dataset, steps=2, margin=0.0, memory_limit=1 << 50)

        def fits(size: int) -> bool:
            from scaletrain.training.snapshot import TrainingSnapshot
            snapshot = TrainingSnapshot(trainer.model, trainer.optimizer, trainer.counters.tensors())
            try:
                probe.measure(size, 2)
                return True
            except torch.OutOfMemoryError:
                return False
            finally:
                snapshot.restore()
                torch.cuda.empty_cache()

        lo, hi = 8, 16
        while hi <= s["max_batch"] and fits(hi):
            lo, hi = hi, hi * 2
        while hi - lo > max(1, lo // 64):   # to within 1.6 %
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, torch.cuda.current_device())
        _close(trainer)
    return {"model": model_name, "precision": precision, "cap_gib": s["cap"] / 2**30, "finder_batch": found,
            "oom_bisection_batch": lo, "finder_over_oom": round(found / lo, 3)}


def run(part: Part) -> None:
    s = setup(part)
    part.note(steps=STEPS, batch=s["batch"])
    for model_name, shape in s["models"]:
        for variant in ("plain", "checkpointing", "fsdp"):
            case(part, f"{model_name} {variant}",
                 lambda m=model_name, sh=shape, v=variant: predicted_and_measured(part, m, sh, s["batch"], v),
                 model=model_name, variant=variant)
    case(part, "batch finder against a real out-of-memory bisection", lambda: finder_against_oom(part, s))
