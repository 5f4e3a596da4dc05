"""A :func:`~meshplan.pure.search._search.search_meshes` call canonicalized: the request it asks, with its model,
its parameter tree's facts and its rule.

Every argument is checked here, before any mesh is enumerated, in the order :func:`canonical_request` reads
them (a wrong rule fails by name, not as "no mesh fits"; an FP8 recipe on a device without FP8 units before any
mesh). Defaults are resolved against the model and the cluster: the batch (one sequence per device), the sequence
(4096, or the model's position limit), the headroom (:func:`~meshplan.pure.cluster.default_headroom`), the
compiler (the cluster's), the device's memory coefficients, and whether the micro-batch count is chosen per mesh;
a machine profile's measured links and efficiency replace the catalogue's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from meshplan.pure._check import as_count, as_flag, as_int, as_real, as_sequence, as_str
from meshplan.pure._types import PyTree
from meshplan.pure.cluster._budget import default_headroom
from meshplan.pure.cluster._cluster import Cluster, parse_cluster
from meshplan.pure.cluster._devices import DEVICE_SPECS
from meshplan.pure.cluster._profile import MachineProfile
from meshplan.pure.cost._matmul_dtype import fp8_peak
from meshplan.pure.cost._placement import AXIS_ORDER
from meshplan.pure.cost._profile_pricing import profiled_cluster
from meshplan.pure.cost._recipe import TrainingRecipe
from meshplan.pure.errors import MeshplanTypeError, PlanError
from meshplan.pure.presets import ModelSpec, build_params, get_preset
from meshplan.pure.rules._axis_kind import AxisKindRule
from meshplan.pure.rules._base import Rule, rule_name
from meshplan.pure.rules._check_tree import check_rule
from meshplan.pure.search._result import SearchRequest
from meshplan.pure.search._space import batch_problem
from meshplan.pure.specs._tree import TreeFacts, tree_facts

__all__ = ["Canonical", "canonical_request"]


class Canonical(NamedTuple):
    """A search call, checked: the request, the model, its parameter tree's facts and the rule that plans it."""

    request: SearchRequest
    model: ModelSpec
    facts: TreeFacts
    rule: Rule


def _canonical_axes(axes: Sequence[str] | None, model: ModelSpec) -> tuple[str, ...]:
    if axes is None:
        return tuple(a for a in AXIS_ORDER if a != "ep" or model.is_moe)
    if isinstance(axes, str):
        axes = [a.strip() for a in axes.split(",") if a.strip()]
    names = [as_str(a, f"axes[{i}]") for i, a in enumerate(as_sequence(axes, "axes"))]
    unknown = [a for a in names if a not in AXIS_ORDER]
    repeated = sorted({a for a in names if names.count(a) > 1})
    if unknown or repeated or not names:
        raise PlanError(f"axes={names!r}: unknown {unknown}, repeated {repeated}; use a non-empty subset of "
                        f"{list(AXIS_ORDER)} (pipeline parallelism is not modelled).")
    return tuple(a for a in AXIS_ORDER if a in names)


def _canonical_fixed(fixed: Mapping[str, int] | None, axes: tuple[str, ...], n: int) -> tuple[tuple[str, int], ...]:
    if fixed is None:
        return ()
    if not isinstance(fixed, Mapping):
        raise MeshplanTypeError(f"fixed={fixed!r} must be a mapping axis -> size, e.g. {{'tp': 8}}.")
    problems = []
    out = {}
    for axis, size in fixed.items():
        v = as_int(size, f"fixed[{axis!r}]")
        if axis not in axes:
            problems.append(f"{axis}={v}: {axis!r} is not one of the searched axes {list(axes)}")
        elif v < 1 or n % v:
            problems.append(f"{axis}={v} must be >= 1 and divide the {n} devices")
        out[axis] = v
    if problems:
        raise PlanError("fixed axes: " + "; ".join(problems) + ".")
    return tuple((a, out[a]) for a in axes if a in out)


_MAX_COUNT = 10**12  # batch, seq, top_k: far beyond any real step, small enough for exact float arithmetic


def _positive(value: Any, name: str) -> int:
    return as_count(value, name, maximum=_MAX_COUNT, error=PlanError)


def canonical_request(
    model: str | ModelSpec,
    cluster: str | Cluster,
    *,
    params: PyTree,
    axes: Sequence[str] | None,
    fixed: Mapping[str, int] | None,
    rule: Rule | None,
    batch: int | None,
    seq: int | None,
    headroom: float | None,
    activations: bool,
    tp_within_domain: bool,
    ep_within_domain: bool,
    top_k: int,
    recipe: TrainingRecipe | None,
    efficiency: float | None,
    rank: str,
    micro_batches: int | None,
    profile: MachineProfile | None,
) -> Canonical:
    """:func:`~meshplan.pure.search._search.search_meshes`' arguments (see its docstring), checked and resolved.

    Raises:
      PlanError: no mesh can meet the constraints (the batch against the fixed axes), bad options, or an FP8
        recipe on a device with no FP8 peak.
      ClusterError: a cluster text that does not parse.
      ProfileError: a profile for another device kind.
      MeshplanTypeError: options of the wrong type.

    Example:
      >>> c = canonical_request("gpt2", "1x8xH100", params=None, axes=None, fixed=None, rule=None, batch=None,
      ...                       seq=None, headroom=None, activations=True, tp_within_domain=True,
      ...                       ep_within_domain=False, top_k=5, recipe=None, efficiency=None, rank="time",
      ...                       micro_batches=None, profile=None)
      >>> c.request.axes, c.request.batch, c.request.seq, c.request.recipe.backend
      (('dp', 'fsdp', 'sp', 'tp'), 8, 1024, 'gpu')
    """
    if recipe is not None and not isinstance(recipe, TrainingRecipe):
        raise MeshplanTypeError(f"recipe={recipe!r:.80} must be a TrainingRecipe or None.")
    recipe = TrainingRecipe() if recipe is None else recipe
    dtype = recipe.weight_dtype
    if isinstance(model, str):
        preset = get_preset(model, dtype=dtype)
        spec = preset.spec
        params = preset.params if params is None else params
    elif isinstance(model, ModelSpec):
        spec = model
        params = build_params(spec, dtype=dtype) if params is None else params
    else:
        raise MeshplanTypeError(f"model={model!r} must be a preset name or a ModelSpec.")
    clus = parse_cluster(cluster) if isinstance(cluster, str) else cluster
    if not isinstance(clus, Cluster):
        raise MeshplanTypeError(f"cluster={cluster!r} must be a Cluster or a string such as '8x8xH100'.")
    pricing = None
    if profile is not None:  # the profile's figures in place of the catalogue's, where it measured them
        clus, measured, pricing = profiled_cluster(clus, profile, hidden=spec.hidden_size, efficiency=efficiency)
        efficiency = efficiency if measured is None else measured
    names = _canonical_axes(axes, spec)
    headroom = default_headroom(clus)[0] if headroom is None else headroom
    if as_real(headroom, "headroom", allow_zero=True, error=PlanError) >= 1:
        raise PlanError(f"headroom={headroom!r} must be a fraction in [0, 1).")
    flags = {name: as_flag(value, name) for name, value in (
        ("activations", activations), ("tp_within_domain", tp_within_domain), ("ep_within_domain", ep_within_domain))}
    facts = tree_facts(params)
    dtypes = sorted({str(d) for d in {i.dtype for i in facts.infos if i is not None}})
    if not dtypes:
        raise PlanError(f"params={params!r:.80} holds no arrays (no leaf has a shape and dtype); pass the "
                        "parameter tree (arrays or ShapeDtypeStructs), or None for the model's own.")
    rule = AxisKindRule.for_model(spec) if rule is None else rule
    if not callable(rule):
        raise MeshplanTypeError(f"rule={rule!r} is not a rule; pass a pure rule such as AxisKindRule() or None.")
    check_rule(rule, params, names)  # before any mesh: a wrong rule fails by name, not as "no mesh fits"
    weights = dtypes[0] if len(dtypes) == 1 else "bfloat16"
    recipe = dataclasses.replace(recipe, weight_dtype=weights)
    if recipe.backend is None:  # the cluster's compiler: its lowering and its calibration
        recipe = dataclasses.replace(recipe, backend="tpu" if clus.device.ici_scope == "slice" else "gpu")
    fp8_peak(clus.device, recipe.matmul_dtype)  # an FP8 recipe needs FP8 units: refused before any mesh
    if recipe.device is None and clus.device.name in DEVICE_SPECS:
        # The accelerator picks its generation's memory coefficients where it has some (calibration_key).
        recipe = dataclasses.replace(recipe, device=clus.device.name)
    choose = micro_batches is None and recipe.micro_batches == 1
    if micro_batches is not None:
        recipe = dataclasses.replace(recipe, micro_batches=_positive(micro_batches, "micro_batches"))
    req = SearchRequest(
        model=spec.name, cluster=clus, axes=names, fixed=_canonical_fixed(fixed, names, clus.num_devices),
        batch=clus.num_devices if batch is None else _positive(batch, "batch"),
        seq=min(4096, spec.max_position_embeddings or 4096) if seq is None else _positive(seq, "seq"),
        param_dtype=dtypes[0] if len(dtypes) == 1 else "mixed",
        grad_dtype="param" if recipe.grad_dtype is None else recipe.grad_dtype,
        optimizer_copies=recipe.optimizer_copies, optimizer_dtype=recipe.optimizer_dtype,
        activations=flags["activations"], headroom=float(headroom), tp_within_domain=flags["tp_within_domain"],
        ep_within_domain=flags["ep_within_domain"], rule=rule_name(rule), top_k=_positive(top_k, "top_k"),
        recipe=recipe, efficiency=efficiency, rank_by=rank, choose_micro_batches=choose,
        moe_layers=spec.num_moe_layers, profile=pricing)
    why = batch_problem(req.batch, clus.num_devices, names, dict(req.fixed))
    if why is not None:
        raise PlanError(why)
    return Canonical(req, spec, facts, rule)
