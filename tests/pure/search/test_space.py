"""The search's DCN placement (meshplan.pure.search._space.Placer) against its definition."""

from __future__ import annotations

import dataclasses
import math

from hypothesis import given
from hypothesis import strategies as st

from meshplan.pure import parse_cluster, search_meshes
from meshplan.pure.search._space import Placer
from meshplan.testing import factorizations

NAMES = ("dp", "fsdp", "ep", "sp", "tp")
CLUSTERS = ("1x8xH100", "2x8xH100", "8x8xH100", "v5p-128", "2xv5p-256")
_BASE = search_meshes("gpt2", "1xH100", activations=False).request  # a request; Placer reads its cluster and flags
_REQUESTS = {c: dataclasses.replace(_BASE, cluster=parse_cluster(c)) for c in CLUSTERS}


def _reference(sizes: tuple[int, ...], domains: int, blocked: set[str]) -> tuple[int, ...] | None:
    """The search's rule as written in its docstring: dp takes gcd(dp, domains) of the domains, then
    fsdp, ep, sp from what is left; never a blocked axis; every domain must be placed."""
    remaining, dcn = domains, []
    for axis, size in zip(NAMES, sizes, strict=True):
        part = 1 if axis in blocked else math.gcd(size, remaining)
        dcn.append(part)
        remaining //= part
    return tuple(dcn) if remaining == 1 else None


@given(st.sampled_from(CLUSTERS), st.data(), st.booleans(), st.booleans())
def test_split_places_every_domain_in_bandwidth_order(cluster, data, tp_within, ep_within) -> None:
    n = parse_cluster(cluster).num_devices
    sizes = data.draw(factorizations(n, len(NAMES)))
    req = dataclasses.replace(_REQUESTS[cluster], tp_within_domain=tp_within, ep_within_domain=ep_within)
    placer = Placer(NAMES, req)
    blocked = {a for a, w in (("tp", tp_within), ("ep", ep_within)) if w}
    dcn = placer.split(sizes)
    assert dcn == _reference(sizes, req.cluster.num_ici_domains, blocked)
    if dcn is not None:
        assert math.prod(dcn) == req.cluster.num_ici_domains
        p = placer.placement(sizes, dcn)
        assert p.names == NAMES and p.dcn == dcn
        assert all(i * d == s for i, d, s in zip(p.ici, p.dcn, sizes, strict=True))
        assert all(d == 1 for a, d in zip(NAMES, dcn, strict=True) if a in blocked)
