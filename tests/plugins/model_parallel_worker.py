"""A worker (plain python for one process, torchrun for several): trains a small GPT on the
character corpus under the distributed settings given as JSON in argv[1], and writes per rank the
epoch history, the last epoch's per-step losses, the final full weights (rank 0), and the
gradients of one more step on a fixed batch, for the equality tests (tests/test_model_parallel.py)."""

import json
import sys

import torch
from torch.distributed.tensor import DTensor

from scaletrain.config import DataConfig, DistributedConfig, ModelConfig, OptimConfig, TrainConfig
from scaletrain.options import from_mapping
from scaletrain.training import build_training

settings, out = json.loads(sys.argv[1]), sys.argv[2]
# argv[3] (optional): another model and data set, {"model": ..., "options": {...}, "data": ...,
# "grad_accum_steps": N, "optimizer": ..., "lr": ...}.
other = json.loads(sys.argv[3]) if len(sys.argv) > 3 else None
cfg = TrainConfig(model=ModelConfig(name="gpt", options={"dim": 32, "depth": 4, "heads": 4}),
                  data=DataConfig(name="char-corpus", seq_len=16, train_subset=256),
                  optim=OptimConfig(lr=3e-3, clip_grad_norm=0.5), epochs=2, batch_size=32, progress=False,
                  device="cpu")
if other:
    cfg.model = ModelConfig(name=other["model"], options=other.get("options", {}))
    cfg.data = DataConfig(name=other["data"], train_subset=256)
    cfg.optim.grad_accum_steps = other.get("grad_accum_steps", 1)
    cfg.optim.optimizer, cfg.optim.lr = other.get("optimizer", "adamw"), other.get("lr", cfg.optim.lr)
cfg.distributed = from_mapping(DistributedConfig, settings)   # flat keys, as a TOML file may give them
with build_training(cfg) as built:
    trainer, dataset = built.trainer, built.dataset
    trainer.fit(dataset)
    losses = trainer.counters.read(trainer.steps_per_epoch, trainer.strategy)["losses"]
    # Copies: on a CPU, a state dict's tensors may be the live ones, which the step below changes.
    weights = {k: v.clone() for k, v in trainer.strategy.full_state_dict(trainer.model).items()}
    # One more step's gradients on a fixed batch (each replica its share of it).
    x, y = next(iter(trainer.loader(dataset.train, train=True)))
    trainer.counters.reset_epoch()
    trainer.strategy.forward_backward(trainer.train_step, x, y)
    if trainer.layout.replicas > 1:
        trainer.strategy._average_over_replicas(trainer.train_step.params)
    grads = {name: (p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad).clone()
             for name, p in trainer.model.named_parameters() if p.grad is not None}
    torch.save({"history": trainer.history, "losses": losses, "weights": weights, "grads": grads,
                "layout": trainer.strategy.describe()},
               f"{out}/rank{trainer.strategy.rank}.pt")
