"""A serving layout: replicas of the model, each over ``ep x tp`` devices, and which layouts a cluster allows.

``tp`` splits every layer's heads and MLP width (Megatron's column / row split, as vLLM, SGLang and MaxText's
``ici_tensor_parallelism`` do); it stays inside one node (GPUs) or slice (TPUs), where the fast link is. ``ep``
(MoE models only) is the number of attention data-parallel ranks in a replica: each holds the attention and
dense weights split ``tp`` ways and serves its own sequences, and the routed experts are split whole over all
``ep x tp`` devices of the replica (vLLM's ``--data-parallel-size ep --enable-expert-parallel``, SGLang's
``--enable-dp-attention --dp ep``). With ``ep == 1`` an MoE model's experts are split like a dense MLP, each
expert's hidden width ``tp`` ways (vLLM's default). ``replicas`` copies serve independent requests (the mesh
axis ``dp``).

Example:
  >>> from meshplan.pure.presets import MODEL_SPECS
  >>> from meshplan.pure.cluster import parse_cluster
  >>> [l.text for l in serving_layouts(MODEL_SPECS["llama3-70b"], parse_cluster("1x8xH100"))]
  ['dp=8', 'dp=4,tp=2', 'dp=2,tp=4', 'tp=8']
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from meshplan.pure._check import as_count, as_sequence, collect
from meshplan.pure.cluster._cluster import MAX_DEVICES, Cluster
from meshplan.pure.errors import MeshplanTypeError, PlanError
from meshplan.pure.presets._spec import ModelSpec, as_model_spec

__all__ = ["LAYOUT_AXES", "ServeLayout", "check_layout", "layout_problems", "serving_layouts"]

LAYOUT_AXES: tuple[str, str, str] = ("dp", "ep", "tp")
"""A serving mesh's axes, outermost first: replicas, expert/attention-data ranks, tensor parallelism."""


@dataclasses.dataclass(frozen=True, slots=True)
class ServeLayout:
    """``replicas`` copies of the model, each over ``ep x tp`` devices.

    Attributes:
      replicas: independent copies (the mesh axis ``dp``).
      tp: tensor parallelism inside a replica.
      ep: attention data-parallel ranks of a replica whose experts are split over all ``ep x tp`` devices
        (MoE models only; 1 otherwise).

    Raises:
      PlanError: a count below 1 or above :data:`~meshplan.pure.cluster.MAX_DEVICES`.
      MeshplanTypeError: a count that is not an int.

    Example:
      >>> ServeLayout(2, 4).text, ServeLayout(1, 8, ep=2).devices_per_replica
      ('dp=2,tp=4', 16)
    """

    replicas: int
    tp: int
    ep: int = 1

    def __post_init__(self) -> None:
        type_errors: list[str] = []
        value_errors: list[str] = []
        for name in ("replicas", "tp", "ep"):
            value = collect(type_errors, value_errors, as_count, getattr(self, name), name, maximum=MAX_DEVICES,
                            error=PlanError)
            if value is not None:
                object.__setattr__(self, name, value)
        if type_errors:
            raise MeshplanTypeError("ServeLayout: " + "; ".join(type_errors + value_errors) + ".")
        if value_errors:
            raise PlanError("ServeLayout: " + "; ".join(value_errors) + ".")

    @property
    def devices_per_replica(self) -> int:
        """Devices one copy of the model spans."""
        return self.ep * self.tp

    @property
    def num_devices(self) -> int:
        """Devices of all replicas."""
        return self.replicas * self.devices_per_replica

    @property
    def axis_sizes(self) -> dict[str, int]:
        """``{"dp": replicas, "ep": ep, "tp": tp}`` in mesh order."""
        return dict(zip(LAYOUT_AXES, (self.replicas, self.ep, self.tp), strict=True))

    @property
    def replica_axes(self) -> dict[str, int]:
        """The mesh of one replica: ``{"ep": ep, "tp": tp}``."""
        return {"ep": self.ep, "tp": self.tp}

    @property
    def text(self) -> str:
        """``"dp=2,tp=4"``: the axes of size > 1 (``"single device"`` when none)."""
        return ",".join(f"{a}={s}" for a, s in self.axis_sizes.items() if s > 1) or "single device"


def _model_problems(spec: ModelSpec, tp: int, ep: int) -> list[str]:
    problems = []
    if spec.num_heads % tp:
        problems.append(f"tp={tp} does not divide the {spec.num_heads} attention heads (valid tp: "
                        f"{[d for d in range(1, spec.num_heads + 1) if spec.num_heads % d == 0]})")
    kv = spec.num_kv_heads
    if spec.mla is None and (kv % tp if tp <= kv else tp % kv):
        problems.append(f"tp={tp} and the {kv} kv heads: tp must divide them, or be a multiple of them (each "
                        "device then holds a copy of one kv head)")
    dense = not spec.is_moe or spec.num_dense_layers > 0
    if dense and spec.intermediate_size % tp:
        problems.append(f"tp={tp} does not divide the dense MLP width {spec.intermediate_size}")
    if not spec.is_moe:
        if ep > 1:
            problems.append(f"ep={ep} needs an MoE model; {spec.name} has no experts")
        return problems
    if ep == 1 and spec.moe_intermediate_size % tp:
        problems.append(f"tp={tp} does not divide the expert width {spec.moe_intermediate_size}")
    if ep > 1 and spec.num_experts % (ep * tp):
        problems.append(f"ep x tp = {ep * tp} does not divide the {spec.num_experts} experts (with ep > 1 the "
                        "experts are split whole over every device of a replica)")
    shared = spec.num_shared_experts * spec.moe_intermediate_size
    if shared and shared % tp:
        problems.append(f"tp={tp} does not divide the shared experts' width {shared}")
    return problems


def layout_problems(spec: ModelSpec, layout: ServeLayout, cluster: Cluster | None = None) -> tuple[str, ...]:
    """Every reason ``layout`` cannot serve ``spec`` (on ``cluster``, when given); empty when it can.

    Example:
      >>> from meshplan.pure.presets import MODEL_SPECS
      >>> layout_problems(MODEL_SPECS["llama3-8b"], ServeLayout(1, 3))[0][:42]
      'tp=3 does not divide the 32 attention head'
    """
    spec = as_model_spec(spec)
    if not isinstance(layout, ServeLayout):
        raise MeshplanTypeError(f"layout={layout!r:.60} must be a ServeLayout(replicas, tp, ep).")
    problems = _model_problems(spec, layout.tp, layout.ep)
    if cluster is None:
        return tuple(problems)
    if not isinstance(cluster, Cluster):
        raise MeshplanTypeError(f"cluster={cluster!r:.60} must be a Cluster (parse_cluster('1x8xH100')).")
    domain, where = cluster.ici_domain_size, cluster.ici_domain_name
    if layout.num_devices != cluster.num_devices:
        problems.append(f"{layout.text} uses {layout.num_devices} devices; {cluster.text} has {cluster.num_devices}")
    if layout.tp > domain or domain % layout.tp:
        problems.append(f"tp={layout.tp} must divide the {domain} devices of a {where} (tensor parallelism stays "
                        f"on the fast link)")
    per = layout.devices_per_replica
    if per > domain and per % domain:
        problems.append(f"a replica of {per} devices must fill whole {where}s of {domain}")
    return tuple(problems)


def check_layout(spec: ModelSpec, layout: ServeLayout, cluster: Cluster | None = None) -> ServeLayout:
    """``layout`` if it can serve ``spec`` (on ``cluster``), else one PlanError listing every problem.

    Raises:
      PlanError: the problems, joined.

    Example:
      >>> from meshplan.pure.presets import MODEL_SPECS
      >>> check_layout(MODEL_SPECS["llama3-70b"], ServeLayout(1, 16)).tp
      16
    """
    problems = layout_problems(spec, layout, cluster)
    if problems:
        raise PlanError(f"layout {layout.text} for {spec.name}: " + "; ".join(problems) + ".")
    return layout


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def serving_layouts(spec: ModelSpec, cluster: Cluster, *, tp: Sequence[int] | None = None,
                    ep: Sequence[int] | None = None) -> tuple[ServeLayout, ...]:
    """Every layout of ``cluster`` that can serve ``spec``: more replicas first, then larger ``tp``, then ``ep``.

    Args:
      spec: the model.
      cluster: all its devices are used (``replicas x ep x tp`` of them).
      tp: only these tensor-parallel sizes (default: every divisor of a node's or slice's devices).
      ep: only these expert sizes (default: every one that fits, ``1`` for a dense model).

    Returns:
      The valid layouts, deterministic order.

    Raises:
      MeshplanTypeError: a spec or cluster of the wrong type.

    Example:
      >>> from meshplan.pure.presets import MODEL_SPECS
      >>> from meshplan.pure.cluster import parse_cluster
      >>> [l.text for l in serving_layouts(MODEL_SPECS["mixtral-8x7b"], parse_cluster("H100"), tp=[4])]
      ['dp=2,tp=4', 'ep=2,tp=4']
    """
    spec = as_model_spec(spec)
    if not isinstance(cluster, Cluster):
        raise MeshplanTypeError(f"cluster={cluster!r:.60} must be a Cluster (parse_cluster('1x8xH100')).")
    n = cluster.num_devices
    tps = _divisors(cluster.ici_domain_size) if tp is None else sorted(
        {as_count(t, "tp", maximum=MAX_DEVICES, error=PlanError) for t in as_sequence(tp, "tp")})
    out = []
    for t in tps:
        if n % t:
            continue
        eps = ([1] if not spec.is_moe else _divisors(n // t)) if ep is None else sorted(
            {as_count(e, "ep", maximum=MAX_DEVICES, error=PlanError) for e in as_sequence(ep, "ep")})
        for e in eps:
            if (n // t) % e:
                continue
            layout = ServeLayout(n // (t * e), t, e)
            if not layout_problems(spec, layout, cluster):
                out.append(layout)
    return tuple(sorted(out, key=lambda l: (l.tp * l.ep, l.tp, l.ep)))
