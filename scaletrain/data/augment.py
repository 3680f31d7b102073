"""Augmentation on the device: random shifts (pad and crop) and horizontal flips, per sample,
vectorised over the batch, so augmentation never sends data back to the host (airbench's trick)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


class DeviceAugment:
    def __init__(self, kinds: list[str] | tuple[str, ...], shift: int, generator: torch.Generator):
        self.shift_enabled = "shift" in kinds and shift > 0
        self.flip_enabled = "flip" in kinds
        self.shift = shift
        self.generator = generator

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.shift_enabled:
            x = self._random_shift(x)
        if self.flip_enabled:
            flip = torch.rand(x.shape[0], device=self.generator.device, generator=self.generator).to(x.device) < 0.5
            flip = flip.view(-1, *([1] * (x.ndim - 1)))
            x = torch.where(flip, x.flip(-1), x)
        return x

    def _offsets(self, n: int, device) -> torch.Tensor:
        # Drawn where the generator lives (the device, or the CPU for an XLA device: loaders.py).
        return torch.randint(0, 2 * self.shift + 1, (n,), device=self.generator.device,
                             generator=self.generator).to(device)

    def _random_shift(self, x: torch.Tensor) -> torch.Tensor:
        s, n = self.shift, x.shape[0]
        if x.ndim == 3:  # (N, C, L): shift along the sequence
            length = x.shape[-1]
            padded = F.pad(x, (s, s))
            cols = self._offsets(n, x.device)[:, None] + torch.arange(length, device=x.device)
            return padded.gather(2, cols[:, None, :].expand(n, x.shape[1], length))
        if x.ndim == 4:  # (N, C, H, W): shift in both directions
            _, c, h, w = x.shape
            padded = F.pad(x, (s, s, s, s))
            rows = self._offsets(n, x.device)[:, None] + torch.arange(h, device=x.device)
            cols = self._offsets(n, x.device)[:, None] + torch.arange(w, device=x.device)
            x = padded.gather(2, rows[:, None, :, None].expand(n, c, h, w + 2 * s))
            return x.gather(3, cols[:, None, None, :].expand(n, c, h, w))
        return x
