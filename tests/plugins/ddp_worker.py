"""A torchrun worker built on the Python API (the tests launch it with the real `torchrun`).

Trains the digits MLP with the `ddp` strategy, then writes this rank's weights and the sharded
evaluation of the final model to OUT/rank{r}.pt, so the test can compare replicas with each other
and with a single-process evaluation.
"""

import gc
import sys

import torch

from scaletrain.config import DataConfig, ModelConfig, OptimConfig, TrainConfig
from scaletrain.training import build_training

out = sys.argv[1]
cfg = TrainConfig(model=ModelConfig(name="mlp", options={"hidden": [64]}), data=DataConfig(name="digits"),
                  optim=OptimConfig(lr=3e-3), epochs=2, batch_size=64, progress=False, device="cpu")
cfg.distributed.strategy = "ddp"
built = build_training(cfg)   # the trainer sets the strategy up, so it tears it down (close)
trainer, dataset = built.trainer, built.dataset
trainer.fit(dataset)
result = {"state": trainer.model.state_dict(), "eval": trainer.evaluate(dataset), "history": trainer.history}
torch.save(result, f"{out}/rank{trainer.strategy.rank}.pt")
built.close()
# As the CLI does: free the DDP reducer's work objects before interpreter finalization.
del trainer, result
gc.collect()
