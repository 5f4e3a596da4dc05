"""Hypothesis strategies and sharding assertions for meshplan users' test suites.

Needs hypothesis (``pip install meshplan[testing]``). Written in the style of
``hypothesis.extra.numpy``: keyword-only ``min_*`` / ``max_*`` bounds,
arguments checked when a strategy is built (``InvalidArgument`` naming the
argument), strategies composed from built-ins so they shrink well, and each
docstring says what its examples shrink to.

Example:
  >>> from hypothesis import given
  >>> from meshplan.testing import partition_specs, sharded_trees, assert_specs_valid
  >>> @given(sharded_trees(mesh_shape={"dp": 2, "tp": 4}))
  ... def test_specs_store(case):
  ...     assert_specs_valid(case.tree, case.specs, case.axis_sizes)
  >>> test_specs_store()
"""

from meshplan._testing._asserts import assert_fits, assert_sharded_as, assert_specs_valid
from meshplan._testing._live import mesh_for, meshes
from meshplan._testing._meshes import (
    AXIS_NAMES,
    HostSplit,
    MeshDims,
    axis_names,
    device_counts,
    device_layouts,
    factorizations,
    host_splits,
    hybrid_mesh_shapes,
    mesh_shapes,
)
from meshplan._testing._specs import (
    SPEC_FAULTS,
    InvalidSpec,
    array_shapes_for,
    invalid_partition_specs,
    partition_specs,
)
from meshplan._testing._trees import (
    DTYPES,
    FAMILIES,
    PARAM_NAMES,
    ShardedTree,
    clusters,
    model_specs,
    shape_dtype_trees,
    sharded_trees,
)

__all__ = [
    # meshes
    "AXIS_NAMES", "HostSplit", "MeshDims", "axis_names", "device_counts", "device_layouts",
    "factorizations", "host_splits", "hybrid_mesh_shapes", "mesh_for", "mesh_shapes", "meshes",
    # specs and arrays
    "SPEC_FAULTS", "InvalidSpec", "array_shapes_for", "invalid_partition_specs", "partition_specs",
    # trees
    "DTYPES", "FAMILIES", "PARAM_NAMES", "ShardedTree", "clusters", "model_specs", "shape_dtype_trees",
    "sharded_trees",
    # assertions
    "assert_fits", "assert_sharded_as", "assert_specs_valid",
]
