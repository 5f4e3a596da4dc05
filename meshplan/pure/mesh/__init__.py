"""Mesh shapes: -1 inference, mesh strings, host/granule splits, hybrid ICI/DCN shapes, device layout,
mesh selectors and axis types. Depends on nothing else in :mod:`meshplan.pure`.
"""

from meshplan.pure.mesh._axes import infer_axis_dims, MeshShape, resolve_mesh_shape, validate_axis_names
from meshplan.pure.mesh._axis_types import canonicalize_axis_types
from meshplan.pure.mesh._hybrid import HybridMeshShape, reconcile_dcn, resolve_hybrid, split_mesh_shape
from meshplan.pure.mesh._hosts import arrange_host_blocks, host_block_problems, place_granules
from meshplan.pure.mesh._layout import DeviceInfo, granule_device_ids, group_granules, layout_device_ids
from meshplan.pure.mesh._parse import format_mesh_string, parse_mesh_string
from meshplan.pure.mesh._pipeline_axis import PIPELINE_AXIS_NAMES, pipeline_axis
from meshplan.pure.mesh._request import MeshRequest, resolve_mesh_request
from meshplan.pure.mesh._selectors import select_mesh_shape, validate_mesh_rules
from meshplan.pure.mesh._split import per_host_mesh_shape, prime_factors, split_over_granules

__all__ = [
    "arrange_host_blocks",
    "canonicalize_axis_types",
    "DeviceInfo",
    "format_mesh_string",
    "granule_device_ids",
    "group_granules",
    "host_block_problems",
    "HybridMeshShape",
    "infer_axis_dims",
    "layout_device_ids",
    "MeshRequest",
    "MeshShape",
    "parse_mesh_string",
    "per_host_mesh_shape",
    "place_granules",
    "prime_factors",
    "reconcile_dcn",
    "resolve_hybrid",
    "resolve_mesh_request",
    "resolve_mesh_shape",
    "select_mesh_shape",
    "split_mesh_shape",
    "split_over_granules",
    "validate_axis_names",
    "validate_mesh_rules",
]
__all__ += ["PIPELINE_AXIS_NAMES", "pipeline_axis"]
