"""The mesh search's default rule: one behaviour per axis kind, read from Hugging Face paths.

:class:`AxisKindRule` shards a Hugging Face-named model the way Megatron-style
training does, reading only the *path template* of each leaf (its path with
layer and expert indices replaced by ``*``), its shape and the sizes of three
mesh axes:

- **tp** (tensor parallel) splits the head / MLP dim of the projections named
  as in HF: *column-parallel* ``q_proj``, ``k_proj``, ``v_proj``,
  ``gate_proj``, ``up_proj``, ``w1``, ``w3``, ``q_b_proj``, ``kv_b_proj``,
  ``lm_head``, GPT-2's ``c_attn`` and ``c_fc`` split their *output* features
  (and their bias); *row-parallel* ``o_proj``, ``down_proj``, ``w2`` and
  GPT-2's ``c_proj`` split their *input* features (bias replicated); the
  embeddings ``embed_tokens`` / ``wte`` split the vocabulary (Megatron's
  vocab-parallel embedding). Linear weights are ``(..., out, in)``; GPT-2's
  ``Conv1D`` weights are ``(in, out)``. Attention projections are split only
  when ``tp`` divides the head count; ``k_proj``/``v_proj`` stay replicated
  over ``tp`` when it does not divide the kv-head count (each tp rank then
  keeps the kv heads its query heads read, an upper bound on memory).
  Everything else (norms, routers, MLA's low-rank ``q_a_proj``) is not split
  over ``tp``.
- **ep** (expert parallel) splits dim 0 of *stacked* expert weights
  (``.../experts/<name>/weight`` of shape ``(E, out, in)``). Per-expert
  leaves (``.../experts/<e>/...``) cannot be split by a spec: the expert
  index is in the path, so ``ep`` saves no memory there (the reason says so).
- **fsdp** then shards the largest remaining dim it divides (ties to the
  lower dim); if no free dim divides, it joins a tp/ep-split dim that can take
  both (a tuple entry).
- leaves with fewer than ``min_shard_size`` elements stay replicated; dp and
  sp never shard weights.

Every spec it emits can be stored (every split divides its dim).

The rule promises more than :class:`~meshplan.pure.rules.Rule` asks, and the
mesh search uses it to stay fast: :meth:`AxisKindRule.group_key` says which
leaves always get the same answer, and :attr:`AxisKindRule.reads_axes`
which axes' sizes matter.

Users replace or refine it with any pure rule, e.g. a
:class:`~meshplan.pure.PathRule` (``meshplan plan --rules FILE``).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Hashable, Mapping
from typing import Any, ClassVar

from meshplan.pure._check import as_count, as_int
from meshplan.pure._types import make_spec
from meshplan.pure.errors import MeshplanTypeError, ShardingRuleError
from meshplan.pure.rules._auto import DEFAULT_MIN_SHARD_SIZE
from meshplan.pure.rules._base import Decision, LeafContext
from meshplan.pure.specs._geometry import spec_from_entries

__all__ = ["AxisKindRule", "path_template"]

_COLUMN = frozenset({"q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "w1", "w3", "q_b_proj",
                     "kv_b_proj", "lm_head", "c_attn", "c_fc"})
_ROW = frozenset({"o_proj", "down_proj", "w2", "c_proj"})
_VOCAB = frozenset({"embed_tokens", "wte"})
_CONV1D = frozenset({"c_attn", "c_fc", "c_proj"})  # GPT-2 stores these (in, out)
_HEADS = frozenset({"q_proj", "q_b_proj", "kv_b_proj", "o_proj", "c_attn"})
_KV_HEADS = frozenset({"k_proj", "v_proj"})
_DIGITS = re.compile(r"^[0-9]+$")


def path_template(path: str) -> str:
    """``path`` with every all-digit component replaced by ``*``.

    Leaves that differ only in layer or expert index share a template, which
    is how the search groups a 45k-leaf tree into a few dozen groups.

    Example:
      >>> path_template("model/layers/12/mlp/experts/3/w1/weight")
      'model/layers/*/mlp/experts/*/w1/weight'
    """
    return "/".join("*" if _DIGITS.match(part) else part for part in path.split("/"))


def _count(value: Any, what: str) -> int | None:
    if value is None:
        return None
    return as_count(value, what, error=ShardingRuleError, hint="or None when unknown")


@dataclasses.dataclass(frozen=True, slots=True)
class _Role:
    """What the path says about a leaf: its module, whether it is a bias, an expert."""

    module: str
    is_bias: bool
    stacked_expert: bool
    per_expert: bool


def _role(template: str) -> _Role:
    parts = template.split("/")
    module = parts[-2] if len(parts) >= 2 else parts[-1]
    in_experts = "experts" in parts
    per_expert = in_experts and parts[parts.index("experts") + 1:parts.index("experts") + 2] == ["*"]
    return _Role(module, parts[-1] == "bias", in_experts and not per_expert, per_expert)


@dataclasses.dataclass(frozen=True, slots=True)
class AxisKindRule:
    """The mesh search's default rule (see the module docstring).

    Attributes:
      num_heads: attention heads, if known (tp splits attention only when it
        divides them).
      num_kv_heads: key/value heads, if known.
      num_experts: routed experts per MoE layer, if known (ep splits dim 0 of
        a stacked expert leaf only when it has this size).
      min_shard_size: leaves with fewer elements stay replicated.
      fsdp_axis, tp_axis, ep_axis: the mesh axis names of each kind.
      name: the label on its decisions.

    Example:
      >>> import numpy as np
      >>> from meshplan.pure import tree_facts
      >>> tree = {"model": {"layers": {"0": {"self_attn": {"q_proj": {"weight": np.zeros((64, 32))}}}}}}
      >>> facts = tree_facts(tree)
      >>> rule = AxisKindRule(num_heads=8)
      >>> d = rule(LeafContext((64, 32), np.dtype("float32"), {"fsdp": 4, "tp": 2}, 0, facts))
      >>> d.spec, d.reason
      (P('tp', 'fsdp'), "q_proj column-parallel: dim 0 (64) <- 'tp'(2); fsdp: dim 1 (32) <- 'fsdp'(4)")
    """

    num_heads: int | None = None
    num_kv_heads: int | None = None
    num_experts: int | None = None
    min_shard_size: int = DEFAULT_MIN_SHARD_SIZE
    fsdp_axis: str = "fsdp"
    tp_axis: str = "tp"
    ep_axis: str = "ep"
    name: str = "axis-kind"
    # path -> (template, role): the search asks about one leaf per group for every mesh, and
    # parsing the path costs more than the decision. A memo, not state: same path, same answer.
    _roles: dict[str, tuple[str, _Role]] = dataclasses.field(default_factory=dict, repr=False, compare=False)
    shape_only: ClassVar[bool] = False

    def __post_init__(self) -> None:
        for field in ("num_heads", "num_kv_heads", "num_experts"):
            object.__setattr__(self, field, _count(getattr(self, field), field))
        size = as_int(self.min_shard_size, "min_shard_size")
        if size < 0:
            raise ShardingRuleError(f"min_shard_size={size} must be >= 0.")
        object.__setattr__(self, "min_shard_size", size)
        names = (self.fsdp_axis, self.tp_axis, self.ep_axis, self.name)
        if not all(isinstance(n, str) and n for n in names):
            raise MeshplanTypeError(f"axis names and name must be non-empty strings, got {names!r}.")
        if len({self.fsdp_axis, self.tp_axis, self.ep_axis}) != 3:
            raise ShardingRuleError(f"fsdp_axis, tp_axis and ep_axis must differ, got {names[:3]!r}.")

    @classmethod
    def for_model(cls, spec: Any, **options: Any) -> AxisKindRule:
        """The rule with head and expert counts taken from a :class:`~meshplan.pure.ModelSpec`.

        Example:
          >>> from meshplan.pure.presets import MODEL_SPECS
          >>> AxisKindRule.for_model(MODEL_SPECS["mixtral-8x7b"]).num_experts
          8
        """
        return cls(num_heads=spec.num_heads, num_kv_heads=spec.num_kv_heads,
                   num_experts=spec.num_experts or None, **options)

    @property
    def reads_axes(self) -> tuple[str, ...]:
        """The only mesh axes whose sizes change its answers (and the only ones it shards over)."""
        return (self.fsdp_axis, self.tp_axis, self.ep_axis)

    def group_key(self, ctx: LeafContext) -> Hashable:
        """Leaves with equal keys get equal decisions on every mesh: (template, shape, dtype)."""
        return (path_template(ctx.path), ctx.shape, ctx.dtype)

    def __call__(self, ctx: LeafContext) -> Decision:
        path = ctx.path
        found = self._roles.get(path)
        if found is None:
            template = path_template(path)
            found = self._roles[path] = (template, _role(template))
        return self._decide(found[1], ctx.shape, ctx.axis_sizes)

    def decide(self, template: str, shape: tuple[int, ...], axis_sizes: Mapping[str, int]) -> Decision:
        """The decision for a leaf with this path template and shape (any dtype).

        Example:
          >>> AxisKindRule().decide("model/layers/*/mlp/down_proj/weight", (4096, 14336), {"tp": 8}).spec
          P(None, 'tp')
        """
        return self._decide(_role(template), shape, axis_sizes)

    def _decide(self, role: _Role, shape: tuple[int, ...], axis_sizes: Mapping[str, int]) -> Decision:
        n = math.prod(shape)
        if n < self.min_shard_size:
            return Decision(make_spec(), f"{n} elements < min_shard_size={self.min_shard_size}; "
                            "replicated", self.name)
        entries: list[tuple[str, ...]] = [()] * len(shape)
        steps: list[str] = []
        tp = axis_sizes.get(self.tp_axis, 1)
        if tp > 1:
            steps.append(self._place_tp(role, shape, tp, entries))
        ep = axis_sizes.get(self.ep_axis, 1)
        if ep > 1 and (role.stacked_expert or role.per_expert):
            steps.append(self._place_ep(role, shape, ep, entries))
        fsdp = axis_sizes.get(self.fsdp_axis, 1)
        if fsdp > 1:
            steps.append(self._place_fsdp(shape, fsdp, axis_sizes, entries))
        spec = spec_from_entries(entries)
        text = "; ".join(s for s in steps if s) or "no axis of size > 1 to place; replicated"
        return Decision(spec, text, self.name)

    def _place_tp(self, role: _Role, shape: tuple[int, ...], tp: int, entries: list[tuple[str, ...]]) -> str:
        axis, module = self.tp_axis, role.module
        if module in _HEADS and self.num_heads is not None and self.num_heads % tp:
            return f"{module}: tp={tp} does not divide {self.num_heads} heads; not split over tp"
        if module in _KV_HEADS and self.num_kv_heads is not None and self.num_kv_heads % tp:
            return (f"{module}: tp={tp} does not divide {self.num_kv_heads} kv heads; kept whole on "
                    "every tp rank")
        if module in _VOCAB and len(shape) == 2:
            dim, kind = 0, "vocab-parallel"
        elif module in _COLUMN:
            kind = "column-parallel"
            conv = module in _CONV1D
            dim = 0 if role.is_bias else (len(shape) - 1 if conv else len(shape) - 2)
        elif module in _ROW and not role.is_bias:
            kind = "row-parallel"
            dim = len(shape) - 2 if module in _CONV1D else len(shape) - 1
        else:
            return ""
        if not 0 <= dim < len(shape) or (role.stacked_expert and dim == 0):
            return ""
        if shape[dim] % tp:
            return f"{module} {kind}: dim {dim} ({shape[dim]}) not divisible by tp={tp}; not split over tp"
        entries[dim] = (axis,)
        return f"{module} {kind}: dim {dim} ({shape[dim]}) <- {axis!r}({tp})"

    def _place_ep(self, role: _Role, shape: tuple[int, ...], ep: int, entries: list[tuple[str, ...]]) -> str:
        if role.per_expert:
            return "per-expert leaf: ep cannot split it (stack the experts for expert parallelism)"
        if len(shape) < 2 or (self.num_experts is not None and shape[0] != self.num_experts):
            return ""
        if shape[0] % ep:
            return f"experts: dim 0 ({shape[0]}) not divisible by ep={ep}; not split over ep"
        entries[0] = (self.ep_axis,)
        return f"experts: dim 0 ({shape[0]}) <- {self.ep_axis!r}({ep})"

    def _place_fsdp(self, shape: tuple[int, ...], fsdp: int, sizes: Mapping[str, int],
                    entries: list[tuple[str, ...]]) -> str:
        axis = self.fsdp_axis
        order = sorted(range(len(shape)), key=lambda d: (-shape[d], d))
        for d in order:
            if not entries[d] and shape[d] % fsdp == 0:
                entries[d] = (axis,)
                return f"fsdp: dim {d} ({shape[d]}) <- {axis!r}({fsdp})"
        for d in order:
            if entries[d]:
                split = math.prod(sizes[a] for a in entries[d]) * fsdp
                if shape[d] % split == 0:
                    entries[d] = entries[d] + (axis,)
                    return f"fsdp: dim {d} ({shape[d]}) <- {entries[d]!r} ({split} ways)"
        return f"fsdp: no dim of {shape} divisible by fsdp={fsdp}; not split over fsdp"
