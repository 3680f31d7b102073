"""Data sets made locally, with no download: MNIST-1D, scikit-learn's digits, synthetic."""

from __future__ import annotations

import torch

from scaletrain.data.cache import cached_tensors
from scaletrain.data.dataset import (
    ArraySplit,
    Dataset,
    as_features,
    as_labels,
    make_dataset,
    random_split,
    with_channel_dim,
)
from scaletrain.data.source import register_dataset
from scaletrain.errors import UserError

# Bumped when the conversion below changes what a cached entry holds (data/cache.py keys on it).
MNIST1D_CONVERSION = 1
DIGITS_CONVERSION = 1


def load_mnist1d(num_samples: int | None = None, seed: int = 42) -> Dataset:
    """MNIST-1D (Greydanus & Kobak) generated with the package's own `make_dataset`.

    Default 5,000 samples with an 80/20 split: the paper's 4,000 train / 1,000 test, length 40.
    The generator's seed is fixed (42, the package default) so every run sees the same data set;
    the run's seed governs weights and data order.
    """
    try:
        from importlib.metadata import version
        generator_version = f"mnist1d {version('mnist1d')}, conversion {MNIST1D_CONVERSION}"
    except ImportError:
        raise UserError("mnist1d: the 'mnist1d' package is not installed; "
                        "run: pip install 'scaletrain[mnist1d]'") from None

    def generate() -> dict[str, torch.Tensor]:
        from mnist1d.data import get_dataset_args
        from mnist1d.data import make_dataset as make_mnist1d
        args = get_dataset_args()
        args.num_samples = num_samples or args.num_samples
        args.seed = seed
        raw = make_mnist1d(args)
        # make_dataset returns float64 arrays; as_features converts them to float32 explicitly.
        return {"x": with_channel_dim(as_features(raw["x"], "mnist1d"), 1),
                "y": as_labels(raw["y"], len(raw["x"]), 10, "mnist1d"),
                "x_test": with_channel_dim(as_features(raw["x_test"], "mnist1d"), 1),
                "y_test": as_labels(raw["y_test"], len(raw["x_test"]), 10, "mnist1d")}

    t = cached_tensors("mnist1d", generator_version, {"num_samples": num_samples, "seed": seed}, generate)
    return make_dataset("mnist1d", ArraySplit(t["x"], t["y"]), ArraySplit(t["x_test"], t["y_test"]), num_classes=10)


def load_digits(seed: int = 0) -> Dataset:
    """scikit-learn's bundled 8x8 digits (1,797 samples), split 80/20 with a fixed seed."""
    try:
        from importlib.metadata import version
        generator_version = f"scikit-learn {version('scikit-learn')}, conversion {DIGITS_CONVERSION}"
    except ImportError:
        raise UserError("digits: scikit-learn is not installed; run: pip install 'scaletrain[digits]'") from None

    def read() -> dict[str, torch.Tensor]:
        from sklearn.datasets import load_digits as sk_load_digits
        bunch = sk_load_digits()
        return {"x": as_features(bunch.images, "digits").unsqueeze(1),
                "y": as_labels(bunch.target, len(bunch.images), 10, "digits")}

    t = cached_tensors("digits", generator_version, {}, read)
    train, test = random_split(t["x"], t["y"], test_fraction=0.2, seed=seed)
    return make_dataset("digits", train, test, num_classes=10)


def load_synthetic(shape: list[int], num_samples: int | None, num_classes: int, seed: int = 0) -> Dataset:
    """Random uint8 images and random labels of any shape: for measuring throughput only."""
    if not shape or any(int(d) < 1 for d in shape):
        raise UserError(f"synthetic: data.shape must be positive sizes like [3, 32, 32], got {shape}")
    if num_classes < 2:
        raise UserError(f"synthetic: data.num_classes must be at least 2, got {num_classes}")
    n = num_samples or 10_000
    g = torch.Generator().manual_seed(seed)
    n_test = max(1, n // 10)
    x = torch.randint(0, 256, (n + n_test, *shape), dtype=torch.uint8, generator=g)
    y = torch.randint(0, num_classes, (n + n_test,), generator=g)
    return make_dataset("synthetic", ArraySplit(x[:n], y[:n]), ArraySplit(x[n:], y[n:]), num_classes)


def load_friedman1(num_samples: int | None, seed: int = 0, noise: float = 1.0) -> Dataset:
    """Friedman's regression benchmark #1 (Friedman 1991; scikit-learn's make_friedman1): ten
    uniform features, five of which matter,
        y = 10 sin(pi x1 x2) + 20 (x3 - 0.5)^2 + 10 x4 + 5 x5 + noise,
    split 80/20. The noise (sd 1) caps the reachable R^2 near 0.96. Targets are standardised with
    the training split's mean and spread, so the MSE is in units of the targets' variance."""
    n = num_samples or 5_000
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 10, generator=g)
    y = (10 * torch.sin(torch.pi * x[:, 0] * x[:, 1]) + 20 * (x[:, 2] - 0.5) ** 2 + 10 * x[:, 3] + 5 * x[:, 4]
         + noise * torch.randn(n, generator=g))
    n_test = max(1, n // 5)
    train_y = y[n_test:]
    y = (y - train_y.mean()) / train_y.std()
    return make_dataset("friedman1", ArraySplit(x[n_test:], y[n_test:]), ArraySplit(x[:n_test], y[:n_test]),
                        num_classes=1, task="regression")


@register_dataset("mnist1d", sample=((1, 40), 10, "classification"))
def _mnist1d(cfg, seed: int) -> Dataset:
    return load_mnist1d(cfg.num_samples)


@register_dataset("digits", sample=((1, 8, 8), 10, "classification"))
def _digits(cfg, seed: int) -> Dataset:
    return load_digits(seed=0)


@register_dataset("synthetic", sample=lambda cfg: (tuple(cfg.shape), cfg.num_classes, "classification"))
def _synthetic(cfg, seed: int) -> Dataset:
    return load_synthetic(cfg.shape, cfg.num_samples, cfg.num_classes, seed=seed)


@register_dataset("friedman1", sample=((10,), 1, "regression"))
def _friedman1(cfg, seed: int) -> Dataset:
    return load_friedman1(cfg.num_samples)
