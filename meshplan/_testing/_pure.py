"""The meshplan.pure names the strategies use, read from public modules only.

meshplan.pure re-exports headline names; the rest live in its public
subpackages (``meshplan.pure.mesh``, ``.specs``, ``.search``, ``.presets``).
Each name is looked up in ``meshplan.pure`` first, then in its subpackage,
so the strategies keep working while names move between the two.
"""

from __future__ import annotations

import importlib
from typing import Any

import meshplan.pure as _top

__all__ = ["Cluster", "DEVICE_SPECS", "DeviceInfo", "HybridMeshShape", "MLADims", "MeshShape", "ModelSpec",
           "array_bytes", "estimate_memory", "path_str", "shard_shape", "validate_specs"]

_HOME = {
    "Cluster": "search", "DEVICE_SPECS": "search", "DeviceInfo": "mesh", "HybridMeshShape": "mesh",
    "MLADims": "presets", "MeshShape": "mesh", "ModelSpec": "presets", "array_bytes": "specs",
    "estimate_memory": "specs", "path_str": "specs", "shard_shape": "specs", "validate_specs": "specs",
}


def _public(name: str) -> Any:
    if hasattr(_top, name):
        return getattr(_top, name)
    return getattr(importlib.import_module(f"meshplan.pure.{_HOME[name]}"), name)


Cluster = _public("Cluster")
DEVICE_SPECS = _public("DEVICE_SPECS")
DeviceInfo = _public("DeviceInfo")
HybridMeshShape = _public("HybridMeshShape")
MLADims = _public("MLADims")
MeshShape = _public("MeshShape")
ModelSpec = _public("ModelSpec")
array_bytes = _public("array_bytes")
estimate_memory = _public("estimate_memory")
path_str = _public("path_str")
shard_shape = _public("shard_shape")
validate_specs = _public("validate_specs")
