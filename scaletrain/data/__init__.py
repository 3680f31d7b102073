"""Data: built-in data sets, device-resident and streaming loaders, on-device augmentation."""

from typing import TYPE_CHECKING

from scaletrain.lazy import lazy_exports

_EXPORTS = {
    "DATA_SOURCES": "scaletrain.data.source",
    "ArraySplit": "scaletrain.data.dataset",
    "Dataset": "scaletrain.data.dataset",
    "DeviceLoader": "scaletrain.data.loaders",
    "Normalizer": "scaletrain.data.loaders",
    "StreamingLoader": "scaletrain.data.loaders",
    "as_features": "scaletrain.data.dataset",
    "as_labels": "scaletrain.data.dataset",
    "choose_placement": "scaletrain.data.loader_choice",
    "load_dataset": "scaletrain.data.registry",
    "loader_class": "scaletrain.data.loader_choice",
    "make_dataset": "scaletrain.data.dataset",
    "register_dataset": "scaletrain.data.source",
    "sample_shape": "scaletrain.data.registry",
    "workers_end_on_stop": "scaletrain.data.loaders",
}
__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

if TYPE_CHECKING:
    from scaletrain.data.dataset import ArraySplit, Dataset, as_features, as_labels, make_dataset
    from scaletrain.data.loader_choice import choose_placement, loader_class
    from scaletrain.data.loaders import DeviceLoader, Normalizer, StreamingLoader, workers_end_on_stop
    from scaletrain.data.registry import load_dataset, sample_shape
    from scaletrain.data.source import DATA_SOURCES, register_dataset
