"""The search's pricing memo (meshplan.pure.search._pricing): one Pricing shared by every mesh of a search answers
exactly as a fresh one asked about each mesh alone, so no memo's key leaves out something its function reads."""

from __future__ import annotations

import itertools
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshplan.pure.cost import TrainingRecipe
from meshplan.pure.search._groups import LeafGroups
from meshplan.pure.search._pricing import Pricing
from meshplan.pure.search._request import canonical_request
from meshplan.pure.search._search import _Search
from tests.profiles import examples

# A dense and a MoE model, each on a GPU and a TPU cluster (XLA:TPU's gathered operands and v5p's whole slice).
CASES = [("llama3-8b", "2x8xH100"), ("mixtral-8x7b", "v5p-16"), ("gpt2", "v5e-16"), ("deepseek-v2-lite", "2x8xH100")]


def _search(model: str, cluster: str, remat: str) -> _Search:
    c = canonical_request(model, cluster, params=None, axes=None, fixed=None, rule=None, batch=None, seq=2048,
                          headroom=None, activations=True, tp_within_domain=True, ep_within_domain=False, top_k=5,
                          recipe=TrainingRecipe(remat=remat), efficiency=None, rank="time", micro_batches=None,
                          profile=None)
    return _Search(c.request, c.model, LeafGroups.build(c.facts, c.rule), c.rule)


def _meshes(search: _Search) -> list[tuple[int, ...]]:
    """The meshes of the search's cluster that a search would price: the batch divides, the domains place,
    the rule plans them."""
    req = search.req
    n = req.cluster.num_devices
    out = []
    for sizes in itertools.product(*[[d for d in range(1, n + 1) if n % d == 0] for _ in req.axes]):
        mesh = dict(zip(req.axes, sizes, strict=True))
        ways = math.prod(mesh.get(a, 1) for a in ("dp", "fsdp", "ep"))
        if math.prod(sizes) != n or req.batch % ways or search.placer.split(sizes) is None:
            continue
        if search.plan(mesh)[1].error is None:
            out.append(sizes)
    return out


def _answers(pricing: Pricing, search: _Search, sizes: tuple[int, ...], m: int) -> tuple[object, ...]:
    mesh = dict(zip(search.req.axes, sizes, strict=True))
    key, plan = search.plan(mesh)
    placement = search.placer.placement(sizes, search.placer.split(sizes) or ())
    ways = math.prod(mesh.get(a, 1) for a in ("dp", "fsdp", "ep"))
    gathered = sum(nbytes for axes, nbytes in plan.gather if any(mesh.get(x, 1) > 1 for x in axes))
    head = pricing.head(key, plan, mesh)
    peak_key = (mesh.get("tp", 1), mesh.get("sp", 1), ways, m)
    return (pricing.flops(mesh), pricing.compute_s(mesh), head, pricing.activation_floor(peak_key),
            pricing.memory(plan, gathered, peak_key, head), pricing.param_pending(key, plan, mesh, placement, m),
            pricing.activation_pending(mesh, placement, m))


@settings(max_examples=examples(8), deadline=None)
@given(st.sampled_from(CASES), st.sampled_from(("full", "none")), st.integers(0, 2**32 - 1))
def test_a_shared_pricing_answers_as_a_fresh_one_for_every_mesh(case: tuple[str, str], remat: str, seed: int) -> None:
    search = _search(*case, remat=remat)
    meshes = _meshes(search)
    assert meshes
    shared = Pricing(search.req, search.model, search.groups)
    rnd = random.Random(seed)
    for sizes in rnd.sample(meshes, min(10, len(meshes))):
        m = rnd.choice([1, 2])
        fresh = Pricing(search.req, search.model, search.groups)
        assert _answers(shared, search, sizes, m) == _answers(fresh, search, sizes, m), sizes


def test_the_recipe_per_micro_batch_count_is_the_request_s_with_that_count() -> None:
    search = _search("llama3-8b", "2x8xH100", remat="full")
    pricing = search.pricing
    assert pricing.recipe(search.req.recipe.micro_batches) is search.req.recipe
    assert pricing.recipe(4).micro_batches == 4 and pricing.recipe(4) is pricing.recipe(4)
    with pytest.raises(Exception):
        pricing.recipe(4).micro_batches = 2  # type: ignore[misc]
