"""Reading a DCP checkpoint without executing code from it.

torch.distributed.checkpoint stores its `.metadata` as a plain pickle, and its default planner
loads non-tensor values with full (unrestricted) unpickling: a crafted checkpoint folder could
run anything on load. We read the metadata through an unpickler that admits only the classes DCP's metadata is
made of (its dataclasses, torch.Size, dtypes, layouts, paths), and non-tensor values with
`weights_only=True` (ours are plain JSON strings). Checkpoints are also verified against their
manifest (store.py) before either happens.
"""

from __future__ import annotations

import io
import pathlib
import pickle

import torch
import torch.distributed.checkpoint.metadata as dcp_metadata
from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

_PATH_CLASSES = {"PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath", "Path"}
_FILESYSTEM_CLASSES = {"_StorageInfo", "_StoragePrefix"}


class UnsafeCheckpoint(pickle.UnpicklingError):
    pass


class MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if module == "torch":
            value = getattr(torch, name, None)
            if name == "Size" or isinstance(value, (torch.dtype, torch.layout, torch.memory_format)):
                return value
        elif module == "torch.serialization" and name == "_get_layout":
            return torch.serialization._get_layout
        elif module == dcp_metadata.__name__:
            value = getattr(dcp_metadata, name, None)
            if isinstance(value, type):
                return value
        elif module == "torch.distributed.checkpoint.filesystem" and name in _FILESYSTEM_CLASSES:
            return super().find_class(module, name)
        elif module == "pathlib" and name in _PATH_CLASSES:
            return getattr(pathlib, name)
        elif module == "collections" and name == "OrderedDict":
            return super().find_class(module, name)
        raise UnsafeCheckpoint(f"checkpoint metadata names {module}.{name}, which a DCP checkpoint never holds")


class SafeFileSystemReader(FileSystemReader):
    def read_metadata(self, *args, **kwargs) -> Metadata:
        rank = kwargs.get("rank")
        with self.fs.create_stream(self._get_metadata_path(rank), "rb") as stream:
            metadata = MetadataUnpickler(stream).load()
        if not isinstance(metadata, Metadata):
            raise UnsafeCheckpoint(f"checkpoint metadata holds a {type(metadata).__name__}, not DCP Metadata")
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class SafeLoadPlanner(DefaultLoadPlanner):
    def load_bytes(self, read_item, value: io.BytesIO) -> None:
        loaded = torch.load(value, weights_only=True)
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
        else:
            self.state_dict[read_item.dest_index.fqn] = loaded
