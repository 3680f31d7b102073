"""A torchrun worker: trains the digits MLP under the strategy named in argv[1] and writes, per
rank, the epoch history, the full final weights and the bytes this rank really holds for
parameters, gradients and optimizer state (after a step, gradients kept), for the planner test."""

import gc
import sys

import torch

from scaletrain.config import DataConfig, ModelConfig, OptimConfig, TrainConfig
from scaletrain.data import load_dataset
from scaletrain.models import build_model
from scaletrain.training import Trainer

strategy, out = sys.argv[1], sys.argv[2]
cfg = TrainConfig(model=ModelConfig(name="mlp", options={"hidden": [64, 32]}), data=DataConfig(name="digits"),
                  optim=OptimConfig(lr=3e-3), epochs=1, batch_size=64, progress=False, device="cpu")
cfg.distributed.strategy = strategy
dataset = load_dataset(cfg.data)
torch.manual_seed(cfg.seed)
model = build_model("mlp", dataset.input_shape, dataset.num_classes, **cfg.model.options)
trainer = Trainer(model, cfg)
trainer.fit(dataset)


def local_bytes(t):
    t = t.to_local() if hasattr(t, "to_local") else t
    return t.numel() * t.element_size()


# One more step with gradients kept, to see their real (sharded or replicated) size.
x, y = next(iter(trainer._loader(dataset.train, train=True)))
with trainer.policy.autocast(trainer.device):
    loss = torch.nn.functional.cross_entropy(trainer.forward(x).float(), y)
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
trainer.strategy.teardown()
# As the CLI does: free the wrappers' work objects before interpreter finalization.
del trainer, model, weights
gc.collect()
