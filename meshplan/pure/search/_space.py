"""The mesh search's candidate space: which axis sizes to try and where the DCN split goes.

Pure helpers of :mod:`meshplan.pure.search._search`: per-axis pruning with a reason
for every excluded value (:func:`axis_problem`), the combinations of the
surviving values (:func:`combinations`), and the placement of the ICI domains
on the axes allowed across them (:class:`Placer`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from meshplan.pure.cluster._cluster import Cluster
from meshplan.pure.search._result import SearchRequest
from meshplan.pure.mesh import prime_factors
from meshplan.pure.cost._placement import BATCH_AXES, AxisPlacement
from meshplan.pure.presets import ModelSpec

__all__ = ["Placer", "axis_problem", "batch_problem", "combinations", "divisors", "mesh_count", "mesh_text",
           "num_factorizations", "unit"]


def divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def num_factorizations(n: int, k: int) -> int:
    """Ordered ways to write ``n`` as a product of ``k`` factors."""
    return math.prod(math.comb(e + k - 1, k - 1) for e in prime_factors(n).values()) if k else int(n == 1)


def mesh_text(mesh: Mapping[str, int]) -> str:
    """``'dp=4,tp=8'``: the axes above 1 (all when none is), as :attr:`MeshCandidate.text` writes it."""
    shown = [(a, s) for a, s in mesh.items() if s > 1] or list(mesh.items())
    return ",".join(f"{a}={s}" for a, s in shown)


def mesh_count(n: int) -> str:
    """``'1 mesh'`` / ``'5 meshes'``."""
    return f"{n} mesh" if n == 1 else f"{n} meshes"


def unit(cluster: Cluster) -> str:
    return cluster.ici_domain_name


def axis_problem(axis: str, v: int, req: SearchRequest, model: ModelSpec) -> str | None:
    d, where = req.cluster.ici_domain_size, unit(req.cluster)
    within = {"tp": req.tp_within_domain, "ep": req.ep_within_domain}.get(axis, False)
    if axis == "tp" and model.num_heads % v:
        return f"tp={v} does not divide the {model.num_heads} attention heads"
    if axis == "ep" and v > 1 and not model.is_moe:
        return f"ep={v}: {model.name} has no experts"
    if axis == "ep" and model.num_experts % v:
        return f"ep={v} does not divide the {model.num_experts} experts"
    if within and v > d:
        return (f"{axis}={v} spans {math.ceil(v / d)} {where}s ({d} devices per {where}); {axis} stays "
                f"inside one {where} unless {axis}_within_domain=False"
                + (" (CLI: --allow-tp-dcn)" if axis == "tp" else ""))
    if within and d % v:
        return f"{axis}={v} does not tile a {where} of {d} devices"
    if axis == "sp" and req.seq % v:
        return f"sp={v} does not divide seq={req.seq}"
    if axis in BATCH_AXES and req.batch % v:
        return f"{axis}={v} does not divide batch={req.batch}"
    return None


def batch_problem(batch: int, num_devices: int, axes: Sequence[str], fixed: Mapping[str, int]) -> str | None:
    """Why no batch axis (dp, fsdp, ep) can take part for ``batch``, checked before searching.

    A batch that shares no factor with the device count leaves every batch
    axis at 1 (their sizes divide both); a fixed batch axis must divide it.

    Example:
      >>> batch_problem(3, 8, ("dp", "fsdp", "tp"), {}).split(":")[0]
      'batch=3'
      >>> batch_problem(6, 8, ("dp", "tp"), {}) is None
      True
    """
    n, b = num_devices, batch
    bad = [f"{a}={fixed[a]}" for a in axes if a in BATCH_AXES and a in fixed and b % fixed[a]]
    if bad:
        ways = math.prod(fixed[a] for a in axes if a in BATCH_AXES and a in fixed)
        return (f"batch={b}: the fixed batch axes {bad} do not divide it (dp*fsdp*ep splits the batch); "
                f"use a batch that is a multiple of {ways}.")
    free = [a for a in axes if a in BATCH_AXES and a not in fixed]
    if n == 1 or not free or math.gcd(b, n) > 1:
        return None
    p = min(prime_factors(n))
    return (f"batch={b}: no batch axis can split it: {', '.join(free)} sizes divide the {n} devices and must "
            f"divide the batch, and {b} shares no factor with {n}, so every mesh would hold the whole batch "
            f"on every device. Use a batch that is a multiple of {p} (e.g. {n}), or search only non-batch "
            "axes (axes=['sp', 'tp']; CLI: --axes sp,tp) to split each sequence instead.")


class Placer:
    """ICI/DCN parts per axis of one request's meshes, the DCN taken in bandwidth order.

    The domain count and the axes allowed across domains are read once (a 4096-device search
    places ~1300 meshes); :meth:`split` says whether a mesh's domains can all be placed, and
    :meth:`placement` builds its :class:`AxisPlacement` only for the meshes that need one.

    Example:
      >>> from meshplan.pure import search_meshes
      >>> req = search_meshes("llama3-8b", "2x8xH100", batch=16).request
      >>> placer = Placer(("dp", "fsdp", "tp"), req)
      >>> placer.split((2, 4, 2)), placer.split((1, 1, 16))  # tp stays inside a node
      ((2, 1, 1), None)
    """

    __slots__ = ("names", "cluster", "domains", "movable", "_ones")

    def __init__(self, names: tuple[str, ...], req: SearchRequest) -> None:
        self.names, self.cluster = names, req.cluster
        self.domains = req.cluster.num_ici_domains
        blocked = {a for a, within in (("tp", req.tp_within_domain), ("ep", req.ep_within_domain)) if within}
        self.movable = tuple(axis not in blocked for axis in names)
        self._ones = (1,) * len(names)

    def split(self, sizes: tuple[int, ...]) -> tuple[int, ...] | None:
        """The DCN part of each axis (mesh order is bandwidth order: dp, fsdp, ep, sp, tp), or None
        when the domains cannot all be placed."""
        remaining = self.domains
        if remaining == 1:
            return self._ones
        dcn: list[int] = []
        for size, movable in zip(sizes, self.movable, strict=True):
            if remaining == 1:  # every domain placed: the axes left lie inside domains
                return (*dcn, *self._ones[len(dcn):])
            part = math.gcd(size, remaining) if movable else 1
            remaining //= part
            dcn.append(part)
        return tuple(dcn) if remaining == 1 else None

    def placement(self, sizes: tuple[int, ...], dcn: tuple[int, ...]) -> AxisPlacement:
        """The :class:`AxisPlacement` of a mesh and its :meth:`split`."""
        return AxisPlacement(self.names, tuple(s // p for s, p in zip(sizes, dcn, strict=True)), dcn, self.cluster)


def combinations(values: list[list[int]], n: int) -> list[tuple[int, ...]]:
    """Every tuple drawing one value per axis whose product is ``n`` (lexicographic order)."""
    out: list[tuple[int, ...]] = []
    _walk(values, set(values[-1]), 0, n, (), out)
    return out


def _walk(values: list[list[int]], last: set[int], i: int, remaining: int, acc: tuple[int, ...],
          out: list[tuple[int, ...]]) -> None:
    # A module function, not a closure calling itself: that closure would be a reference cycle
    # holding every mesh of the search until the garbage collector finds it.
    if i == len(values) - 1:
        if remaining in last:
            out.append(acc + (remaining,))
        return
    for v in values[i]:
        if remaining % v == 0:
            _walk(values, last, i + 1, remaining // v, acc + (v,), out)
