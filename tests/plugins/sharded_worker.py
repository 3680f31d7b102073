"""A torchrun worker: trains the digits MLP under the strategy named in argv[1] and writes, per
rank, the epoch history, the full final weights and the bytes this rank really holds for
parameters, gradients and optimizer state (after a step, gradients kept), for the planner test."""

import gc
import sys

import torch

from scaletrain.config import DataConfig, ModelConfig, OptimConfig, TrainConfig
from scaletrain.training import build_training

strategy, out = sys.argv[1], sys.argv[2]
cfg = TrainConfig(model=ModelConfig(name="mlp", options={"hidden": [64, 32]}), data=DataConfig(name="digits"),
                  optim=OptimConfig(lr=3e-3), epochs=1, batch_size=64, progress=False, device="cpu")
cfg.distributed.strategy = strategy
built = build_training(cfg)
trainer, dataset, model = built.trainer, built.dataset, built.trainer.model
trainer.fit(dataset)


def local_bytes(t):
    t = t.to_local() if hasattr(t, "to_local") else t
    return t.numel() * t.element_size()


# One more step with gradients kept, to see their real (sharded or replicated) size.
x, y = next(iter(trainer.loader(dataset.train, train=True)))
loss, _ = trainer.train_step.forward_loss(x, y)   # the fitted trainer's own step: forward and loss
loss.backward()
held = {
    "param_bytes": sum(local_bytes(p) for p in trainer.model.parameters()),
    "grad_bytes": sum(local_bytes(p.grad) for p in trainer.model.parameters() if p.grad is not None),
    "optimizer_bytes": sum(local_bytes(v) for s in trainer.optimizer.state.values() for v in s.values()
                           if isinstance(v, torch.Tensor)),
}
weights = trainer.strategy.full_state_dict(trainer.model)
torch.save({"history": trainer.history, "held": held, "weights": weights,
            "shapes": [tuple(p.shape) for p in model.parameters()]}, f"{out}/rank{trainer.strategy.rank}.pt")
built.close()
# As the CLI does: free the wrappers' work objects before interpreter finalization.
del trainer, model, weights
gc.collect()
