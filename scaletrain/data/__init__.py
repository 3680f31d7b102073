"""Data: built-in data sets, device-resident and streaming loaders, on-device augmentation."""

from scaletrain.data.dataset import ArraySplit, Dataset, as_features, as_labels, make_dataset
from scaletrain.data.loaders import DeviceLoader, Normalizer, StreamingLoader, choose_placement
from scaletrain.data.registry import DATASETS, load_dataset

__all__ = ["DATASETS", "ArraySplit", "Dataset", "DeviceLoader", "Normalizer", "StreamingLoader",
           "as_features", "as_labels", "choose_placement", "load_dataset", "make_dataset"]
