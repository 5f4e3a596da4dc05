"""A plan in other tools' terms: a flax logical rule table, MaxText settings, plain JSON.

* :func:`logical_export` turns a :class:`~meshplan.pure.Plan` into an ordered
  logical table plus per-leaf logical names such that flax's
  ``nn.logical_to_mesh_axes(names[path], rules)`` gives back every spec of
  the plan. The names are the user's (a :class:`~meshplan.pure.LogicalRule`
  or a path -> names mapping) where known. Dims without a name but with a
  split get one made of their mesh axes (``"fsdp+tp"``). A name whose leaves
  were split differently (a kv-heads dim that tp does not divide) keeps its
  most common split, and each other split gets its own name (``"kv_heads@none"``).
  The names are then not the user's but the specs are exact.
  Exactness holds because every name ends up with exactly one row, and the
  dims of one leaf use disjoint axes: each row applies, whatever the order.
* :func:`maxtext_settings` writes a mesh candidate's ICI/DCN split as
  MaxText's ``ici_*_parallelism`` / ``dcn_*_parallelism`` (every MaxText mesh
  axis, so no ``-1`` default is left to infer) and, given a logical export,
  its ``logical_axis_rules`` over MaxText's mesh axis names. MaxText merges
  those rows into its defaults by name (rows for the same names are
  replaced; activation rows stay).
* :func:`export_plan` renders a search result in one of :data:`EXPORT_FORMATS`
  (``json`` is :meth:`~meshplan.pure.SearchResult.to_json`, which
  ``SearchResult.from_json`` reads back).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, NamedTuple

from meshplan.pure._check import as_choice, as_count
from meshplan.pure._types import PyTree
from meshplan.pure.errors import MeshplanTypeError, PlanError
from meshplan.pure.rules._conventions import normalize_path
from meshplan.pure.rules._engine import Plan
from meshplan.pure.rules._logical import (
    LogicalNames,
    LogicalRule,
    LogicalTable,
    canonical_logical_names,
    logical_table_to_json,
)
from meshplan.pure.search._candidate import MeshCandidate
from meshplan.pure.search._result import SearchResult
from meshplan.pure.specs._geometry import canonical_entries

__all__ = [
    "EXPORT_FORMATS",
    "MAXTEXT_AXIS_MAP",
    "MAXTEXT_MESH_AXES",
    "LogicalExport",
    "export_plan",
    "logical_export",
    "maxtext_settings",
]

EXPORT_FORMATS = ("json", "flax", "maxtext")
"""What :func:`export_plan` (and ``meshplan plan --format``) writes."""

MAXTEXT_MESH_AXES = ("diloco", "data", "stage", "fsdp", "fsdp_transpose", "context", "context_usp_ulysses",
                     "context_autoregressive", "tensor", "tensor_sequence", "expert", "autoregressive")
"""MaxText's ``mesh_axes`` (configs/base.yml); each has an ``ici_*`` and a ``dcn_*`` setting."""

MAXTEXT_AXIS_MAP: Mapping[str, str] = {"pp": "stage", "dp": "data", "fsdp": "fsdp", "ep": "expert", "sp": "context",
                                       "tp": "tensor"}
"""meshplan's search axes -> MaxText mesh axes (sp is MaxText's context parallelism, pp its ``stage`` axis)."""

# MaxText names the parallelism setting of its "stage" axis after pipelines.
_SETTING = {"stage": "pipeline"}


class LogicalExport(NamedTuple):
    """A plan as flax logical names: ordered ``rules`` and per-leaf ``names``.

    ``names`` maps each array leaf's path, in :func:`~meshplan.pure.normalize_path`
    form, to its logical names.
    """

    rules: LogicalTable
    names: dict[str, LogicalNames]

    def to_json(self) -> dict[str, Any]:
        """``{"rules": [[name, axes], ...], "names": {path: [name or null, ...]}}``."""
        return {"rules": logical_table_to_json(self.rules), "names": {p: list(n) for p, n in self.names.items()}}


def _made_up(entry: tuple[str, ...]) -> str:
    return "+".join(entry)


def _leaf_names(path: str, rank: int, entries: tuple[Any, ...], given: LogicalNames | None) -> list[str | None]:
    """The user's names for a leaf, with a made-up name on every split dim that has none."""
    if given is not None and len(given) != rank:
        raise PlanError(f"{path}: logical names {given} have {len(given)} entries, the leaf has rank {rank}.")
    names: list[str | None] = list(given) if given is not None else [None] * rank
    for d, entry in enumerate(entries):
        if names[d] is None and entry:
            made = _made_up(entry)
            names[d] = made if made not in names else f"{made}#{d}"
    return names


def logical_export(plan: Plan, names: LogicalRule | Mapping[str, Any] | None = None) -> LogicalExport:
    """A logical table and per-leaf names that reproduce ``plan``'s specs under flax's resolution.

    Args:
      plan: the plan to export (``candidate.plan(tree)``, ``plan_tree(...)``).
      names: where the leaves' logical names come from: the :class:`LogicalRule`
        that planned them, a path -> names mapping, or ``None`` (names made
        from the mesh axes).

    Returns:
      A :class:`LogicalExport`; every array leaf of the plan has names.

    Raises:
      PlanError: given names do not have one entry per dim of their leaf.

    Example:
      >>> import numpy as np
      >>> from meshplan.pure import plan_from_specs
      >>> from jax.sharding import PartitionSpec as P
      >>> tree = {"k": np.zeros((8, 4)), "v": np.zeros((2, 4))}
      >>> plan = plan_from_specs(tree, {"k": P("tp", "fsdp"), "v": P(None, "fsdp")})
      >>> out = logical_export(plan, {"k": ("heads", "embed"), "v": ("heads", "embed")})
      >>> out.rules
      (('heads', ('tp',)), ('embed', ('fsdp',)), ('heads@none', ()))
      >>> out.names
      {'k': ('heads', 'embed'), 'v': ('heads@none', 'embed')}
    """
    if not isinstance(plan, Plan):
        raise MeshplanTypeError(f"plan={plan!r:.80} must be a Plan (candidate.plan(tree), plan_tree(...)), "
                                f"not {type(plan).__name__}.")
    lookup: Any
    if names is None:
        lookup = lambda path: None
    elif isinstance(names, LogicalRule):
        lookup = names.names_for
    else:
        if not isinstance(names, Mapping) or not all(isinstance(p, str) for p in names):
            raise MeshplanTypeError(f"names={names!r:.80} must be a LogicalRule, a mapping of leaf path (str) -> "
                                    "logical names, or None.")
        table = {normalize_path(p): canonical_logical_names(n, f"logical names of {p!r}") for p, n in names.items()}
        lookup = lambda path: table.get(normalize_path(path))
    leaves: list[tuple[str, list[str | None], tuple[Any, ...]]] = []
    seen: dict[str, dict[tuple[str, ...], int]] = {}  # name -> split -> leaves, both in first-seen order
    for i, info in enumerate(plan.infos):
        if info is None:
            continue
        path = normalize_path(plan.path(i))  # the one path form (no params/ prefix, no /value tail)
        rank = len(info.shape)
        entries = canonical_entries(plan.leaf_specs[i], rank, where=path)
        leaf = _leaf_names(path, rank, entries, lookup(path))
        leaves.append((path, leaf, entries))
        for n, entry in zip(leaf, entries, strict=True):
            if n is not None:
                splits = seen.setdefault(n, {})
                splits[entry] = splits.get(entry, 0) + 1
    rename: dict[tuple[str, tuple[str, ...]], str] = {}
    kept: list[tuple[str, tuple[str, ...]]] = []
    extra: list[tuple[str, tuple[str, ...]]] = []
    for n, splits in seen.items():
        # The most common split keeps the name; ties go to the first seen (dicts keep order).
        main = max(splits, key=lambda e: splits[e])
        kept.append((n, main))
        for entry in splits:
            if entry != main:
                other = f"{n}@{_made_up(entry) or 'none'}"
                rename[(n, entry)] = other
                extra.append((other, entry))
    out_names = {
        path: tuple(None if n is None else rename.get((n, e), n) for n, e in zip(leaf, entries, strict=True))
        for path, leaf, entries in leaves
    }
    return LogicalExport(tuple(kept + extra), out_names)


def maxtext_settings(
    candidate: MeshCandidate,
    logical: LogicalExport | None = None,
    *,
    axis_map: Mapping[str, str] = MAXTEXT_AXIS_MAP,
) -> dict[str, Any]:
    """MaxText config settings for a mesh candidate: ICI/DCN parallelism and, optionally, logical rules.

    Args:
      candidate: a ranked mesh (``result.best``).
      logical: a :func:`logical_export` of its plan, for ``logical_axis_rules``.
      axis_map: meshplan mesh axis -> MaxText mesh axis.

    Returns:
      ``{"ici_data_parallelism": 1, ..., "dcn_data_parallelism": 4, ...}`` over
      every MaxText mesh axis (``stage`` is written ``pipeline``), plus
      ``"logical_axis_rules"`` when ``logical`` is given, and for a pipelined
      candidate (``candidate.pipeline``) ``num_pipeline_microbatches``,
      ``num_layers_per_pipeline_stage``, ``num_pipeline_repeats`` and
      ``pipeline_parallel_layers`` (-1: every layer pipelined). The ICI values
      multiply to the devices per ICI domain and all values to the device count.

    Raises:
      PlanError: a mesh axis has no MaxText counterpart, or two share one.

    Example:
      >>> from meshplan.pure import search_meshes
      >>> best = search_meshes("llama3-8b", "2x8xH100", fixed={"dp": 2, "tp": 8}, top_k=1).best
      >>> s = maxtext_settings(best)
      >>> best.text, s["ici_tensor_parallelism"], s["dcn_data_parallelism"] * s["dcn_fsdp_parallelism"]
      ('dp=2,tp=8', 8, 2)
    """
    if not isinstance(candidate, MeshCandidate):
        raise MeshplanTypeError(f"candidate={candidate!r:.80} must be a MeshCandidate (result.best), "
                                f"not {type(candidate).__name__}.")
    if logical is not None and not isinstance(logical, LogicalExport):
        raise MeshplanTypeError(f"logical={logical!r:.80} must be a LogicalExport (logical_export(plan)) or None, "
                                f"not {type(logical).__name__}.")
    if not isinstance(axis_map, Mapping) or not all(isinstance(k, str) and isinstance(v, str)
                                                    for k, v in axis_map.items()):
        raise MeshplanTypeError(f"axis_map={axis_map!r:.80} must map meshplan axis names (str) to MaxText axis "
                                "names (str).")
    unknown = [a for a in candidate.axis_names if a not in axis_map]
    if unknown:
        raise PlanError(f"mesh axes {unknown} have no MaxText counterpart in axis_map={dict(axis_map)}; "
                        f"map each to one of {list(MAXTEXT_MESH_AXES)}.")
    targets = [axis_map[a] for a in candidate.axis_names]
    bad = sorted({t for t in targets if targets.count(t) > 1 or t not in MAXTEXT_MESH_AXES})
    if bad:
        raise PlanError(f"axis_map sends meshplan axes to MaxText axes {bad} that are repeated or not in "
                        f"{list(MAXTEXT_MESH_AXES)}; map each mesh axis to its own MaxText axis.")
    ici = dict(zip(targets, candidate.ici_shape, strict=True))
    dcn = dict(zip(targets, candidate.dcn_shape, strict=True))
    out: dict[str, Any] = {}
    for level, sizes in (("ici", ici), ("dcn", dcn)):
        for axis in MAXTEXT_MESH_AXES:
            out[f"{level}_{_SETTING.get(axis, axis)}_parallelism"] = int(sizes.get(axis, 1))
    if candidate.pipeline is not None:
        out.update(_pipeline_settings(candidate))
    if logical is not None:
        rows = tuple((n, tuple(axis_map.get(a, a) for a in axes)) for n, axes in logical.rules)
        # Replicated is [] in MaxText's own configs (base.yml), not null.
        out["logical_axis_rules"] = [[n, [] if v is None else v] for n, v in logical_table_to_json(rows)]
    return out


def _pipeline_settings(candidate: MeshCandidate) -> dict[str, int]:
    """MaxText's pipeline settings for a pipelined candidate (configs/base.yml, "pipeline parallelism").

    MaxText runs ``stages x num_layers_per_pipeline_stage x num_pipeline_repeats`` layers in the
    pipeline and the rest (``pipeline_parallel_layers``) outside it, so an uneven split pipelines the
    largest multiple of ``stages x repeats`` and leaves the remainder to run unpipelined.
    """
    pipe = candidate.pipeline
    assert pipe is not None  # the caller checked
    if pipe.schedule == "dualpipe":  # price_pipeline prices it; MaxText has no bidirectional schedule
        raise PlanError(f"{candidate.text}: schedule 'dualpipe' has no MaxText setting (MaxText pipelines run "
                        f"the circular schedule); export a candidate of search_pipelines instead.")
    layers, stages, repeats = sum(pipe.layers), pipe.stages, pipe.virtual
    per_stage = layers // (stages * repeats)
    pipelined = per_stage * stages * repeats
    return {"num_pipeline_microbatches": pipe.micro_batches, "num_layers_per_pipeline_stage": per_stage,
            "num_pipeline_repeats": repeats, "pipeline_parallel_layers": -1 if pipelined == layers else pipelined}


def _yaml(settings: Mapping[str, Any]) -> str:
    # JSON values are YAML flow values, so this is valid MaxText YAML without a YAML library.
    lines = []
    for key, value in settings.items():
        if key == "logical_axis_rules":
            rows = ",\n".join(f"  {json.dumps(r)}" for r in value)
            lines.append(f"{key}: [\n{rows}\n]")
        else:
            lines.append(f"{key}: {json.dumps(value)}")
    return "\n".join(lines) + "\n"


def export_plan(result: SearchResult, fmt: str, *, tree: PyTree = None,
                names: LogicalRule | Mapping[str, Any] | None = None, rank: int = 1) -> str:
    """A search result as text in one of :data:`EXPORT_FORMATS`.

    Args:
      result: the search result.
      fmt: ``"json"`` (the whole result, readable by ``SearchResult.from_json``),
        ``"flax"`` (JSON ``{"mesh": ..., "rules": ..., "names": ...}``) or
        ``"maxtext"`` (YAML settings).
      tree: the parameter tree the search planned (needed for ``flax``; adds
        ``logical_axis_rules`` to ``maxtext``).
      names: the leaves' logical names (see :func:`logical_export`).
      rank: which ranked mesh (1 = best).

    Raises:
      PlanError: an unknown format or rank, or ``flax`` without a tree.

    Example:
      >>> from meshplan.pure import search_meshes
      >>> result = search_meshes("gpt2", "1x8xH100", fixed={"dp": 8}, top_k=1)
      >>> print(export_plan(result, "maxtext").splitlines()[1])
      ici_data_parallelism: 8
    """
    if not isinstance(result, SearchResult):
        raise MeshplanTypeError(f"result={result!r:.80} must be a SearchResult (search_meshes(...)), "
                                f"not {type(result).__name__}.")
    if not isinstance(fmt, str):
        as_choice(fmt, "format", EXPORT_FORMATS)  # the one type error for a non-str choice
    if fmt not in EXPORT_FORMATS:
        raise PlanError(f"format={fmt!r} is not one of {list(EXPORT_FORMATS)}.")
    if fmt == "json":
        return result.to_json()
    rank = as_count(rank, "rank", error=PlanError)
    if rank > len(result.candidates):
        raise PlanError(f"rank={rank}: the result has {len(result.candidates)} ranked meshes.")
    cand = result.candidates[rank - 1]
    logical = None if tree is None else logical_export(cand.plan(tree), names)
    if fmt == "maxtext":
        return _yaml(maxtext_settings(cand, logical))
    if logical is None:
        raise PlanError("the flax export needs the parameter tree the search planned (tree=...).")
    mesh = {"axis_names": list(cand.axis_names), "axis_sizes": list(cand.axis_sizes),
            "dcn_shape": list(cand.dcn_shape)}
    return _compact_json({"mesh": mesh, **logical.to_json()})


def _compact_json(data: Mapping[str, Any]) -> str:
    """JSON with one line per rule row and per leaf (``indent=2`` gives one line per name)."""
    parts = []
    for key, value in data.items():
        if isinstance(value, list) and value:
            body = ",\n".join(f"    {json.dumps(v)}" for v in value)
            parts.append(f"  {json.dumps(key)}: [\n{body}\n  ]")
        elif isinstance(value, dict) and value and key == "names":
            body = ",\n".join(f"    {json.dumps(k)}: {json.dumps(v)}" for k, v in value.items())
            parts.append(f"  {json.dumps(key)}: {{\n{body}\n  }}")
        else:
            parts.append(f"  {json.dumps(key)}: {json.dumps(value)}")
    return "{\n" + ",\n".join(parts) + "\n}\n"
