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


class UnreadableCheckpoint(ValueError):
    """A checkpoint file whose bytes are not what its metadata says (truncated, replaced, altered
    after its manifest was written): named, one line."""


class SafeFileSystemReader(FileSystemReader):
    def read_metadata(self, *args, **kwargs) -> Metadata:
        rank = kwargs.get("rank")
        path = self._get_metadata_path(rank)
        try:
            with self.fs.create_stream(path, "rb") as stream:
                metadata = MetadataUnpickler(stream).load()
        except UnsafeCheckpoint:
            raise
        except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError, KeyError,
                RecursionError, MemoryError) as exc:
            raise UnreadableCheckpoint(f"{pathlib.Path(path).name} is not DCP metadata ({type(exc).__name__}: "
                                       f"{(str(exc).splitlines() or [''])[0][:120]})") from None
        if not isinstance(metadata, Metadata):
            raise UnsafeCheckpoint(f"checkpoint metadata holds a {type(metadata).__name__}, not DCP Metadata")
        self._check_bounds(metadata)
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata

    def _check_bounds(self, metadata: Metadata) -> None:
        """Every item the metadata places in a file lies inside that file, in the folder: a file
        cut short or swapped for a smaller one is named before anything is read from it."""
        root = pathlib.Path(str(self.path))
        sizes: dict[str, int] = {}
        for info in (metadata.storage_data or {}).values():
            name = str(getattr(info, "relative_path", ""))
            file = root / name
            if not name or pathlib.Path(name).is_absolute() or ".." in pathlib.Path(name).parts:
                raise UnsafeCheckpoint(f"checkpoint metadata points outside its folder ({name!r})")
            if name not in sizes:
                sizes[name] = file.stat().st_size if file.is_file() else -1
            if sizes[name] < 0:
                raise UnreadableCheckpoint(f"{name} is missing")
            end = int(getattr(info, "offset", 0)) + int(getattr(info, "length", 0))
            if getattr(info, "offset", 0) < 0 or end > sizes[name]:
                raise UnreadableCheckpoint(f"{name} holds {sizes[name]} bytes; its metadata reads up to byte {end}")

    def read_data(self, plan, planner):
        """DCP's reading, file by file, so that a file whose bytes are not a tensor (a pickle put in
        its place) is named, with what was wrong, instead of an EOFError deep in DCP."""
        from dataclasses import replace

        from torch.futures import Future
        per_file: dict[str, list] = {}
        for item in plan.items:
            per_file.setdefault(str(self.storage_data[item.storage_index].relative_path), []).append(item)
        for name, items in per_file.items():
            try:
                super().read_data(replace(plan, items=items), planner).wait()
            except (pickle.UnpicklingError, EOFError, ValueError, TypeError, RuntimeError, OSError, KeyError,
                    IndexError, AttributeError, RecursionError) as exc:
                raise UnreadableCheckpoint(f"{name} could not be read as the tensors its metadata names "
                                           f"({type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:120]})") \
                    from None
        done = Future()
        done.set_result(None)
        return done


def load_checkpoint(state: dict, path, planner=None, process_group=None) -> None:
    """`dcp.load` through the safe reader; a file that is not what its metadata says is one line
    (a UserError naming the checkpoint and the file), whatever layer of DCP met it."""
    import torch.distributed.checkpoint as dcp

    from scaletrain.errors import UserError
    try:
        dcp.load(state, storage_reader=SafeFileSystemReader(str(path)), planner=planner or SafeLoadPlanner(),
                 process_group=process_group)
    except UnsafeCheckpoint as exc:
        raise UserError(f"checkpoint {path} was refused: {exc}; it was not written by scaletrain's DCP "
                        "checkpointer, so nothing in it was run") from None
    except BaseException as exc:
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        found = _unreadable(exc)
        if found is None:
            raise
        raise UserError(f"checkpoint {path} is damaged: {found}; it was altered after it was written (its manifest "
                        "too), so it is not resumed: use an older checkpoint (--resume PATH) or start afresh") from None


def _unreadable(exc: BaseException) -> str | None:
    """The UnreadableCheckpoint under `exc`: DCP wraps a rank's error in a CheckpointException
    (its `failures`), or chains it."""
    seen: set[int] = set()
    todo = [exc]
    while todo:
        e = todo.pop()
        if isinstance(e, tuple):          # CheckpointException.failures: rank -> (exception, traceback)
            e = next((part for part in e if isinstance(part, BaseException)), None)
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, UnreadableCheckpoint):
            return str(e)
        todo += [e.__cause__, e.__context__, *getattr(e, "failures", {}).values()]
    return None


class SafeLoadPlanner(DefaultLoadPlanner):
    def load_bytes(self, read_item, value: io.BytesIO) -> None:
        loaded = torch.load(value, weights_only=True)
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
        else:
            self.state_dict[read_item.dest_index.fqn] = loaded
