"""A torchrun worker: trains the digits MLP under the strategy named in argv[1] (`fsdp+offload`:
with --cpu-offload) and writes, per
rank, the epoch history, the full final weights and the bytes this rank really holds for
parameters, gradients and optimizer state (after a step, gradients kept), for the planner test,
and the bytes FSDP2 all-gathered and reduce-scattered in that step's forward and backward, for
the scaling predictor's test."""

import gc
import os
import sys

import torch

from scaletrain.config import DataConfig, ModelConfig, OptimConfig, TrainConfig
from scaletrain.training import build_training

# "fsdp+offload": fsdp with its shards in host memory (--cpu-offload).
(strategy, _, variant), out = sys.argv[1].partition("+"), sys.argv[2]
cfg = TrainConfig(model=ModelConfig(name="mlp", options={"hidden": [64, 32]}), data=DataConfig(name="digits"),
                  optim=OptimConfig(lr=3e-3), epochs=1, batch_size=64, progress=False, device="cpu")
cfg.distributed.strategy = strategy
cfg.distributed.fsdp.cpu_offload = variant == "offload"
built = build_training(cfg)
trainer, dataset, model = built.trainer, built.dataset, built.trainer.model
trainer.fit(dataset)


def local_bytes(t):
    t = t.to_local() if hasattr(t, "to_local") else t
    return t.numel() * t.element_size()


# One more step with gradients kept, to see their real (sharded or replicated) size. FSDP2's
# collectives (torch.distributed's all_gather_single and reduce_scatter_single) counted meanwhile.
sent = {"all_gather": 0, "reduce_scatter": 0}


def counted(kind, collective, whole):
    def call(*args, **kwargs):
        tensor = kwargs[whole] if whole in kwargs else args[0 if kind == "all_gather" else 1]
        sent[kind] += tensor.numel() * tensor.element_size()
        return collective(*args, **kwargs)
    return call


originals = {"all_gather_single": torch.distributed.all_gather_single,
             "reduce_scatter_single": torch.distributed.reduce_scatter_single}
torch.distributed.all_gather_single = counted("all_gather", originals["all_gather_single"], "output_tensor")
torch.distributed.reduce_scatter_single = counted("reduce_scatter", originals["reduce_scatter_single"], "input")
x, y = next(iter(trainer.loader(dataset.train, train=True)))
loss, _ = trainer.train_step.forward_loss(x, y)   # the fitted trainer's own step: forward and loss
loss.backward()
for name, collective in originals.items():
    setattr(torch.distributed, name, collective)
held = {
    "param_bytes": sum(local_bytes(p) for p in trainer.model.parameters()),
    "grad_bytes": sum(local_bytes(p.grad) for p in trainer.model.parameters() if p.grad is not None),
    "optimizer_bytes": sum(local_bytes(v) for s in trainer.optimizer.state.values() for v in s.values()
                           if isinstance(v, torch.Tensor)),
}
# The offload policy each FSDP unit really has (private FSDP2 state: what the test checks was applied).
policies = sorted({type(m._get_fsdp_state()._fsdp_param_group.offload_policy).__name__
                   for m in trainer.model.modules() if hasattr(m, "_get_fsdp_state")
                   and m._get_fsdp_state()._fsdp_param_group is not None})
weights = trainer.strategy.full_state_dict(trainer.model)
torch.save({"history": trainer.history, "held": held, "weights": weights, "offload_policies": policies,
            "shapes": [tuple(p.shape) for p in model.parameters()], "collective_bytes": sent},
           f"{out}/rank{trainer.strategy.rank}.pt")
built.close()
# As the CLI does: free the wrappers' work objects before interpreter finalization.
del trainer, model, weights
gc.collect()
# And leave as the CLI's workers do (scaletrain/__main__.py): once everything is written, skip the
# interpreter's teardown, where gloo's threads can still be joinable ("terminate called without
# an active exception", exit -6; seen once here under two test workers).
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
