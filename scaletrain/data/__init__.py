"""Data: built-in data sets, device-resident and streaming loaders, on-device augmentation."""

from scaletrain.data.dataset import ArraySplit, Dataset, as_features, as_labels, make_dataset
from scaletrain.data.loaders import DeviceLoader, Normalizer, StreamingLoader, choose_placement
from scaletrain.data.registry import load_dataset, sample_shape
from scaletrain.data.source import DATA_SOURCES, register_dataset

__all__ = ["DATA_SOURCES", "ArraySplit", "Dataset", "DeviceLoader", "Normalizer", "StreamingLoader",
           "as_features", "as_labels", "choose_placement", "load_dataset", "make_dataset",
           "register_dataset", "sample_shape"]
