"""`--strategy spmd --device xla`: data parallel over every XLA device of this host, in one
process, through torch_xla's SPMD (GSPMD), as torch_xla recommends for data parallelism now: a
1-D mesh over the devices, each batch's inputs sharded along their first dimension, every
parameter replicated (unannotated). XLA's partitioner then compiles one program that runs on
every device and all-reduces the gradients itself, so the step's math is one device's on the
whole batch: the trainer sees one replica of the global batch.

Seed 000's TPUStrategy is this: one program over every core of a TPU. On this project's machines
the devices are XLA on a CPU (`PJRT_DEVICE=CPU`, `CPU_NUM_DEVICES=N`); a TPU never ran.
"""

from __future__ import annotations

import torch

from scaletrain.accelerators import xla
from scaletrain.distributed.strategies.base import Strategy, register_strategy
from scaletrain.errors import ConfigError
from scaletrain.inputs import map_inputs


@register_strategy("spmd")
class Spmd(Strategy):
    traffic = "all-reduce"
    memory_plan = None    # the planner models CUDA and CPU memory, not XLA's (plan-memory says so)
    supports_cuda_graphs = False
    device_types = ("xla",)

    @classmethod
    def layout_problem(cls, layout, config) -> str | None:
        if layout.world > 1:
            return (f"--strategy spmd runs in one process, which drives every XLA device; drop --nproc "
                    f"(asked for {layout.world})")
        return None

    def setup(self, device_request: str) -> torch.device:
        # Before any XLA tensor exists (device_types: the Trainer and the launch refuse any other device first).
        xla.use_spmd()
        self.device = xla.device()
        self.devices = xla.device_count()
        self.mesh = xla.batch_mesh(self.devices)
        return self.device

    def describe(self) -> str | None:
        return f"spmd over {self.devices} XLA device(s), batch sharded, parameters replicated"

    def wrap(self, model, compile_fn, block_classes=(), policy=None):
        forward = compile_fn(model)

        def train_forward(x):
            return forward(map_inputs(self.shard_training_batch, x))

        def eval_forward(x):
            return forward(map_inputs(self.shard_batch, x))
        return train_forward, eval_forward

    def shard_training_batch(self, t: torch.Tensor) -> torch.Tensor:
        if t.shape[0] % self.devices:   # the host's device count is known only here, at the first step
            raise ConfigError(f"--strategy spmd: a training batch of {t.shape[0]} does not split over the "
                              f"{self.devices} XLA devices; use a batch size that is a multiple of the device count")
        return xla.shard_along_batch(t, self.mesh)

    def shard_batch(self, t: torch.Tensor) -> torch.Tensor:
        """`t` split along its first (batch) dimension over the mesh, whole along the others; an
        evaluation's last, smaller batch that does not split is left whole on every device."""
        return xla.shard_along_batch(t, self.mesh) if t.shape[0] % self.devices == 0 else t
