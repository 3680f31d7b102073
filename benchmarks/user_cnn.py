"""A model as a user writes one, outside scaletrain's registry, for the measurements that must
hold on a user's model too (BENCHMARKS.md, "Autotune ... a user model"): a small 1-D ConvNet for
MNIST-1D's signals (1 x 40), plain torch.

    PYTHONPATH=benchmarks scaletrain autotune --model user_cnn:build
"""

from torch import nn


def build(input_shape, num_classes, width=32):
    channels, length = input_shape
    return nn.Sequential(
        nn.Conv1d(channels, width, 5, padding=2), nn.BatchNorm1d(width), nn.ReLU(),
        nn.Conv1d(width, width, 5, padding=2), nn.BatchNorm1d(width), nn.ReLU(), nn.MaxPool1d(2),
        nn.Conv1d(width, 2 * width, 3, padding=1), nn.BatchNorm1d(2 * width), nn.ReLU(),
        nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(2 * width, num_classes))
