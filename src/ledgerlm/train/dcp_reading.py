"""Reading a DCP checkpoint without running code: its ``.metadata`` file is a pickle
PyTorch writes, read here by an unpickler that accepts DCP's own metadata classes only;
the other values DCP stores as bytes are loaded with ``weights_only``."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import torch

# The classes a DCP ``.metadata`` file may name; loading refuses any other (it is a
# pickle, and an unrestricted unpickler would run whatever a tampered file asks for).
_DCP_CLASSES = {
    "torch.distributed.checkpoint.metadata": {
        "Metadata",
        "MetadataIndex",
        "StorageMeta",
        "TensorProperties",
        "TensorStorageMetadata",
        "BytesStorageMetadata",
        "ChunkStorageMetadata",
        "_MEM_FORMAT_ENCODING",
    },
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.serialization": {"_get_layout"},
    "torch": {"Size"},
    "pathlib": {"Path", "PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath"},
    "collections": {"OrderedDict"},
}


class MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        allowed = name in _DCP_CLASSES.get(module, ())
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            allowed = True
        if not allowed:
            raise pickle.UnpicklingError(f"a DCP checkpoint may not name {module}.{name}")
        return super().find_class(module, name)


def safe_dcp_reading(folder: Path) -> tuple[Any, Any]:
    """A DCP reader and load planner that unpickle nothing but DCP's own metadata
    classes and plain values (tensors are read with ``weights_only`` by DCP itself)."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint._traverse import set_element
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
    from torch.distributed.checkpoint.metadata import StorageMeta

    class Reader(FileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            rank = kwargs.get("rank")
            name = ".metadata" if rank is None else f"__{rank}.metadata"
            with open(Path(self.path) / name, "rb") as f:
                metadata = MetadataUnpickler(f).load()
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    class Planner(DefaultLoadPlanner):
        def load_bytes(self, read_item: Any, value: Any) -> None:
            obj = torch.load(value, weights_only=True)  # ints, floats, lists, dicts
            if self.flatten_state_dict:
                set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
            else:
                self.state_dict[read_item.dest_index.fqn] = obj

    return Reader(folder), Planner()
