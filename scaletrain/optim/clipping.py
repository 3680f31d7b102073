"""The gradient norm that clipping scales by, computed one way wherever the gradients live."""

from __future__ import annotations

import torch


def squared_norm(tensors: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    """The tensors' total squared L2 norm, as a float64 sum of the squares of their float32 norms.

    One device, replicas, pipeline stages and tensor-parallel shards all sum these terms, only
    split differently; in float64 the split changes the float32 clip factor practically never. A
    float32 norm of norms (torch's `clip_grad_norm_`) rounds by the CPU's vector width instead, so
    a pipeline and one device clipped by factors a few ulps apart, which BatchNorm grew into 1e-5
    weight differences within two epochs on AVX2 (not on AVX-512)."""
    if not tensors:
        return torch.zeros((), dtype=torch.float64, device=device)
    return torch.stack(torch._foreach_norm(tensors)).double().square().sum()
