"""PartitionSpecs over shapes: spec entries and shard geometry, leaf facts, dtypes, validation, per-device
memory (arrays and training state) and host batch slices. Builds on :mod:`meshplan.pure.mesh`.
"""

from meshplan.pure.specs._activation import (
    ACTIVATION_NAMES,
    activation_layout,
    ActivationLayout,
    ActivationSpec,
    LAYER_ACTIVATION_NAMES,
    layer_activation_specs,
)
from meshplan.pure.specs._batch import batch_partition_spec, host_batch_slices, HostBatchSlice
from meshplan.pure.specs._dtypes import array_bytes, canonical_dtype, dtype_bits, dtype_storage_bytes
from meshplan.pure.specs._geometry import (
    canonical_entries,
    shard_geometry,
    shard_shape,
    ShardGeometry,
    spec_axes,
    spec_from_entries,
    UNCONSTRAINED,
)
from meshplan.pure.specs._memory import estimate_memory, MemoryEstimate, validate_and_estimate
from meshplan.pure.specs._training import (
    estimate_training_memory,
    optimizer_state_specs,
    TrainingLayout,
    TrainingMemoryEstimate,
)
from meshplan.pure.specs._tree import leaf_info, LeafInfo, path_str, tree_facts, TreeFacts
from meshplan.pure.specs._validate import check_specs, Finding, FINDING_KINDS, validate_specs

__all__ = [
    "ACTIVATION_NAMES",
    "activation_layout",
    "ActivationLayout",
    "ActivationSpec",
    "LAYER_ACTIVATION_NAMES",
    "layer_activation_specs",
    "array_bytes",
    "batch_partition_spec",
    "canonical_dtype",
    "canonical_entries",
    "check_specs",
    "dtype_bits",
    "dtype_storage_bytes",
    "estimate_memory",
    "estimate_training_memory",
    "Finding",
    "FINDING_KINDS",
    "host_batch_slices",
    "HostBatchSlice",
    "leaf_info",
    "LeafInfo",
    "MemoryEstimate",
    "optimizer_state_specs",
    "path_str",
    "shard_geometry",
    "shard_shape",
    "ShardGeometry",
    "spec_axes",
    "spec_from_entries",
    "TrainingLayout",
    "TrainingMemoryEstimate",
    "tree_facts",
    "TreeFacts",
    "UNCONSTRAINED",
    "validate_and_estimate",
    "validate_specs",
]
