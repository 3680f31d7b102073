"""Batch norm over the global batch on any device.

torch's nn.SyncBatchNorm (fused CUDA kernels) is used on GPUs; it refuses CPU tensors, and DDP
refuses it on CPU modules. `GlobalBatchNorm` is the same computation for gloo: per-channel sum,
sum of squares and count are all-reduced with the *differentiable* all-reduce, so both the
normalisation and its gradient see every replica's samples. Its state dict is BatchNorm's, so the
exported model loads into the plain model.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_nn
from torch import nn


class GlobalBatchNorm(nn.modules.batchnorm._BatchNorm):
    def _check_input_dim(self, x: torch.Tensor) -> None:
        if x.dim() < 2:
            raise ValueError(f"expected at least 2-D input (got {x.dim()}-D)")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or not dist.is_initialized() or dist.get_world_size() == 1:
            return super().forward(x)
        channels = x.shape[1]
        dims = [0, *range(2, x.dim())]
        xf = x.float()
        count = torch.full((1,), x.numel() / channels, dtype=torch.float32, device=x.device)
        stats = dist_nn.all_reduce(torch.cat([xf.sum(dims), (xf * xf).sum(dims), count]))
        n = stats[-1]
        mean = stats[:channels] / n
        var = (stats[channels:2 * channels] / n - mean * mean).clamp_min(0)
        if self.track_running_stats:
            with torch.no_grad():
                self.num_batches_tracked.add_(1)
                factor = self.momentum if self.momentum is not None else 1.0 / float(self.num_batches_tracked)
                self.running_mean.lerp_(mean.to(self.running_mean.dtype), factor)
                self.running_var.lerp_((var * n / (n - 1)).to(self.running_var.dtype), factor)
        shape = (1, channels) + (1,) * (x.dim() - 2)
        y = (xf - mean.view(shape)) * torch.rsqrt(var.view(shape) + self.eps)
        if self.affine:
            y = y * self.weight.view(shape) + self.bias.view(shape)
        return y.to(x.dtype)


def convert_to_global_batchnorm(module: nn.Module) -> nn.Module:
    """Replaces every BatchNorm1d/2d/3d (in place, recursively) by a GlobalBatchNorm sharing its
    parameters and buffers."""
    if isinstance(module, nn.modules.batchnorm._BatchNorm) and not isinstance(module, GlobalBatchNorm):
        new = GlobalBatchNorm(module.num_features, module.eps, module.momentum, module.affine,
                              module.track_running_stats)
        if module.affine:
            new.weight, new.bias = module.weight, module.bias
        if module.track_running_stats:
            new.running_mean, new.running_var = module.running_mean, module.running_var
            new.num_batches_tracked = module.num_batches_tracked
        new.train(module.training)
        return new
    for name, child in module.named_children():
        setattr(module, name, convert_to_global_batchnorm(child))
    return module
