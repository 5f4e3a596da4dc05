"""Strategies for parameter trees, sharded trees, model specs and clusters."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from hypothesis import strategies as st

from meshplan._testing._check import (
    InvalidArgument,
    check_axis_sizes,
    check_bool,
    check_int,
    check_order,
    check_strategy,
)
from meshplan._testing._meshes import mesh_shapes
from meshplan._testing._specs import array_shapes_for, partition_specs
from meshplan.pure.presets import MLADims, ModelSpec
from meshplan.pure.errors import ClusterError
from meshplan.pure.cluster import Cluster, DEVICE_SPECS, parse_cluster

__all__ = ["DTYPES", "FAMILIES", "PARAM_NAMES", "ShardedTree", "clusters", "model_specs",
           "shape_dtype_trees", "sharded_trees"]

# Leaf dtypes seen in checkpoints; float32 first, so trees shrink to it.
DTYPES: tuple[Any, ...] = (jnp.float32, jnp.bfloat16, jnp.float16, jnp.float8_e4m3fn, jnp.float8_e5m2,
                           jnp.int8, jnp.int4, jnp.int32)
# Names from Flax / Hugging Face parameter paths; "kernel" first, so trees shrink to it.
PARAM_NAMES: tuple[str, ...] = (
    "kernel", "bias", "scale", "embedding", "weight", "q_proj", "k_proj", "v_proj", "o_proj",
    "gate_proj", "up_proj", "down_proj", "input_layernorm", "post_attention_layernorm", "mlp",
    "self_attn", "experts", "layers", "embed_tokens", "lm_head", "norm",
)
FAMILIES: tuple[str, ...] = ("llama", "gpt2", "mixtral", "deepseek_v3")
_SMALL_DIMS = (1, 2, 3, 4, 6, 8, 12, 16, 32)


class ShardedTree(NamedTuple):
    """A ShapeDtypeStruct tree, a spec tree of the same structure that stores it, and the mesh sizes."""

    tree: Any
    specs: Any
    axis_sizes: dict[str, int]


def shape_dtype_trees(*, shapes: st.SearchStrategy[tuple[int, ...]] | None = None,
                      dtypes: Sequence[Any] = DTYPES, names: Sequence[str] = PARAM_NAMES,
                      max_leaves: int = 8) -> st.SearchStrategy[dict[str, Any]]:
    """Nested dict / list / tuple pytrees of ``jax.ShapeDtypeStruct`` with parameter-like names.

    Args:
      shapes: strategy for leaf shapes; default ranks 0-3 of small dims.
      dtypes: leaf dtypes (default :data:`DTYPES`: f32, bf16, f16, fp8, int8, int4, int32).
      names: dict keys to draw from.
      max_leaves: about the most leaves a tree has (as ``st.recursive``).

    Returns:
      Trees whose root is a dict; shrinks to ``{"kernel": ShapeDtypeStruct((), float32)}``.

    Example:
      >>> from hypothesis import find
      >>> find(shape_dtype_trees(), lambda t: True)
      {'kernel': ShapeDtypeStruct(shape=(), dtype=float32)}
    """
    if shapes is None:
        shapes = st.lists(st.sampled_from(_SMALL_DIMS), max_size=3).map(tuple)
    check_strategy(shapes, "shapes")
    check_int(max_leaves, "max_leaves", minimum=1)
    if isinstance(dtypes, (str, bytes)) or not isinstance(dtypes, Sequence) or not dtypes:
        raise InvalidArgument(f"dtypes={dtypes!r} must be a non-empty sequence of dtypes.")
    for i, d in enumerate(dtypes):
        try:
            jnp.dtype(d)
        except TypeError as err:
            raise InvalidArgument(f"dtypes[{i}]={d!r} is not a dtype jax knows: {err}") from err
    if isinstance(names, (str, bytes)) or not isinstance(names, Sequence) or not names:
        raise InvalidArgument(f"names={names!r} must be a non-empty sequence of strings.")
    keys = st.sampled_from(tuple(names))
    leaf = st.builds(jax.ShapeDtypeStruct, shapes, st.sampled_from(tuple(dtypes)))

    def extend(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
        return (st.dictionaries(keys, children, min_size=1, max_size=3)
                | st.lists(children, min_size=1, max_size=3)
                | st.lists(children, min_size=1, max_size=2).map(tuple))

    inner = st.recursive(leaf, extend, max_leaves=max_leaves)
    return st.dictionaries(keys, inner, min_size=1, max_size=3)


def _leaf_specs(tree: Any, sizes: dict[str, int], uneven: bool) -> st.SearchStrategy[ShardedTree]:
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    specs = st.tuples(*[partition_specs(leaf.shape, sizes, allow_uneven=uneven) for leaf in leaves])
    return specs.map(lambda s: ShardedTree(tree, jax.tree_util.tree_unflatten(treedef, list(s)), sizes))


def sharded_trees(*, mesh_shape: Any = None, divisible: bool = False, allow_empty: bool = False,
                  allow_uneven: bool = False, dtypes: Sequence[Any] = DTYPES,
                  max_leaves: int = 8) -> st.SearchStrategy[ShardedTree]:
    """A parameter tree and a spec tree (same structure) that stores it on the mesh.

    Args:
      mesh_shape: a MeshShape, mesh, or mapping axis name -> size, or a strategy
        of them (e.g. ``mesh_shapes(num_devices=8)``); None draws one from
        :func:`mesh_shapes`.
      divisible, allow_empty: leaf dims are multiples of the mesh size; dims
        may be 0 (see :func:`array_shapes_for`).
      allow_uneven: specs may split dims unevenly (see :func:`partition_specs`);
        then only ``check_specs(..., for_storage=False)`` passes.
      dtypes, max_leaves: as in :func:`shape_dtype_trees`.

    Returns:
      :class:`ShardedTree` values; ``check_specs(tree, specs, axis_sizes)``
      passes for each. Shrinks to one f32 scalar ``kernel`` with spec ``P()``.

    Example:
      >>> from hypothesis import find
      >>> find(sharded_trees(mesh_shape={"dp": 2}), lambda s: True).specs
      {'kernel': P()}
    """
    check_bool(divisible, "divisible")
    check_bool(allow_empty, "allow_empty")
    check_bool(allow_uneven, "allow_uneven")
    shape_dtype_trees(dtypes=dtypes, max_leaves=max_leaves)  # checks these now, not at the first draw
    if mesh_shape is None:
        sizes_st = mesh_shapes().map(lambda m: m.as_dict())
    elif isinstance(mesh_shape, st.SearchStrategy):
        # a drawn value is checked as a fixed one would be, but only when drawn
        sizes_st = mesh_shape.map(lambda m: check_axis_sizes(m, "mesh_shape"))
    else:
        sizes_st = st.just(check_axis_sizes(mesh_shape, "mesh_shape"))

    @functools.lru_cache(maxsize=256)
    def for_sizes(size_items: tuple[tuple[str, int], ...]) -> st.SearchStrategy[ShardedTree]:
        sizes = dict(size_items)
        shapes = array_shapes_for(sizes, divisible=divisible, max_dims=3, allow_empty=allow_empty)
        trees = shape_dtype_trees(shapes=shapes, dtypes=dtypes, max_leaves=max_leaves)
        return trees.flatmap(lambda t: _leaf_specs(t, sizes, allow_uneven))

    return sizes_st.flatmap(lambda sizes: for_sizes(tuple(sizes.items())))


def _model(family: str, kv: int, group: int, head_dim: int, layers: int, vocab: int, ff: int,
           experts: int, per_tok: int, dense: int, tied: bool) -> ModelSpec:
    heads = kv * group
    # Any: ModelSpec's fields are ints, bools and MLADims, and mypy checks each ** against all of them
    common: dict[str, Any] = dict(vocab_size=vocab, hidden_size=heads * head_dim, num_layers=layers,
                                  num_heads=heads, head_dim=head_dim, intermediate_size=ff)
    name = f"tiny-{family}"
    if family == "gpt2":
        return ModelSpec(name, family, num_kv_heads=heads, tied_embeddings=True,
                         max_position_embeddings=64, **common)
    if family == "llama":
        return ModelSpec(name, family, num_kv_heads=kv, tied_embeddings=tied, **common)
    if family == "mixtral":
        return ModelSpec(name, family, num_kv_heads=kv, num_experts=experts,
                         num_experts_per_tok=min(per_tok, experts), moe_intermediate_size=ff, **common)
    mla = MLADims(q_lora_rank=2 * head_dim, kv_lora_rank=head_dim, qk_nope_head_dim=head_dim,
                  qk_rope_head_dim=max(1, head_dim // 2), v_head_dim=head_dim)
    return ModelSpec(name, family, num_kv_heads=heads, num_experts=experts,
                     num_experts_per_tok=min(per_tok, experts), moe_intermediate_size=ff,
                     num_shared_experts=1, num_dense_layers=min(dense, layers), mla=mla, **common)


def model_specs(*, family: str | Sequence[str] | None = None, max_layers: int = 3,
                max_experts: int = 8) -> st.SearchStrategy[ModelSpec]:
    """Small, valid :class:`ModelSpec` values that ``build_params`` turns into trees.

    Heads are ``num_kv_heads * group`` and ``hidden_size = num_heads * head_dim``;
    MoE families get 2..``max_experts`` experts, DeepSeek-V3 gets MLA sizes
    and leading dense layers.

    Args:
      family: one of :data:`FAMILIES`, several, or None for all.
      max_layers: the most decoder layers.
      max_experts: the most routed experts (MoE families).

    Returns:
      Specs; shrinks to a one-layer ``tiny-llama`` with one head of size 8.

    Example:
      >>> from hypothesis import find
      >>> s = find(model_specs(), lambda s: True)
      >>> s.family, s.num_layers, s.num_heads, s.hidden_size
      ('llama', 1, 1, 8)
    """
    if family is None:
        families = FAMILIES
    elif isinstance(family, str):
        families = (family,)
    elif isinstance(family, Sequence):
        families = tuple(family)
    else:
        raise InvalidArgument(f"family={family!r} must be None, a family name or a sequence of them.")
    bad = [f for f in families if f not in FAMILIES]
    if bad or not families:
        raise InvalidArgument(f"family={family!r}: {bad or 'empty'}; each family must be one of {FAMILIES}.")
    check_int(max_layers, "max_layers", minimum=1)
    check_int(max_experts, "max_experts", minimum=2)
    args = st.tuples(
        st.sampled_from(families),
        st.sampled_from((1, 2, 4, 3)),       # num_kv_heads (3: head counts no power-of-two axis divides)
        st.sampled_from((1, 2, 4, 3)),       # heads per kv head
        st.sampled_from((8, 16, 32)),        # head_dim
        st.integers(1, max_layers),
        st.sampled_from((64, 128, 256, 1000)),  # vocab
        st.sampled_from((32, 64, 128)),      # intermediate size
        st.integers(2, max_experts),
        st.integers(1, 2),                   # experts per token
        st.integers(0, 1),                   # DeepSeek dense layers
        st.booleans(),                       # Llama ties embeddings (as Llama 3.2 1B/3B do)
    )
    return args.map(lambda a: _model(*a))


def _slice_hosts(name: str, min_nodes: int, max_nodes: int) -> list[int]:
    """Hosts per slice in ``[min_nodes, max_nodes]`` that make a real TPU slice (one its name describes)."""
    spec = DEVICE_SPECS[name]
    out = []
    for hosts in range(min_nodes, max_nodes + 1):
        cluster = Cluster(spec, num_nodes=hosts, devices_per_node=spec.devices_per_node)
        try:
            if parse_cluster(cluster.text) == cluster:
                out.append(hosts)
        except ClusterError:  # e.g. 3 v4 hosts: 12 chips is no v4 slice shape
            continue
    return out


def clusters(*, devices: Sequence[str] | None = None, min_nodes: int = 1, max_nodes: int = 8,
             max_slices: int = 2) -> st.SearchStrategy[Cluster]:
    """:class:`Cluster` values of known devices (see :data:`meshplan.pure.DEVICE_SPECS`).

    GPU clusters are nodes of the device's default size; TPU clusters are 1..``max_slices``
    slices of equal host counts, each a real slice shape, so ``parse_cluster(c.text) == c``.

    Args:
      devices: device names to draw from (default: all, sorted).
      min_nodes, max_nodes: hosts per slice (GPU: in total).
      max_slices: the most TPU slices.

    Returns:
      Clusters; shrinks to one node of the first device name in sorted order.

    Raises:
      InvalidArgument: unknown devices, or only TPUs and no host count in
        ``[min_nodes, max_nodes]`` that makes a real slice.

    Example:
      >>> from hypothesis import find
      >>> find(clusters(devices=["H100"]), lambda c: True)
      Cluster('1x8xH100': 8 devices, 1 node x 8, 80 GB HBM each)
    """
    names = sorted(DEVICE_SPECS) if devices is None else list(devices)
    unknown = [n for n in names if n not in DEVICE_SPECS]
    if unknown or not names:
        raise InvalidArgument(f"devices={devices!r}: {unknown or 'empty'}; known devices: {sorted(DEVICE_SPECS)}.")
    check_int(min_nodes, "min_nodes", minimum=1)
    check_int(max_nodes, "max_nodes", minimum=1)
    check_order(min_nodes, max_nodes, "min_nodes", "max_nodes")
    check_int(max_slices, "max_slices", minimum=1)
    nodes: dict[str, st.SearchStrategy[int]] = {}
    for name in names:
        if DEVICE_SPECS[name].ici_scope != "slice":
            nodes[name] = st.integers(min_nodes, max_nodes)
        elif hosts := _slice_hosts(name, min_nodes, max_nodes):
            nodes[name] = st.sampled_from(hosts)
    if not nodes:
        raise InvalidArgument(f"no host count in min_nodes={min_nodes}..max_nodes={max_nodes} makes a real "
                              f"slice of devices={devices!r}; TPU slices have 1, 2, 4, 8, ... hosts.")

    def build(t: tuple[str, int, int]) -> Cluster:
        name, hosts, slices = t
        spec = DEVICE_SPECS[name]
        if spec.ici_scope == "rack" and spec.domain_nodes is not None:
            # An NVLink rack holds at most domain_nodes hosts: part of one rack, or several whole racks.
            hosts = min(hosts, spec.domain_nodes)
            slices = slices if hosts == spec.domain_nodes else 1
        elif spec.ici_scope != "slice":
            slices = 1
        return Cluster(spec, num_nodes=hosts * slices, devices_per_node=spec.devices_per_node,
                       num_slices=slices)

    kept = [n for n in names if n in nodes]
    return st.sampled_from(kept).flatmap(
        lambda name: st.tuples(st.just(name), nodes[name], st.integers(1, max_slices))).map(build)
